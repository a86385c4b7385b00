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
	// local divisor (see [WithLocalDivisor]): each instance admits its share.
	// Results carry [floodgate.SourceFallback]. The default. A call that
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
	credit       bool
	share        float64
	shareKeys    int
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
// failed calls it opens, and decisions go straight to the failure policy
// for cooldown; then the next decision starts a probe (half-open) and goes
// to the policy itself. The probe peeks at that decision's bucket from a
// goroutine of its own, waiting up to the larger of the deadline and 1 s
// (plus the stretch of a starved process, see [WithDeadline]), so that a
// busy process still sees a healthy Redis answer; it closes the breaker on
// success and reopens it for another cooldown on failure. So once Redis is
// healthy, decisions return to it within about one cooldown, whatever the
// load. Calls cut short by the caller's context, and timeouts of a process
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
// bucket cannot yet hold the requested tokens (with leases, the refused
// lease's minimum). A cached denial never admits and never denies a
// request Redis would admit (or, with leases, lease), except that a
// Refund, Reset or raised limit elsewhere is seen only once the entry
// expires (at the denied request's retry-after). size = 0 (the default) turns it off. A
// repeated call replaces it.
func WithDenyCache(size int) Option { return func(o *options) { o.cacheSize = size } }

// WithLeases lets hot buckets (two decisions on one key within d) take up to
// rate×d tokens from Redis at once, no more than the key's pace in this
// process would spend within d, and spend them locally for d. A lease
// takes at least half of what it asks for beyond the request's own tokens,
// or nothing: while the bucket holds less, the decision is refused (and the
// deny cache, when on, refuses the key until it holds that much), so that
// a key at its limit costs a round trip every half lease, not one for each
// token refilled. Over any window of length t, all instances together
// admit at most burst + rate×(t+d): the bound grows by rate×d. Tokens
// unused when a lease expires are lost, which under-admits; so are, for
// up to d/2, the last tokens of a bucket that holds fewer than a lease's
// minimum. At most keys keys are tracked, the
// ones decided on most recently. d = 0 (the default) turns leases off. A
// repeated call replaces both.
func WithLeases(d time.Duration, keys int) Option {
	return func(o *options) { o.leaseTime, o.leaseKeys = d, keys }
}

// WithCredit lets a store with leases decide a take without a round trip
// on a key it holds no leased tokens for: on credit, up to c = ⌊rate×d⌋
// tokens of the key at a time (d the lease time; at most the burst and the
// limit's DebtLimit), and no more than the shared bucket held when Redis
// last answered for the key in this process; a key this process has no
// answer for counts as full. Tokens taken on credit are charged to the
// shared bucket in the background within about d/20, in one batched call
// for all keys, as a settle is: below zero if the bucket no longer holds
// them, so that later takes repay them. A charge that leaves the bucket
// short stops credit on the key here until Redis admits a take again.
//
// Over any window of length t, N instances together admit at most
// burst + rate×(t + (2N+1)×d), against burst + rate×(t+d) with leases
// alone: each instance may hold c tokens not yet charged, and the bucket
// may owe c per instance from charges that found it empty. The bound
// holds while the lease table (WithLeases' keys) keeps every key decided
// within the last d/20: a key evicted with charges on their way is again
// one this process has no answer for, and may take c more. A charge Redis does not apply (Redis down or slow)
// is lost (the failed call counts in Stats.Errors); while the breaker is
// open no take is decided on credit. The default is off; New refuses it
// without leases.
func WithCredit() Option { return func(o *options) { o.credit = true } }

// WithShares splits every limit between the instances and Redis: each
// instance decides a share of each bucket in process, with no round trip
// and nothing sent to Redis, and only what the shares do not cover goes
// to the bucket on Redis, the pool, with the leases, credit and deny cache
// of the other options. With N instances counted (the stores with this
// store's prefix and name that registered on Redis in the last 5 s; see
// [WithLocalDivisor], whose divisor, rounded up, counts when larger), an
// instance's share of a limit holds b = ⌊f×burst/N⌋ tokens and refills at
// rate×b/burst; the pool holds the rest, burst − N×b tokens at the rest of
// the rate. A take goes to the share first and to the pool when the share
// cannot admit it.
//
// The shares and the pool together hold no more than the bucket: over any
// window of length t all instances admit at most burst + rate×t, plus the
// pool's own terms from leases and credit, which count only its part of
// the rate. This holds while the count is current. A store with shares
// registers every second, from a goroutine that runs until [Store.Close],
// so that idle instances stay counted. An instance decides on its share
// only while its last registration is less than 4 s old, before the others
// could drop it from their count; otherwise (Redis down, or after Close),
// and before its first count, it takes from the pool as if it were alone,
// the smallest pool any count gives. For about a
// second after an instance joins, the others, not yet counting it, hold
// the larger shares of the smaller count: up to one share of each bucket
// more. An instance that stops leaves its share unused until the others
// drop it, after 5 s.
//
// Instances that count each other should see each key's requests in equal
// parts, as replicas behind a round-robin balancer do: a key whose
// requests all reach one of N instances is admitted at up to
// (1 − f + f/N) of its limit, since the others' shares go unused. Give
// each group of instances that shares limits a prefix of its own
// ([WithPrefix]).
//
// A limit whose share would hold less than a token (f×burst < N) is not
// split, and Inf is never split. A take larger than the pool's burst waits
// for the share, and is refused for good (RetryAfter [floodgate.Never])
// when it is larger than the share's too, though at most the limit's: the
// largest take is at least burst − ⌊f×burst⌋. Decisions on the share have
// Source [floodgate.SourceLease] (a share is a standing lease of part of
// the bucket) and count in Stats.Lease and Stats.Shares; their Remaining
// and Owed are the share's, scaled to the bucket, and a reservation taken
// from a share settles on it, with Results in the share's tokens. Results
// of the pool have the whole limit as their Limit, and Remaining and Owed
// add this instance's share. Refunds, settles without a reservation and
// peeks go to the pool; Reset resets both. Shares keep deciding while
// Redis is down, for those 4 s; the pool's part goes to the failure policy,
// under the pool's limit.
//
// f must be in (0, 1). At most keys ≥ 1 keys hold a share at once, in a
// keyed.Map that never evicts a share not yet full: past that, new keys
// share their shard's overflow bucket, which can admit a key more than its
// share while a key with a larger limit refills it; size keys above the
// keys decided within a refill. The default is off.
func WithShares(f float64, keys int) Option {
	return func(o *options) { o.share, o.shareKeys = f, keys }
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
	case o.credit && o.leaseTime == 0:
		return invalid("WithCredit(): needs WithLeases, whose lease time sets the credit")
	case o.shareKeys != 0 || o.share != 0:
		if !(o.share > 0 && o.share < 1) {
			return invalid("WithShares(%v, %d): the fraction is not in (0, 1)", o.share, o.shareKeys)
		}
		if o.shareKeys < 1 {
			return invalid("WithShares(%v, %d): keys below 1", o.share, o.shareKeys)
		}
	}
	return nil
}

// invalid returns a configuration error of New: it names what was refused
// and wraps [floodgate.ErrInvalidOption].
func invalid(format string, args ...any) error {
	return fmt.Errorf("redisstore: %s: %w", fmt.Sprintf(format, args...), floodgate.ErrInvalidOption)
}
