package rls_test

import (
	"testing"
	"time"

	"github.com/floodgate-go/floodgate/internal/optiontest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/rls"
)

// TestOptionConvention checks the option convention of
// floodgate.ErrInvalidOption on New.
func TestOptionConvention(t *testing.T) {
	m, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	optiontest.Check(t, func(opts ...rls.Option) error {
		_, err := rls.New(m, nil, opts...)
		return err
	}, []optiontest.Case[rls.Option]{
		{Option: "WithNearLimitRatio", Bad: rls.WithNearLimitRatio(0), Good: rls.WithNearLimitRatio(0.9)},
		{Option: "WithReservations", Bad: rls.WithReservations(0, time.Minute), Good: rls.WithReservations(10, time.Minute)},
		{Option: "WithTopK", Bad: rls.WithTopK(0), Good: rls.WithTopK(8)},
	})
}
