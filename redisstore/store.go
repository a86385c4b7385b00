package redisstore

import (
	"context"
	"errors"
	"fmt"
	"github.com/floodgate-go/floodgate/remote"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/redis/go-redis/v9"
)

// MaxKeyLen is the longest key, in bytes, that the store accepts: a
// bucket's Redis key is at most the prefix, the key (up to three times as
// long once escaped), the name and four bytes. Subjects are meant to be
// tenant ids, client addresses or API key digests; a longer one is more
// likely an attacker's, and would cost Redis memory and each call time.
const MaxKeyLen = 1024

// ErrUnavailable is wrapped by the errors of Peek, Refund and Reset when
// Redis cannot answer within the deadline. The error's text never includes
// Redis's; errors.Unwrap returns the cause for logs.
var ErrUnavailable = errors.New("redisstore: redis unavailable")

type unavailableError struct{ cause error }

func (e *unavailableError) Error() string        { return ErrUnavailable.Error() }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }
func (e *unavailableError) Unwrap() error        { return e.cause }

// A Store is a [floodgate.Store] whose buckets live on Redis, so that one
// limit holds across every process that shares the Redis. Each decision is
// one atomic script call (or part of one, when batched); the store keeps no
// bucket state in process except what the optional deny cache, leases and
// the Local fallback hold.
//
// Decisions never fail because Redis does: when a call errors or misses its
// deadline, or the breaker is open, the failure policy decides, and the
// Result's Source says so. TakeN returns an error only for an invalid limit,
// a negative n, n above the burst, a key longer than [MaxKeyLen], or a
// context that ended before Redis answered.
//
// A Store is safe for concurrent use. [Store.Close] gives back the tokens
// its leases hold ([WithLeases]); without leases it does nothing. The
// goroutines it starts are short-lived: with batching on or with a client
// that ignores context deadlines, ones that end with the calls they serve;
// the breaker's probe, which ends within its budget; and, at most once a
// second, the registration that counts the instances sharing the store's
// prefix and name (see [WithLocalDivisor]), which ends within the
// deadline.
type Store struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // nil unless client is one
	opts    options
	obs     Observer // nil unless WithObserver

	keyHead, keyTail string
	leaseArg         string        // the lease time in ms, for the script
	guard            bool          // the client ignores context deadlines
	budget           time.Duration // Redis's share of the deadline
	slots            deadlineSlots
	fallback         floodgate.Store
	br               breaker
	batch            *batcher
	cache            *denyCache
	leases           *leaseTable
	lastReload       atomic.Int64
	inst             *instances
	checking         atomic.Bool  // a probe checks a starved timeout
	groups           atomic.Int64 // numbers all-or-nothing groups
	fbMu             sync.Mutex
	fbSeen           *simplelru.LRU[string, int64] // key → local ns of its last fallback decision
	closeOnce        sync.Once

	counts  [7]atomic.Uint64 // by floodgate.Source
	errs    atomic.Uint64
	starves atomic.Uint64
}

var (
	_ floodgate.Store    = (*Store)(nil)
	_ floodgate.Peeker   = (*Store)(nil)
	_ floodgate.Resetter = (*Store)(nil)
	_ floodgate.Reserver = (*Store)(nil)
)

// New returns a Store deciding on client, a *redis.Client, *redis.ClusterClient
// or *redis.Ring (anything that runs scripts and pipelines). A nil client
// or an invalid option is an error wrapping [floodgate.ErrInvalidOption]
// that names the option and the value refused.
//
// Every call carries a context bounded by the store's deadline. go-redis
// honours that deadline only when the client was made with
// ContextTimeoutEnabled: true; set it, and MaxRetries: -1 so that a failed
// call falls back at once instead of retrying inside the deadline. With
// ContextTimeoutEnabled false on a known client type (or an unknown client
// type), each call runs on its own goroutine and the decision stops waiting
// at the deadline, which costs a goroutine per decision.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, invalid("nil client")
	}
	o := defaults()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		client:  client,
		opts:    o,
		keyHead: o.prefix + ":{",
		keyTail: "}:" + o.name,
		guard:   true,
		budget:  o.deadline - min(o.deadline/10, 5*time.Millisecond),
	}
	switch c := client.(type) {
	case *redis.Client:
		s.guard = !c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		s.guard = !c.Options().ContextTimeoutEnabled
		s.cluster = c
	case *redis.Ring:
		s.guard = !c.Options().ContextTimeoutEnabled
	}
	s.slots.budget = s.budget
	s.obs = o.observer
	s.inst = newInstances(o.prefix, o.name)
	var notify func(transition)
	if o.observer != nil || o.logger != nil {
		notify = s.transitioned
	}
	s.br.init(o.failures, o.cooldown, notify)
	if o.policy == Local {
		s.fbSeen, _ = simplelru.NewLRU[string, int64](fallbackKeys, nil)
		s.fallback = o.fallback
		if s.fallback == nil {
			m, err := keyed.New()
			if err != nil {
				return nil, fmt.Errorf("redisstore: local fallback: %w", err)
			}
			s.fallback = m
		}
	}
	if o.batch > 0 {
		s.batch = newBatcher(s, o.batch)
	}
	if o.cacheSize > 0 {
		s.cache = newDenyCache(o.cacheSize)
	}
	s.leaseArg = "0"
	if o.leaseTime > 0 {
		s.leases = newLeaseTable(o.leaseTime, o.leaseKeys)
		s.leaseArg = strconv.FormatInt(o.leaseTime.Milliseconds(), 10)
	}
	return s, nil
}

// Key returns the Redis key of subject's bucket:
// <prefix>:{<escaped subject>}:<name>. Escaping replaces '%', '{' and '}' by
// %25, %7B and %7D, so that the braces around the subject are the key's
// Cluster hash tag whatever the subject holds.
func (s *Store) Key(subject string) string {
	if strings.ContainsAny(subject, "%{}") {
		subject = escaper.Replace(subject)
	}
	return s.keyHead + subject + s.keyTail
}

// fallbackKeys bounds the keys whose fallback decisions are remembered;
// a key forgotten mid-outage is drained again, which errs toward the limit.
const fallbackKeys = 1 << 16

var escaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// now returns the time argument of the script: µs since the epoch from the
// client clock, or -1 for the server's TIME.
func (s *Store) now() int64 {
	if s.opts.clock != nil {
		return s.opts.clock.Now().UnixMicro()
	}
	return -1
}

// local returns the time in ns for the in-process cache and leases: the
// client clock when one is set, so that tests control it, else monotonic.
func (s *Store) local() int64 {
	if s.opts.clock != nil {
		return s.opts.clock.Now().UnixNano()
	}
	return int64(time.Since(monoBase))
}

var monoBase = time.Now()

func check(key string, lim floodgate.Limit, n int) error {
	if n < 0 {
		return floodgate.ErrNegativeN
	}
	if err := lim.Validate(); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	if exceeds(lim, n) {
		return errExceedsBurst
	}
	return checkKey(key)
}

func checkKey(key string) error {
	if len(key) > MaxKeyLen {
		// Before any call to Redis and any local decision.
		return fmt.Errorf("%w: redisstore: %d bytes, more than %d", floodgate.ErrKeyTooLong, len(key), MaxKeyLen)
	}
	return nil
}

// exceeds reports whether n tokens can never be taken under lim although
// lim admits something: the zero Limit refuses every take as a decision.
func exceeds(lim floodgate.Limit, n int) bool {
	return n > lim.Burst && lim.Burst > 0 && !lim.IsInf()
}

var errExceedsBurst = fmt.Errorf("redisstore: %w", floodgate.ErrExceedsBurst)

// TakeN takes n tokens from key's bucket under lim, atomically on Redis,
// with the semantics of the keyed store:
//
//   - a bucket seen for the first time (or expired, which happens only once
//     it is full) is full;
//   - a rejected take writes nothing; RetryAfter is the time until n tokens
//     are there (Never at rate 0);
//   - n = 0 reports the bucket without writing;
//   - [floodgate.Inf] is allowed without a call, with Remaining = lim.Burst
//     and Source [floodgate.SourceRedis] (the store's normal source).
//
// When Redis cannot decide in time, the failure policy does. TakeN returns
// an error, and makes no call, for a negative n ([floodgate.ErrNegativeN]),
// an invalid limit, n > lim.Burst ≥ 1 (wrapping [floodgate.ErrExceedsBurst],
// with a Result refused with RetryAfter [floodgate.Never]; the zero Limit,
// which admits nothing, refuses with that Result and no error) and a key
// longer than [MaxKeyLen] ([floodgate.ErrKeyTooLong]). It returns the context's error
// when ctx ends before Redis answers, also when ctx's deadline, earlier than
// the store's, cut the call short: such a call never goes to the failure
// policy, and counts as no failure of Redis.
func (s *Store) TakeN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	res, _, err := s.take(ctx, key, lim, n, false)
	return res, err
}

// take decides a take, or with reserve a reservation, which differs in
// one case: a reservation of 0 tokens is refused while the bucket owes
// tokens, where a take of 0 is a peek. It returns what settles a
// reservation of what it admitted: the store itself, the fallback under
// its scaled limit, or nil where nothing was taken.
func (s *Store) take(ctx context.Context, key string, lim floodgate.Limit, n int, reserve bool) (floodgate.Result, floodgate.Settler, error) {
	if err := check(key, lim, n); err != nil {
		if err == errExceedsBurst {
			return floodgate.Result{Limit: lim, RetryAfter: floodgate.Never, Source: floodgate.SourceRedis}, nil, err
		}
		return floodgate.Result{}, nil, err
	}
	if lim.IsInf() {
		s.counts[floodgate.SourceRedis].Add(1)
		return floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst, Source: floodgate.SourceRedis}, s, nil
	}
	if err := ctx.Err(); err != nil {
		return floodgate.Result{}, nil, err
	}
	if n > 0 && n <= lim.Burst {
		if s.leases != nil {
			if res, ok := s.spend(key, lim, n); ok {
				s.decided(floodgate.SourceLease)
				return res, s, nil
			}
		}
		if s.cache != nil {
			if res, ok := s.cache.lookup(key, lim, n, s.local()); ok {
				s.decided(floodgate.SourceCache)
				return res, nil, nil
			}
		}
	}
	mode := modeTake
	switch {
	case n > 0:
	case !reserve:
		mode = modePeek
	case lim.IsZero(): // admits nothing, not even a reservation of nothing
		s.counts[floodgate.SourceRedis].Add(1)
		return floodgate.Result{Limit: lim, RetryAfter: floodgate.Never, Source: floodgate.SourceRedis}, nil, nil
	}
	if res, st, ok, err := s.spared(ctx, key, lim, n, mode); ok {
		return res, st, err
	}
	o := op{key: s.Key(key), lim: lim, n: n, mode: mode}
	leasing := mode == modeTake && n > 0 && s.leases != nil && s.leaseOp(key, &o)
	var sent int64
	if s.cache != nil || s.leases != nil {
		sent = s.local()
	}
	r, err := s.call(ctx, &o)
	if leasing {
		s.leased(key, &o, r, err)
	}
	if err != nil {
		if cerr := ended(ctx); cerr != nil {
			return floodgate.Result{}, nil, cerr
		}
		return s.fail(ctx, &o, key, err)
	}
	s.counts[floodgate.SourceRedis].Add(1)
	res := o.result(r)
	switch {
	case leasing && r.allowed:
		res.Remaining += int(r.taken) - n // this store's new lease
	case s.leases != nil && !leasing:
		s.observed(key, lim, r, sent)
	}
	if s.cache != nil && !r.allowed && n > 0 && n <= lim.Burst {
		s.cache.insert(key, lim, r.tokens*unit, sent, res.RetryAfter)
	}
	return res, s, nil
}

// spared decides a take by the failure policy when the open breaker keeps
// it from Redis, and reports whether it did. It allocates nothing: while
// the breaker is open, decisions are many and cheap, and garbage would
// only slow them.
func (s *Store) spared(ctx context.Context, key string, lim floodgate.Limit, n, mode int) (floodgate.Result, floodgate.Settler, bool, error) {
	if !s.br.isOpen() {
		return floodgate.Result{}, nil, false, nil // no clock read on the common path
	}
	ok, probe := s.br.allow(time.Now())
	if ok {
		return floodgate.Result{}, nil, false, nil
	}
	if probe {
		s.probe(op{key: s.Key(key), lim: lim}, true)
	}
	o := op{lim: lim, n: n, mode: mode}
	res, st, err := s.fail(ctx, &o, key, errBreakerOpen)
	return res, st, true, err
}

// ended returns ctx's error, or context.DeadlineExceeded once ctx's
// deadline has passed. A call bounded by that deadline fails through a
// context derived from ctx, whose timer can fire before ctx's own: Err
// alone would still be nil, and the failure would pass for Redis's.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// errBreakerOpen stands for the failed call the breaker spares.
var errBreakerOpen = errors.New("redisstore: breaker open")

// starved1 counts a call that missed its deadline while the process was
// starved of CPU, and reports it.
func (s *Store) starved1() {
	s.starves.Add(1)
	if s.obs != nil {
		s.obs.ObserveStarved()
	}
}

// errStarved stands for a call that missed its deadline while the process
// was starved of CPU: Redis may well have answered in time.
var errStarved = errors.New("redisstore: call timed out while the process was starved of CPU")

// call runs o on Redis under the breaker and the deadline, and sorts its
// failure. The caller's context ending first says nothing about Redis. Nor
// does a timeout while this process was starved of CPU: that one returns
// errStarved and has a probe with a generous budget find out whether Redis
// answers, which opens the breaker if it does not.
func (s *Store) call(ctx context.Context, o *op) (reply, error) {
	now := time.Now()
	if ok, probe := s.br.allow(now); !ok {
		if probe {
			s.probe(*o, true)
		}
		return reply{}, errBreakerOpen
	}
	var r reply
	var err error
	if s.batch != nil {
		r, err = s.batch.do(ctx, o)
	} else {
		r, err = s.single(ctx, o)
	}
	switch {
	case err == nil:
		s.br.success(now)
		s.register()
	case err == errNotBucket:
		// Redis answered; one key's content says nothing about it.
		s.br.success(now)
		s.errs.Add(1)
		if s.opts.onError != nil {
			s.opts.onError(err)
		}
	case ended(ctx) != nil:
		// The caller gave up, or its deadline cut the call short.
	case s.starvedTimeout(err, now):
		s.starved1()
		if s.checking.CompareAndSwap(false, true) {
			s.probe(*o, false)
		}
		err = errStarved
	default:
		s.br.failure(time.Now(), err)
		s.failed(err)
	}
	return r, err
}

// starvedTimeout reports whether err is a timeout of a call that started at
// start, which the process's own scheduling delay since then explains (see
// schedWatch).
func (s *Store) starvedTimeout(err error, start time.Time) bool {
	return KindOf(err) == remote.KindTimeout && s.starved(sched.since(int64(start.Sub(monoBase))))
}

// probeBudget is the least time a probe waits for Redis. A probe holds up
// no caller, so it can wait long enough for a loaded process to read the
// answer: a probe that missed a short deadline under load would keep the
// breaker open while Redis is healthy.
const probeBudget = time.Second

// probe peeks at o's bucket (it takes nothing) from a goroutine of its own.
// The breaker's half-open probe ends the half-open state with its outcome;
// the check of a starved timeout opens the breaker if Redis does not
// answer either.
func (s *Store) probe(o op, halfOpen bool) {
	o.mode, o.n, o.a1, o.a2, o.a3, o.grp = modePeek, 0, 0, 0, 0, 0
	go func() {
		budget := max(s.opts.deadline, probeBudget) + s.stretch()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		start := time.Now()
		err := s.bounded(ctx, func(ctx context.Context) error {
			_, err := s.run(ctx, &o)
			return err
		})
		if s.obs != nil {
			s.observe(start, err)
		}
		if err == errNotBucket {
			err = nil // Redis answered
		}
		// A probe that timed out while the process was too starved to
		// read in time proves nothing either way. Its budget is long, so
		// it takes a delay of half of it: a starved process reads a
		// healthy Redis's answer well within it, and a hung Redis must
		// not pass for starvation for as long as the process is busy.
		moot := KindOf(err) == remote.KindTimeout && sched.since(int64(start.Sub(monoBase))) >= budget/2
		switch {
		case halfOpen:
			s.br.probed(time.Now(), err) // a moot one reopens: no proof of health
		case err != nil && !moot:
			s.br.trip(start, time.Now(), err)
		}
		if !halfOpen {
			s.checking.Store(false)
		}
		switch {
		case err == nil:
			s.register()
		case !moot:
			s.failed(err)
		}
	}()
}

// single runs o as its own script call within the deadline.
func (s *Store) single(ctx context.Context, o *op) (reply, error) {
	dctx, cancel := s.callCtx(ctx)
	defer cancel()
	if !s.guard {
		// No closure: this is the hot path.
		if s.obs == nil {
			return s.run(dctx, o)
		}
		start := time.Now()
		r, err := s.run(dctx, o)
		s.observeFor(ctx, start, err)
		return r, err
	}
	var start time.Time
	if s.obs != nil {
		start = time.Now()
	}
	type answer struct {
		r   reply
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		r, err := s.run(dctx, o)
		ch <- answer{r, err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-dctx.Done():
		// The call may go on; it is observed as ending here, as the
		// decision sees it.
		a.err = dctx.Err()
	}
	if s.obs != nil {
		s.observeFor(ctx, start, a.err)
	}
	return a.r, a.err
}

// bounded runs f, on a goroutine of its own when the client may ignore
// ctx's deadline, and returns by that deadline. f must not write anything
// its caller reads: it may outlive the call.
func (s *Store) bounded(ctx context.Context, f func(context.Context) error) error {
	if !s.guard {
		return f(ctx)
	}
	ch := make(chan error, 1)
	go func() { ch <- f(ctx) }()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) run(ctx context.Context, o *op) (reply, error) {
	vals, err := s.evalOps(ctx, s.client, s.now(), []*op{o})
	if err != nil {
		return reply{}, err
	}
	return parse(vals, 0)
}

var errShortReply = errors.New("redisstore: short script reply")

// failed records a Redis failure: counts it, reports it, and on a Cluster
// asks for a topology reload (at most once per reload period), since a
// failed node or a moved slot is the likeliest cause.
func (s *Store) failed(err error) {
	s.errs.Add(1)
	if s.cluster != nil {
		now := time.Now().UnixNano()
		last := s.lastReload.Load()
		if now-last >= int64(s.opts.reloadPeriod) && s.lastReload.CompareAndSwap(last, now) {
			s.cluster.ReloadState(context.Background())
		}
	}
	if s.opts.onError != nil && err != errBreakerOpen {
		s.opts.onError(err)
	}
}

// fail decides o, which failed with err, by the failure policy, and
// returns what settles a reservation it admitted (see take). A call that
// the process was too starved to see answered is refused under Local as
// under Closed: Redis is likely up and deciding for the other instances,
// so a local bucket would admit beside it.
func (s *Store) fail(ctx context.Context, o *op, subject string, err error) (floodgate.Result, floodgate.Settler, error) {
	policy := s.opts.policy
	if err == errStarved && policy == Local {
		s.decided(floodgate.SourceFailClosed)
		return floodgate.Result{Limit: o.lim, RetryAfter: max(sched.recent(), time.Millisecond), Source: floodgate.SourceFailClosed}, nil, nil
	}
	switch policy {
	case Open:
		s.decided(floodgate.SourceFailOpen)
		return floodgate.Result{Allowed: true, Limit: o.lim, Source: floodgate.SourceFailOpen}, nil, nil
	case Closed:
		retry := s.br.retryAfter(time.Now())
		if err == errStarved {
			retry = max(sched.recent(), time.Millisecond)
		}
		s.decided(floodgate.SourceFailClosed)
		return floodgate.Result{Limit: o.lim, RetryAfter: retry, Source: floodgate.SourceFailClosed}, nil, nil
	}
	n := o.n
	lim := o.lim.Scale(1 / s.divisor())
	var res floodgate.Result
	err = nil
	if n <= lim.Burst {
		res, err = s.fallbackTake(ctx, subject, lim, n, o.mode)
	}
	switch {
	case n > lim.Burst || errors.Is(err, floodgate.ErrExceedsBurst):
		// More than this instance's share can ever hold: refused until
		// Redis may decide again (for good under the zero Limit).
		retry := floodgate.Never
		if o.lim.Burst > 0 {
			retry = s.br.retryAfter(time.Now())
		}
		res = floodgate.Result{Limit: lim, RetryAfter: retry}
	case err != nil:
		return floodgate.Result{}, nil, err
	}
	res.Source = floodgate.SourceFallback
	s.decided(floodgate.SourceFallback)
	var st floodgate.Settler
	if fs, ok := s.fallback.(floodgate.Settler); ok {
		st = scaled{fs, lim}
	}
	return res, st, nil
}

// scaled settles on the fallback under the scaled limit its reservation
// was taken under, whatever limit the caller names.
type scaled struct {
	floodgate.Settler
	lim floodgate.Limit
}

func (f scaled) SettleN(ctx context.Context, key string, _ floodgate.Limit, reserved, actual int) (floodgate.Result, error) {
	return f.Settler.SettleN(ctx, key, f.lim, reserved, actual)
}

// fallbackTake takes n tokens from the fallback store. A reservation of 0
// tokens (modeTake) is a reservation there too, when the fallback can
// reserve: a take of 0 would admit it while the local bucket owes tokens.
func (s *Store) fallbackTake(ctx context.Context, key string, lim floodgate.Limit, n, mode int) (floodgate.Result, error) {
	s.drainOnce(ctx, key, lim)
	if n == 0 && mode == modeTake {
		if r, ok := s.fallback.(floodgate.Reserver); ok {
			rv, err := r.ReserveN(ctx, key, lim, 0)
			return rv.Result, err
		}
	}
	return s.fallback.TakeN(ctx, key, lim, n)
}

// Peek reports key's bucket under lim without taking from it: Remaining,
// ResetAfter, and Allowed = true, as TakeN with n = 0 does. Unlike TakeN it
// asks Redis only (no cache, lease or fallback) and returns an error
// wrapping [ErrUnavailable] when Redis cannot answer.
func (s *Store) Peek(ctx context.Context, key string, lim floodgate.Limit) (floodgate.Result, error) {
	if err := check(key, lim, 0); err != nil {
		return floodgate.Result{}, err
	}
	if lim.IsInf() {
		return floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst, Source: floodgate.SourceRedis}, nil
	}
	o := op{key: s.Key(key), lim: lim, mode: modePeek}
	r, err := s.call(ctx, &o)
	if err != nil {
		return floodgate.Result{}, s.unavailable(ctx, err)
	}
	return withLease(o.result(r), s.leaseTokens(key, lim)), nil
}

// Refund returns n tokens to key's bucket under lim, never above its burst:
// for work that was admitted but not done. A missing bucket is full and
// stays missing. It returns an error wrapping [ErrUnavailable] when Redis
// cannot answer; tokens taken by the fallback are not refunded.
func (s *Store) Refund(ctx context.Context, key string, lim floodgate.Limit, n int) error {
	if n < 0 {
		return floodgate.ErrNegativeN
	}
	if err := check(key, lim, 0); err != nil {
		return err
	}
	if exceeds(lim, n) {
		n = lim.Burst // a bucket never holds more
	}
	if err := check(key, lim, n); err != nil {
		return err
	}
	if lim.IsInf() || n == 0 {
		return nil
	}
	if s.cache != nil {
		s.cache.Remove(key)
	}
	o := op{key: s.Key(key), lim: lim, n: n, mode: modeRefund}
	if _, err := s.call(ctx, &o); err != nil {
		return s.unavailable(ctx, err)
	}
	return nil
}

// Reset deletes key's bucket, which makes it full, and drops what the deny
// cache and leases hold for key in this process. It returns an error
// wrapping [ErrUnavailable] when Redis cannot answer.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if s.cache != nil {
		s.cache.Remove(key)
	}
	if s.leases != nil {
		s.leases.remove(key)
	}
	if ok, probe := s.br.allow(time.Now()); !ok {
		if probe {
			// The first call since the cooldown owes the breaker its
			// half-open probe, or the breaker would stay half-open. A
			// peek under any limit writes nothing but a longer TTL.
			s.probe(op{key: s.Key(key), lim: floodgate.Limit{Rate: 1, Burst: 1}}, true)
		}
		return &unavailableError{errBreakerOpen}
	}
	dctx, cancel := s.callCtx(ctx)
	defer cancel()
	start := time.Now()
	err := s.bounded(dctx, func(ctx context.Context) error {
		// A full bucket, not a missing one: it lingers as every full
		// bucket does, so that no store takes it for a lost one.
		k := s.Key(key)
		return s.client.Set(ctx, k, fullState, linger).Err()
	})
	if s.obs != nil {
		s.observeFor(ctx, start, err)
	}
	switch {
	case err == nil:
		s.br.success(start)
		return nil
	case ended(ctx) != nil:
	case s.starvedTimeout(err, start):
		s.starved1()
	default:
		s.br.failure(time.Now(), err)
		s.failed(err)
	}
	return s.unavailable(ctx, err)
}

func (s *Store) unavailable(ctx context.Context, err error) error {
	if cerr := ended(ctx); cerr != nil {
		return cerr
	}
	return &unavailableError{err}
}

// Stats counts a Store's decisions by source since New.
type Stats struct {
	// Redis counts takes that Redis decided, peeks (n = 0) included, and
	// takes under floodgate.Inf, which Redis admits without a call.
	Redis uint64
	// Cache counts takes denied without a call, from the local cache of
	// Redis's recent denials.
	Cache uint64
	// Lease counts takes decided in process on tokens Redis leased to this
	// store ([WithLeases]).
	Lease uint64
	// Fallback counts takes decided by the fallback store under the [Local]
	// policy while Redis could not decide.
	Fallback uint64
	// FailOpen counts takes admitted by the [Open] policy while Redis could
	// not decide.
	FailOpen uint64
	// FailClosed counts takes rejected by the [Closed] policy while Redis
	// could not decide.
	FailClosed uint64
	// Errors counts Redis calls that failed or missed the deadline (not
	// those the open breaker spared), and decisions on keys that hold
	// something other than a bucket. Calls cut short by the caller's
	// context and Starved calls are not errors.
	Errors uint64
	// Starved counts calls that missed the deadline while this process was
	// starved of CPU (its runnable goroutines waited at least a quarter of
	// the deadline to run): the failure policy decided them, but they do
	// not count against Redis in the breaker.
	Starved uint64
	// Instances is how many stores with this store's prefix and name
	// (this one included) decided on Redis in the last 5 s, as last
	// counted; 0 before the first count. See [WithLocalDivisor].
	Instances int
	// Trips counts transitions of the breaker to open.
	Trips uint64
	// Open reports whether the breaker is open (or half-open) now.
	Open bool
	// Breaker is the breaker's state now.
	Breaker remote.BreakerState
}

// Stats returns the store's counters. It is safe to call concurrently with
// decisions.
func (s *Store) Stats() Stats {
	return Stats{
		Redis:      s.counts[floodgate.SourceRedis].Load(),
		Cache:      s.counts[floodgate.SourceCache].Load(),
		Lease:      s.counts[floodgate.SourceLease].Load(),
		Fallback:   s.counts[floodgate.SourceFallback].Load(),
		FailOpen:   s.counts[floodgate.SourceFailOpen].Load(),
		FailClosed: s.counts[floodgate.SourceFailClosed].Load(),
		Errors:     s.errs.Load(),
		Starved:    s.starves.Load(),
		Instances:  int(s.inst.count.Load()),
		Trips:      s.br.trips.Load(),
		Open:       s.br.isOpen(),
		Breaker:    s.br.current(),
	}
}

// Close gives back, in batched round trips within the deadline each, the
// tokens this store's live leases hold ([WithLeases]), so that the other
// instances may take them at once; a store without leases does nothing.
// Decisions may go on after Close: they lease again. Close is safe to call
// more than once, and concurrently with decisions; the first call does the
// work. It returns nil.
func (s *Store) Close() error {
	if s.leases != nil {
		s.closeOnce.Do(s.giveBack)
	}
	return nil
}

// fallbackGap is how long a key goes without a fallback decision before
// its next one starts a new outage for it.
const fallbackGap = time.Second

// drainOnce empties key's fallback bucket at its first fallback decision
// of an outage: the fallback goes on from nothing at the instance's part
// of the rate, as the bucket on Redis would for it, instead of admitting
// a fresh burst each time Redis goes away (see docs/stores.md).
func (s *Store) drainOnce(ctx context.Context, key string, lim floodgate.Limit) {
	now := s.local()
	s.fbMu.Lock()
	last, ok := s.fbSeen.Get(key)
	s.fbSeen.Add(key, now)
	s.fbMu.Unlock()
	if ok && now-last < int64(fallbackGap) {
		return
	}
	n := lim.Burst
	if p, ok := s.fallback.(floodgate.Peeker); ok {
		if res, err := p.Peek(ctx, key, lim); err == nil {
			n = res.Remaining
		}
	}
	if n > 0 {
		s.fallback.TakeN(ctx, key, lim, n)
	}
}
