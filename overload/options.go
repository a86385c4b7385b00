package overload

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/floodgate-go/floodgate"
)

type options struct {
	logger   *slog.Logger
	guard    Guard
	now      func() time.Time
	retry    time.Duration
	target   time.Duration
	minLimit int
	maxLimit int
	onChange func(Snapshot)
}

// An Option configures a [Controller]. [New] applies the options in order
// to a copy of the defaults, skipping nil ones, then validates the result
// (the convention of [floodgate.ErrInvalidOption]).
type Option func(*options)

// WithLogger sets the logger for the controller's changes of state, each
// with the signals behind it: entering Shedding at Warn, back to Open at
// Info, every change of the limit at Debug. A nil logger, the default,
// logs nothing but the one warning of calls that reach Acquire without
// Enter, to slog.Default. A repeated call replaces the logger.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// A Guard supplies CPU readings: the latest fraction of the CPU this
// process can use that was busy, and the 99th percentile of goroutine
// scheduling latency (0 when not measured). A running *cpugate.Gate is one.
type Guard interface {
	Reading() (cpu float64, schedP99 time.Duration)
}

// GuardFunc adapts a function to a [Guard].
type GuardFunc func() (float64, time.Duration)

// Reading returns f().
func (f GuardFunc) Reading() (float64, time.Duration) { return f() }

// WithGuard sets where the controller reads the CPU, for its snapshots and
// log lines only: the law decides by the calls' service times and waits,
// which a neighbour's CPU use or a quota cannot mislead. Default (and
// nil): none. A repeated call replaces it.
func WithGuard(g Guard) Option { return func(o *options) { o.guard = g } }

// WithClock sets the clock the controller reads, for tests and
// simulations. A nil c restores the default, time.Now. A repeated call
// replaces it.
func WithClock(c floodgate.Clock) Option {
	return func(o *options) {
		o.now = time.Now
		if c != nil {
			o.now = c.Now
		}
	}
}

// WithLimits bounds the concurrency limit. The default, 0 and 0, is from
// GOMAXPROCS (re-read as it changes: a CPU-bound server needs no fewer
// slots than it has CPUs) to 10,000. Set them when the handlers wait on a
// pool of known size. A repeated call replaces both.
func WithLimits(least, most int) Option {
	return func(o *options) { o.minLimit, o.maxLimit = least, most }
}

// WithQueueTarget sets the least queue target: the server holds, beyond
// the calls it runs, what those complete in the target, and a call waits
// for a slot at most twice the target. The default, 0, is 5 ms while the
// controller sheds more than a tenth of the calls offered lately and 25 ms
// otherwise, so that a server that is not overloaded absorbs a burst; the
// target is one completion's worth when that is longer. A repeated call
// replaces it.
func WithQueueTarget(d time.Duration) Option { return func(o *options) { o.target = d } }

// WithRetryAfter sets the retry delay a shed call is given (ShedError's
// RetryAfter). The default, 0, is 200 ms, two control steps. A repeated
// call replaces it.
func WithRetryAfter(d time.Duration) Option { return func(o *options) { o.retry = d } }

// WithOnChange sets a function called after every change of state or of
// the limit, with the new snapshot, outside the controller's lock, from
// the goroutine of the call that caused it. It should return quickly. A
// repeated call replaces it; nil removes it.
func WithOnChange(f func(Snapshot)) Option { return func(o *options) { o.onChange = f } }

// validate names the first option New was given an invalid value.
func (o *options) validate() error {
	const positive = "0 (the default) or a positive duration"
	switch {
	case o.minLimit < 0 || o.maxLimit < 0 || (o.maxLimit > 0 && o.maxLimit < max(o.minLimit, 1)):
		return invalid("WithLimits", [2]int{o.minLimit, o.maxLimit}, "0 ≤ least ≤ most, or 0 for the defaults")
	case o.target < 0:
		return invalid("WithQueueTarget", o.target, positive)
	case o.retry < 0:
		return invalid("WithRetryAfter", o.retry, positive)
	}
	return nil
}

func invalid(name string, v any, want string) error {
	return fmt.Errorf("%w: overload: %s = %v, want %s", floodgate.ErrInvalidOption, name, v, want)
}
