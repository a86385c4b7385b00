package otelfloodgate

import (
	"testing"

	"github.com/floodgate-go/floodgate/internal/optiontest"
)

// TestOptionConvention checks the option convention of
// floodgate.ErrInvalidOption on New and NewRedisMetrics.
func TestOptionConvention(t *testing.T) {
	optiontest.Check(t, func(opts ...Option) error {
		r, err := New(nil, opts...)
		if err == nil {
			err = r.Close()
		}
		return err
	}, []optiontest.Case[Option]{
		{Option: "WithMethods", Bad: WithMethods("Get"), Good: WithMethods(methodGet), Adds: true},
		{Option: "WithMaxTiers", Bad: WithMaxTiers(0), Good: WithMaxTiers(4)},
		{Option: "WithTenantLabels", Bad: WithTenantLabels(-1), Good: WithTenantLabels(4)},
	})
	optiontest.Check(t, func(opts ...RedisOption) error {
		r, err := NewRedisMetrics(nil, opts...)
		if err == nil {
			err = r.Close()
		}
		return err
	}, []optiontest.Case[RedisOption]{
		{Option: "WithCallBuckets", Bad: WithCallBuckets(), Good: WithCallBuckets(0.001, 0.01)},
	})
}
