package floodgate

import (
	"errors"
	"time"
)

// ErrNegativeN is returned, or wrapped, by every take, wait or refund of a
// negative token count, in every store.
var ErrNegativeN = errors.New("floodgate: n must not be negative")

// ErrInvalidOption is wrapped by every configuration error a constructor
// returns (keyed.New, middleware.New, redisstore.New, promfloodgate.New, …).
// The message names the option and the value it refused.
var ErrInvalidOption = errors.New("floodgate: invalid option")

// A Clock tells the time. Every package that reads the time takes one
// through its WithClock option, so a test or a simulation can drive all of
// them from one fake clock; the default reads time.Now.
type Clock interface {
	Now() time.Time
}

// ClockFunc adapts a function to a [Clock].
type ClockFunc func() time.Time

// Now returns f().
func (f ClockFunc) Now() time.Time { return f() }
