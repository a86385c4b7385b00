// Package optiontest checks the option convention that
// floodgate.ErrInvalidOption states, for the conventions tests of every
// module.
package optiontest

import (
	"errors"
	"strings"
	"testing"

	"github.com/floodgate-go/floodgate"
)

// A Case is one option its constructor validates: a value it refuses, one
// it accepts, and whether a repeated call adds to the earlier one's value
// (then the refused value stays) or replaces it.
type Case[O any] struct {
	Option    string // the option's name, which the error must give
	Bad, Good O
	Adds      bool
}

// Check checks the convention on the constructor build: a nil option is
// skipped; each refused value is an error wrapping ErrInvalidOption that
// names the option; and a valid value after it replaces it, unless the
// option adds.
func Check[O any](t *testing.T, build func(...O) error, cases []Case[O]) {
	t.Helper()
	var none O
	if err := build(none); err != nil {
		t.Errorf("with a nil option: %v, want nil", err)
	}
	for _, c := range cases {
		t.Run(c.Option, func(t *testing.T) {
			err := build(c.Bad)
			if !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), c.Option) {
				t.Fatalf("with an invalid %s: %v, want an error wrapping ErrInvalidOption naming it", c.Option, err)
			}
			err = build(c.Bad, c.Good)
			switch {
			case c.Adds && !errors.Is(err, floodgate.ErrInvalidOption):
				t.Errorf("an invalid %s, then a valid one: %v, want the first kept (it adds)", c.Option, err)
			case !c.Adds && err != nil:
				t.Errorf("an invalid %s, then a valid one: %v, want the second to replace the first", c.Option, err)
			}
			if err := build(c.Good, none); err != nil {
				t.Errorf("a valid %s and a nil option: %v", c.Option, err)
			}
		})
	}
}
