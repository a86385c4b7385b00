package floodgate

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Never is the RetryAfter of a request that cannot succeed under its current
// limit: it asks for more tokens than the burst, or the rate is zero and the
// bucket is empty.
const Never = time.Duration(1<<63 - 1)

// ErrExceedsBurst is returned, or wrapped, by takes and waits of more tokens
// than the limit's burst: they can never succeed under that limit.
var ErrExceedsBurst = errors.New("floodgate: n exceeds the limit's burst")

// ErrWouldExceedDeadline is returned by waits that cannot be served before the
// context's deadline. The wait returns it at once instead of sleeping in vain.
var ErrWouldExceedDeadline = errors.New("floodgate: wait would exceed the context deadline")

// A Store holds token buckets by key and decides takes against them.
//
// TakeN takes n tokens from key's bucket under lim, atomically. It creates
// the bucket full on first use. When the bucket holds fewer than n tokens,
// nothing is taken and the Result says how long to wait. The limit travels
// with each call; stores keep only bucket state. An error means the store
// could not decide (a remote store unreachable, a context done, a key the
// store cannot hold); the Result is then meaningless unless the store
// documents a fallback.
//
// Every store, and [Wait], treat two takes that can never succeed alike:
//   - n > lim.Burst under a limit with a positive burst (and not [Inf]):
//     TakeN takes nothing and returns an error wrapping [ErrExceedsBurst],
//     with a Result refused with RetryAfter [Never]; Wait returns
//     ErrExceedsBurst.
//   - any n ≥ 1 under the zero Limit, which admits nothing by design:
//     TakeN refuses with RetryAfter [Never] and no error, as it refuses a
//     take from an empty bucket that never refills; Wait returns
//     [ErrWouldExceedDeadline].
//
// A bucket never goes below zero by a take: only a [Settler] charges it
// below zero, down to its limit's [Limit.DebtLimit]. While it is below zero
// every take is refused (Result.Owed > 0), with RetryAfter the time until
// it holds n tokens again.
//
// Implementations are safe for concurrent use.
type Store interface {
	TakeN(ctx context.Context, key string, lim Limit, n int) (Result, error)
}

// A Peeker reports key's bucket under lim without taking from it or
// creating it: Remaining, ResetAfter, and Allowed = true, as a take of 0
// tokens. Every store in this module implements it with this signature.
type Peeker interface {
	Peek(ctx context.Context, key string, lim Limit) (Result, error)
}

// A Resetter forgets key's bucket, so that its next take starts full.
// Every store in this module implements it with this signature.
type Resetter interface {
	Reset(ctx context.Context, key string) error
}

// Source names what decided a [Result].
type Source uint8

const (
	// SourceMemory: an in-process bucket (the keyed store).
	SourceMemory Source = iota
	// SourceRedis: the shared bucket on Redis.
	SourceRedis
	// SourceCache: a local cache of a recent remote denial.
	SourceCache
	// SourceLease: tokens the remote bucket leased to this process ahead of
	// time, spent in process.
	SourceLease
	// SourceFallback: a local bucket standing in for an unreachable remote.
	SourceFallback
	// SourceFailOpen: the remote was unreachable and the policy admits.
	SourceFailOpen
	// SourceFailClosed: the remote did not decide in time and the store
	// rejects: its policy says to, or it could not tell whether the remote
	// would have admitted (redisstore, while its process is starved of CPU).
	SourceFailClosed
)

var sourceNames = [...]string{"memory", "redis", "cache", "lease", "fallback", "fail-open", "fail-closed"}

// String returns the source's lower-case name, such as "redis".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Result is the outcome of one take.
type Result struct {
	// Allowed reports whether the tokens were taken.
	Allowed bool
	// Limit is the limit the decision was made under.
	Limit Limit
	// Remaining is the whole number of tokens left in the bucket after the
	// call (never negative).
	Remaining int
	// Owed is the tokens the bucket owes after the call, rounded up: 0
	// unless it is below zero, after a settle that charged more than was
	// reserved (or, in the keyed store, while WaitN reservations are
	// owed). A take refused with Owed > 0 was refused for the debt, which
	// refuses every take until it is repaid.
	Owed int
	// RetryAfter is how long until the same take could succeed: 0 when
	// allowed, [Never] when it cannot succeed under this limit. For a
	// bucket in debt it is the time to repay the debt and gain the tokens
	// asked for.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Source says what decided.
	Source Source
}

// Wait takes n tokens from key's bucket in store, sleeping between tries
// while the bucket is short. It returns nil once the tokens are taken.
//
// It returns at once with [ErrExceedsBurst] when n exceeds a positive burst,
// with [ErrWouldExceedDeadline] when the store's retry hint already passes
// ctx's deadline or is [Never] (a zero rate and a short bucket, or the zero
// Limit: no deadline is late enough), with ctx.Err() when ctx ends first, and
// with the store's error when the store cannot decide. Wait works with any [Store] and so cannot
// reserve tokens: under contention another caller may take them first, and
// Wait tries again. Each sleep is stretched by a random tenth at most, so
// waiters that were refused together do not all retry in the same instant.
// Stores that can reserve (keyed.Map.WaitN) serve waiters more fairly.
func Wait(ctx context.Context, store Store, key string, lim Limit, n int) error {
	if !lim.IsInf() && n > lim.Burst && lim.Burst > 0 {
		return ErrExceedsBurst
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		res, err := store.TakeN(ctx, key, lim, n)
		if err != nil {
			return err
		}
		if res.Allowed {
			return nil
		}
		d := res.RetryAfter
		if d == Never {
			return ErrWouldExceedDeadline
		}
		dl, hasDeadline := ctx.Deadline()
		if hasDeadline && time.Until(dl) < d {
			return ErrWouldExceedDeadline
		}
		if d <= 0 {
			d = time.Millisecond
		}
		j := rand.N(d/10 + 1)
		if hasDeadline {
			// The jitter must not carry a wait that fits past the deadline,
			// nor up to it: a store that checks the context (Redis's does)
			// would refuse a take made as it ends.
			j = min(j, max(time.Until(dl)-d-time.Millisecond, 0))
		}
		d += j
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
	}
}
