package promfloodgate

import (
	"log/slog"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate/internal/optiontest"
)

// TestOptionConvention checks the option convention of
// floodgate.ErrInvalidOption on New, NewRedisMetrics and NewOffenders.
func TestOptionConvention(t *testing.T) {
	optiontest.Check(t, func(opts ...Option) error {
		_, err := New(opts...)
		return err
	}, []optiontest.Case[Option]{
		{Option: "WithMethods", Bad: WithMethods("Get"), Good: WithMethods(methodGet), Adds: true},
		{Option: "WithMaxTiers", Bad: WithMaxTiers(0), Good: WithMaxTiers(4)},
		{Option: "WithTenantLabels", Bad: WithTenantLabels(-1), Good: WithTenantLabels(4)},
		{Option: "WithLogger", Bad: WithLogger(slog.Default(), -time.Second), Good: WithLogger(slog.Default(), time.Second)},
	})
	optiontest.Check(t, func(opts ...RedisOption) error {
		_, err := NewRedisMetrics(opts...)
		return err
	}, []optiontest.Case[RedisOption]{
		{Option: "WithCallBuckets", Bad: WithCallBuckets(), Good: WithCallBuckets(0.001, 0.01)},
	})
	optiontest.Check(t, func(opts ...OffendersOption) error {
		_, err := NewOffenders(opts...)
		return err
	}, []optiontest.Case[OffendersOption]{
		{Option: "WithCapacity", Bad: WithCapacity(0), Good: WithCapacity(8)},
		{Option: "WithHashSecret", Bad: WithHashSecret([]byte("short")), Good: WithHashSecret(make([]byte, 16))},
	})
}
