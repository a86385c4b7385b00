package floodgate

import (
	"errors"
	"time"
)

// ErrNegativeN is returned, or wrapped, by every take, wait or refund of a
// negative token count, in every store.
var ErrNegativeN = errors.New("floodgate: n must not be negative")

// ErrInvalidOption is wrapped by every configuration error a constructor
// returns (keyed.New, middleware.New, redisstore.New, promfloodgate.New, …);
// the message names the option, or the config struct's field it was given
// (a cpugate.Policy's, say), and the value refused.
//
// Every package configured by functional options (an Option type, or a
// named variant such as otelfloodgate.RedisOption) follows one convention:
// an option only records its arguments and never fails, clamps or panics;
// the constructor applies the options in order to a copy of the defaults,
// skipping nil ones, then validates the result. A repeated option replaces
// the value the earlier one recorded, unless its doc says it adds to it: a
// valid value replaces an invalid one given before it, while an invalid
// entry added to a list stays.
var ErrInvalidOption = errors.New("floodgate: invalid option")

// ErrKeyTooLong is wrapped by the errors of a store that refuses a key for
// its length, before any I/O (redisstore: longer than its MaxKeyLen). Such
// a key never fits, so it is no outage to fail open on: the middleware
// refuses the call instead.
var ErrKeyTooLong = errors.New("floodgate: key too long for the store")

// A Clock tells the time. A package that reads the time to decide takes
// one through its WithClock option (keyed, middleware, overload, throttle,
// promfloodgate), so a test or a simulation can drive all of them from one
// fake clock; the default, and WithClock(nil), read time.Now. Three differ,
// on purpose:
//
//   - redisstore's WithClientClock moves the buckets' time from Redis's
//     TIME to the client's clock: a choice of time source for production,
//     not only a test seam, so it has its own name;
//   - cpugate's Gate takes the time of each reading as an argument
//     (SampleAt, Observe), which is how tests drive it, and its Run ticks
//     on real time because it measures real CPU time;
//   - tenant reads the time only to stamp reloads for Stats and to compare
//     a file's modification time with the real file system's.
type Clock interface {
	Now() time.Time
}

// ClockFunc adapts a function to a [Clock].
type ClockFunc func() time.Time

// Now returns f().
func (f ClockFunc) Now() time.Time { return f() }
