package redisstore

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/floodgate-go/floodgate"
)

// A Policy says how the store decides while Redis cannot: when a call fails,
// misses its deadline, or the breaker is open.
type Policy uint8

const (
	// Local decides with an in-process bucket at the limit divided by the
	// local divisor (see [WithLocalDivisor]), emptied at a key's first
	// fallback decision after a second without one: each instance goes on
	// at its part of the rate, with no burst of its own. Results carry
	// [floodgate.SourceFallback]. The default. A call that
	// missed its deadline only because this process was starved of CPU is
	// refused instead ([floodgate.SourceFailClosed]): Redis is likely up and
	// deciding for the other instances, and a local bucket beside it would
	// admit more than the limit.
	Local Policy = iota
	// Open admits every request ([floodgate.SourceFailOpen]).
	Open
	// Closed rejects every request ([floodgate.SourceFailClosed]) with a
	// RetryAfter of the time until the breaker tries Redis again.
	Closed
)

// String returns the policy's lower-case name.
func (p Policy) String() string {
	switch p {
	case Local:
		return "local"
	case Open:
		return "open"
	case Closed:
		return "closed"
	}
	return "unknown"
}

// An Option configures a [Store]. [New] applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of [floodgate.ErrInvalidOption]); a repeated option replaces
// the earlier one's value.
type Option func(*options)

type options struct {
	prefix       string
	name         string
	clock        floodgate.Clock // nil: Redis TIME
	deadline     time.Duration
	policy       Policy
	divisor      float64
	fallback     floodgate.Store
	failures     int
	cooldown     time.Duration
	batch        int
	cacheSize    int
	leaseTime    time.Duration
	leaseKeys    int
	onError      func(error)
	observer     Observer
	logger       *slog.Logger
	reloadPeriod time.Duration
}

func defaults() options {
	return options{
		prefix:       "floodgate",
		name:         "b",
		deadline:     50 * time.Millisecond,
		policy:       Local,
		divisor:      1,
		failures:     5,
		cooldown:     500 * time.Millisecond,
		reloadPeriod: time.Second,
	}
}

// WithPrefix sets the first part of every key, "floodgate" by default. The
// prefix must be non-empty and must not contain '{' or '}', which would move
// the Cluster hash tag. A repeated call replaces it.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithName sets the limit id, the last part of every key, "b" by default.
// Stores that share a Redis and a prefix but apply different limits to the
// same subjects need different names. The same rules as for the prefix
// apply. A repeated call replaces it.
func WithName(name string) Option { return func(o *options) { o.name = name } }

// WithClientClock makes the store send c's time (as µs since the Unix
// epoch) instead of reading Redis TIME in the script, and time its deny
// cache and leases by c: for servers or proxies that refuse TIME in
// scripts (pass floodgate.ClockFunc(time.Now)), and for tests and
// simulations that drive time. Every client must then keep its clock in
// sync; a client whose clock runs behind cannot move a bucket's time
// backwards, it only refills less. A nil c restores the default, Redis's
// clock; a repeated call replaces the clock.
func WithClientClock(c floodgate.Clock) Option { return func(o *options) { o.clock = c } }

// WithDeadline bounds each decision's time, 50 ms by default. Redis gets the
// deadline less a reserve of a tenth (at most 5 ms), in which the callers
// that Redis left waiting wake up and the failure policy decides: when
// Redis hangs, all of them time out at once.
//
// A caller's context deadline that comes earlier bounds the call instead,
// and when it passes before Redis answers, TakeN returns the context's
// error: the failure policy never decides for a caller that is gone, and
// the call does not count against Redis. A caller's cancellation is seen
// when the call returns (within the deadline), with the same outcome.
//
// While the process itself is starved of CPU (its runnable goroutines have
// waited a quarter of Redis's share or more to run, as the runtime's
// /sched/latencies:seconds histogram shows), a goroutine can read Redis's
// answer long after it arrived. Then Redis's share is stretched by twice
// that scheduling delay, at most 1 s, and a call that still misses it is
// not held against Redis (see [Local]). So a decision returns within the
// deadline (or the caller's earlier one), plus that stretch while the
// process is starved, plus however late the runtime runs the caller's
// goroutine again. It must be positive; a repeated call replaces it.
func WithDeadline(d time.Duration) Option { return func(o *options) { o.deadline = d } }

// WithFailurePolicy sets what decides while Redis cannot: [Local] (the
// default), [Open] or [Closed]. A repeated call replaces it.
func WithFailurePolicy(p Policy) Option { return func(o *options) { o.policy = p } }

// WithLocalDivisor sets the least divisor of the [Local] policy, 1 by
// default: the local bucket runs at the limit scaled by 1/divisor (rate and
// burst, the burst never below 1), so that the instances sharing a limit
// together stay near it while Redis is away.
//
// The store divides by the larger of this divisor and the number of
// instances it counted on Redis: once a second, each store records in a
// sorted set (key <prefix>:{<name>}) that it reached Redis, and reads how
// many stores with its prefix and name did so in the last 5 s
// ([Stats].Instances). The count comes from the last time Redis answered,
// so it holds through an outage. The trade-off: stores with one prefix and
// name count each other even when they serve different keys, which makes
// each one's share smaller than it could be (under-admission while Redis
// is away, never over-admission); and a store that has never reached Redis
// knows of no other, so it uses this divisor alone. Set it to the expected
// number of instances when they must start while Redis is down. A
// registration that fails (say, an ACL without ZADD) changes nothing: the
// last count, or this divisor, stays. It must be finite and at least 1; a
// repeated call replaces the value.
func WithLocalDivisor(divisor float64) Option { return func(o *options) { o.divisor = divisor } }

// WithFallback sets the store that decides under the [Local] policy, a
// keyed.Map of default capacity by default; nil restores the default. It
// receives the scaled limit. A repeated call replaces it.
func WithFallback(s floodgate.Store) Option { return func(o *options) { o.fallback = s } }

// WithBreaker configures the circuit breaker: after failures consecutive
// failed calls it opens, and decisions go straight to the failure policy,
// first for an eighth of cooldown; then the next decision starts a probe
// (half-open) and goes to the policy itself. The probe peeks at that
// decision's bucket from a goroutine of its own, waiting up to the larger
// of the deadline and 1 s (plus the stretch of a starved process, see
// [WithDeadline]), so that a busy process still sees a healthy Redis
// answer; it closes the breaker on success and reopens it on failure for
// twice the last wait, at most cooldown. So once Redis is healthy,
// decisions return to it within about one cooldown, whatever the load, and
// within an eighth of it after a brief outage. Calls cut short by the caller's context, and timeouts of a process
// starved of CPU, are not failures; such a timeout instead has a probe with
// the same budget check Redis, and opens the breaker if it fails too. The
// defaults are 5 failures and 500 ms. failures must be ≥ 1 and cooldown > 0.
// A repeated call replaces both.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(o *options) { o.failures, o.cooldown = failures, cooldown }
}

// WithBatching coalesces concurrent decisions into one round trip of at most
// max decisions: decisions on a standalone server, or on one Cluster slot,
// become a single script call; the rest are pipelined. Accounting stays
// exact; only latency changes. max = 0 (the default) turns batching off:
// every decision is its own call. A repeated call replaces it.
func WithBatching(max int) Option { return func(o *options) { o.batch = max } }

// WithDenyCache keeps the size buckets Redis most recently denied in
// process and denies requests on them without a round trip while the
// bucket cannot yet hold the requested tokens. A cached denial never
// admits and never denies a request Redis would admit, except that a
// Refund, Reset, lease given back or raised limit (elsewhere, or a faster
// rate here) is seen only once the entry expires (at the denied request's
// retry-after). size = 0
// (the default) turns it off. A repeated call replaces it.
func WithDenyCache(size int) Option { return func(o *options) { o.cacheSize = size } }

// WithLeases lets the store decide takes in process on tokens Redis leased
// to it: a key this store decides on more than once gets, with a round
// trip it makes anyway, up to a quarter of the lease time d of its demand
// here (at most an eighth of the burst), recorded on Redis with the
// bucket, spent here for d/2 after it was asked for, and given back, what
// is left of it, with the key's next round trip within d, under a new
// limit, or at [Store.Close]. Leases change the bound of docs/stores.md by nothing;
// what a lease left unspent when its process died is lost, until it
// expires on Redis. At most keys keys are tracked, the ones decided on
// most recently. d = 0 (the default) turns leases off; d must be at least
// a millisecond. A repeated call replaces both.
func WithLeases(d time.Duration, keys int) Option {
	return func(o *options) { o.leaseTime, o.leaseKeys = d, keys }
}

// WithOnError sets a function called with every error from Redis that made
// the failure policy decide: for logging and metrics. It runs on the
// decision's goroutine and must be fast. The error text is Redis's; it never
// reaches a Result or a returned error. A repeated call replaces it; nil
// removes it.
func WithOnError(f func(error)) Option { return func(o *options) { o.onError = f } }

// WithObserver sets the [Observer] that receives the store's round trips to
// Redis, breaker transitions and decisions not made by Redis: for metrics
// (promfloodgate.RedisMetrics is one). Without it (nil, the default) the
// store reads no extra clock and allocates nothing for observation; with it,
// each round trip costs two clock reads and one call. A repeated call
// replaces the observer.
func WithObserver(obs Observer) Option { return func(o *options) { o.observer = obs } }

// WithLogger sets the logger for the breaker's transitions: one line per
// change of state, "redisstore: breaker state change", at Warn to open (with
// the kind of the error that opened it and the cooldown) and at Info to
// half-open and closed (with how long the breaker was open), each with the
// store's prefix and name. Decisions are never logged one by one, and no
// line holds a key or Redis's error text. A nil logger, the default, logs
// nothing. A repeated call replaces the logger.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

func (o *options) validate() error {
	for _, f := range []struct{ option, v string }{{"WithPrefix", o.prefix}, {"WithName", o.name}} {
		if f.v == "" || strings.ContainsAny(f.v, "{}") {
			return invalid("%s(%q): empty or holds '{' or '}'", f.option, f.v)
		}
	}
	switch {
	case o.deadline <= 0:
		return invalid("WithDeadline(%v): not positive", o.deadline)
	case o.policy > Closed:
		return invalid("WithFailurePolicy(%d): unknown policy", o.policy)
	case math.IsNaN(o.divisor) || math.IsInf(o.divisor, 0) || o.divisor < 1:
		return invalid("WithLocalDivisor(%v): not a finite number ≥ 1", o.divisor)
	case o.failures < 1:
		return invalid("WithBreaker(%d, %v): failures below 1", o.failures, o.cooldown)
	case o.cooldown <= 0:
		return invalid("WithBreaker(%d, %v): cooldown not positive", o.failures, o.cooldown)
	case o.batch < 0:
		return invalid("WithBatching(%d): negative", o.batch)
	case o.cacheSize < 0:
		return invalid("WithDenyCache(%d): negative", o.cacheSize)
	case o.leaseTime < 0:
		return invalid("WithLeases(%v, %d): negative lease time", o.leaseTime, o.leaseKeys)
	case o.leaseTime > 0 && o.leaseKeys < 1:
		return invalid("WithLeases(%v, %d): keys below 1", o.leaseTime, o.leaseKeys)
	case o.leaseTime > 0 && o.leaseTime < time.Millisecond:
		return invalid("WithLeases(%v, %d): below a millisecond", o.leaseTime, o.leaseKeys)
	}
	return nil
}

// invalid returns a configuration error of New: it names what was refused
// and wraps [floodgate.ErrInvalidOption].
func invalid(format string, args ...any) error {
	return fmt.Errorf("redisstore: %s: %w", fmt.Sprintf(format, args...), floodgate.ErrInvalidOption)
}
