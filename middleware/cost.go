package middleware

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

// WithCostEstimate sets the function that estimates what a call to method
// will cost in the unit of its metered quota (tenant.Meter), as it is
// admitted, from its context and its request: a unary call's request
// message, the *http.Request of a call through package httplimit, and nil
// for a stream, whose estimate is taken as it starts. It runs on the
// request path: keep it fast. It takes precedence over the estimate header
// and the config's estimate (tenant.MeteredSpec), which apply when it
// returns ok false, or a negative n (ignored, and counted in
// Event.InvalidCosts). An estimate above the quota's burst can never be
// reserved: the call is refused with RESOURCE_EXHAUSTED and no retry
// delay. nil, the default, leaves estimates to the header and the config.
// A repeated call replaces the function.
func WithCostEstimate(f func(ctx context.Context, method string, req any) (n int64, ok bool)) Option {
	return func(o *options) { o.estimate = f }
}

// WithActualCost sets a function that says what a response cost in the
// unit of its call's metered quota, so that a handler need not call
// ReportCost itself: a unary call's response message (after its handler
// returned without an error), each message a stream sends (before it is
// sent, covered by the call's reservations before it goes), and the bytes
// of each Write of a response through package httplimit. It returns ok
// false when the response says nothing of its cost; what it returns adds
// to what the handler reports with ReportCost. nil, the default, leaves
// the reports to ReportCost. A repeated call replaces the function.
func WithActualCost(f func(ctx context.Context, method string, resp any) (n int64, ok bool)) Option {
	return func(o *options) { o.actualCost = f }
}

// ReportCost reports that the metered call whose context ctx is (or
// derives from) has cost n more units of its quota, n ≥ 0, and reports
// whether that counts toward the call's settle. Reports add up: call it
// once with the total, or as the cost accrues (a stream, for each message
// it sends); ReportCost(ctx, 0) reports that the call cost nothing, which
// refunds its whole estimate. A call that ends without any report, a
// panic, an error or a deadline included, settles at its estimate.
//
// It returns false, and counts nothing, for a negative n (counted in
// Event.InvalidCosts), after the call ended and settled, and when ctx is
// not a metered call's: no Limiter, an exempt method, a method without a
// metered quota (tenant.Meter), or a call that holds no reservation (one
// its quota refused, which runs only in dry-run mode, and one admitted
// because the store failed). It is safe for concurrent use, allocates
// nothing and makes no store call: a stream's next message checks the
// reports against its reservations.
func ReportCost(ctx context.Context, n int64) bool {
	m, ok := ctx.Value(meterKey{}).(*meter)
	if !ok {
		return false
	}
	if n < 0 {
		m.invalid.Add(1)
		return false
	}
	return m.add(n)
}

// maxCost bounds the costs a call adds up, so that sums never overflow;
// it is far above any bucket (floodgate.MaxBurst).
const maxCost = 1 << 50

// dryRunPrefix marks the metered buckets of a Limiter in dry-run mode.
const dryRunPrefix = "dry:"

// errNotReserver is the store error of a metered call when the store
// cannot settle.
var errNotReserver = errors.New("middleware: the store is not a floodgate.Reserver and cannot serve metered quotas")

// estimate returns the estimate of call c under meter m, and false when
// the call's estimate header states one that is not a whole number within
// the burst (the config's estimate is returned then, for a dry run).
func (l *Limiter) estimate(ctx context.Context, c *Call, m *tenant.Meter, v *verdict) (int64, bool) {
	if m.Limit.IsInf() {
		return 0, true
	}
	if f := l.o.estimate; f != nil {
		if n, ok := f(ctx, c.Method, c.Request); ok {
			if n >= 0 {
				return min(n, maxCost), true
			}
			v.invalid++
		}
	}
	if h := m.EstimateHeader; h != "" {
		if vals := c.values(h); len(vals) > 0 {
			if n, ok := parseEstimate(vals, m.Limit.Burst); ok {
				return n, true
			}
			return int64(m.Estimate), false
		}
	}
	return int64(m.Estimate), true
}

// parseEstimate reads an estimate header: one value of decimal digits and
// nothing else (no sign, space, point or exponent, so no NaN, Inf or
// fraction), at most max.
func parseEstimate(vals []string, max int) (int64, bool) {
	if len(vals) != 1 {
		return 0, false // repeated: which one would be the caller's?
	}
	s := vals[0]
	if s == "" || len(s) > 19 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n < 0 || n > int64(max) { // 19 digits may overflow
		return 0, false
	}
	return n, true
}

// toInt converts a cost to a store's count: costs are at most maxCost,
// which an int holds except on 32-bit platforms, where it is cut to the
// largest int (beyond every burst, so a take of it is refused all the
// same).
func toInt(n int64) int {
	return int(min(n, math.MaxInt))
}

// reserve reserves the estimate of v's call from its metered bucket into
// rsv, after the call limit admitted it, and records the outcome in v. It
// returns the retry delay of a refusal.
func (l *Limiter) reserve(ctx context.Context, v *verdict, rsv *floodgate.Reservation, scale float64) time.Duration {
	m := v.r.rule.Meter
	lim := m.Limit
	if scale < 1 {
		lim = lim.Scale(scale)
	}
	r, err := l.reserveN(ctx, v.r.meterKey, lim, v.est)
	switch {
	case err != nil:
		// As for a take: the call runs, unmetered, unless the Limiter
		// fails closed.
		v.allowed = !l.o.failClosed && !errors.Is(err, floodgate.ErrKeyTooLong)
		v.reason, v.err = ReasonStoreError, err
		return 0
	case r.Result.Allowed:
		*rsv = r
		v.mres, v.reserved = r.Result, v.est
		return 0
	}
	v.mres, v.byMeter, v.allowed, v.reason = r.Result, true, false, meterReason(r.Result, scale)
	return r.Result.RetryAfter
}

// reserveN reserves n units of key's metered bucket under lim. An n the
// bucket can never hold is a refusal with RetryAfter Never, not an error.
func (l *Limiter) reserveN(ctx context.Context, key string, lim floodgate.Limit, n int64) (floodgate.Reservation, error) {
	if l.reserver == nil {
		return floodgate.Reservation{}, errNotReserver
	}
	r, err := l.reserver.ReserveN(ctx, key, lim, toInt(n))
	if errors.Is(err, floodgate.ErrExceedsBurst) {
		return floodgate.NewReservation(nil, key, lim, 0, floodgate.Result{Limit: lim, RetryAfter: floodgate.Never}), nil
	}
	return r, err
}

// meterReason names why a metered bucket refused a reservation.
func meterReason(res floodgate.Result, scale float64) Reason {
	switch {
	case res.Owed > 0:
		return ReasonDebt
	case scale < 1:
		return ReasonGate
	}
	return ReasonQuota
}

// A meter is a metered call's account: what it reported, what it
// reserved, and the reservation its settle settles. Only the last
// reservation is kept: a stream reserves another chunk only once its
// reports pass what it reserved before, so its actual cost is never below
// that, and its earlier reservations settle at their own size, which
// needs no call (see settle).
type meter struct {
	l    *Limiter
	v    *verdict        // the call's decision, in its context
	ctx  context.Context // the call's context, which carries the decision
	done detached        // the settle's context: ctx's values without its end
	call Call            // to find the route again after a reload

	// state is 0 while nothing is reported, 1 + the units reported since,
	// and sealed once the call is settled, so that a report races the
	// settle without a lock: it lands before, or returns false.
	state atomic.Int64

	// mu serializes a stream's chunks, its sends and receives on two
	// goroutines, and the settle. It is the call's own.
	mu      sync.Mutex
	table   *tenant.Table // the table route was found in
	route   *route        // where the next chunk goes
	rsv     floodgate.Reservation
	covered int64 // the units reserved in all
	before  int64 // covered, but for rsv's
	stop    error // the rejection that ended the chunks
	off     bool  // no more chunks: the rule lost its meter, or a dry run's was refused

	invalid atomic.Int32 // negative costs reported, ignored
}

const sealed = -1

type meterKey struct{}

// meteredCtx is a metered call's context: its decision and its meter, in
// the one allocation of the call.
type meteredCtx struct {
	decisionCtx
	m meter
}

func (c *meteredCtx) Value(key any) any {
	switch key {
	case decisionKey{}:
		return &c.decisionCtx
	case meterKey{}:
		return &c.m
	}
	return c.Context.Value(key)
}

// detached is a context with another's values and without its deadline
// and cancellation, as context.WithoutCancel makes, inside the meter so
// that a settle allocates nothing.
type detached struct{ parent context.Context }

func (*detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*detached) Done() <-chan struct{}       { return nil }
func (*detached) Err() error                  { return nil }
func (d *detached) Value(key any) any         { return d.parent.Value(key) }

// metered returns the context of a call admitted with the reservation
// rsv, carrying its decision v and its meter, for call c by route v.r of
// table (nil: unknown, found again at the first chunk).
func (l *Limiter) metered(ctx context.Context, v *verdict, rsv *floodgate.Reservation, c *Call, table *tenant.Table) *meteredCtx {
	mc := &meteredCtx{decisionCtx: decisionCtx{Context: ctx, v: *v}}
	mc.decided.Store(true)
	m := &mc.m
	m.l, m.v, m.ctx, m.call = l, &mc.v, mc, *c
	m.done.parent = mc
	m.table, m.route = table, v.r
	m.rsv, m.covered = *rsv, v.reserved
	return mc
}

// add adds n ≥ 0 units to what the call reported, unless it is settled.
func (m *meter) add(n int64) bool {
	n = min(n, maxCost)
	for {
		s := m.state.Load()
		if s == sealed {
			return false
		}
		ns := min(max(s, 1)+n, maxCost+1)
		if m.state.CompareAndSwap(s, ns) {
			return true
		}
	}
}

// send covers a message the call is about to send: what WithActualCost
// says it costs, with what the call reported, must fit what it reserved,
// or the next chunks are reserved.
func (m *meter) send(msg any) error {
	var c int64
	ok := false
	if f := m.l.o.actualCost; f != nil {
		if c, ok = f(m.ctx, m.v.method, msg); ok && c < 0 {
			m.invalid.Add(1)
			c, ok = 0, false
		}
	}
	return m.cover(min(c, maxCost), ok)
}

// cover makes sure what the call reported, with c more units, fits what
// it reserved, reserving the chunks it needs; it then adds c to the
// reports when ok. It returns the rejection once a chunk is refused, and
// from then on.
func (m *meter) cover(c int64, ok bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stop != nil {
		return m.stop
	}
	s := m.state.Load()
	if s == sealed {
		return nil
	}
	if need := max(s-1, 0) + c - m.covered; need > 0 && !m.off {
		m.resolve()   // the chunk's size is the table's in force
		n := int64(0) // a route without a meter reserves nothing (see chunk)
		if mt := m.route.rule.Meter; mt != nil {
			chunk := int64(mt.Chunk)
			n = (need + chunk - 1) / chunk * chunk
		}
		if !m.chunk(n) {
			return m.stop
		}
	}
	if ok {
		m.add(c)
	}
	return nil
}

// chunk reserves n more units, on the route of the table in force, so
// that a reload that lowers the quota or revokes the caller's key applies
// to the calls already running: a route without a metered quota reserves
// nothing more, and one that admits nothing (a revoked key, without an
// anonymous policy) refuses. It reports whether the call may go on.
func (m *meter) chunk(n int64) bool {
	l := m.l
	m.resolve()
	mt := m.route.rule.Meter
	// The chunk is a decision of its own, reported and counted as one,
	// under the call's decision and the chunk's route.
	v := *m.v
	v.r, v.gated, v.badEst, v.reserved, v.invalid, v.err = m.route, false, false, m.covered, 0, nil
	retry := time.Duration(0)
	switch {
	case mt == nil && m.route.rule.Limit.IsZero():
		// The table in force admits the caller nothing here (its key was
		// revoked, and anonymous callers have no policy): the call ends,
		// as a new one would be refused.
		v.res, v.mres, v.byMeter = floodgate.Result{Limit: m.route.rule.Limit, RetryAfter: floodgate.Never}, floodgate.Result{}, false
		v.allowed, v.reason = false, ReasonQuota
	case mt == nil:
		m.off = true // the quota is gone: nothing more to reserve
		return true
	default:
		scale := 1.0
		if l.o.gate != nil {
			scale = l.o.gate.Scale()
		}
		lim := mt.Limit
		if scale < 1 {
			lim = lim.Scale(scale)
		}
		r, err := l.reserveN(m.ctx, m.route.meterKey, lim, n)
		switch {
		case err == nil && r.Result.Allowed:
			m.before, m.covered, m.rsv = m.covered, m.covered+n, r
			return true
		case err != nil && m.ctx.Err() != nil:
			// The client went away, and a store that honours the context
			// gave up: the stream ends as its context did, and the store
			// did not fail.
			m.stop = status.FromContextError(m.ctx.Err()).Err()
			return false
		case err != nil:
			v.res, v.mres, v.byMeter = floodgate.Result{}, floodgate.Result{}, false
			v.allowed = !l.o.failClosed && !errors.Is(err, floodgate.ErrKeyTooLong)
			v.reason, v.err = ReasonStoreError, err
		default:
			v.mres, v.byMeter, v.allowed, v.reason = r.Result, true, false, meterReason(r.Result, scale)
			retry = r.Result.RetryAfter
		}
	}
	e := l.decided(m.ctx, &v, retry)
	if e == nil {
		// A store that failed open, or a dry run: the call goes on, and
		// reserves nothing more.
		m.off = true
		return true
	}
	m.stop = l.reject(m.ctx, e, e)
	return false
}

// resolve finds the call's route again when a reload replaced the table
// it was found in.
func (m *meter) resolve() {
	l := m.l
	if t := l.tables.Table(); t != m.table {
		c := m.call
		var v verdict
		l.resolve(m.ctx, &c, t, false, &v)
		m.route, m.table = v.r, t
	}
}

// settle settles the call once, as it ends: at what it reported, or at
// what it reserved when it reported nothing. Of a stream's reservations
// only the last is settled, at the actual cost less what the others
// reserved: they settle at their own size, which changes nothing. The
// settle outlives the call's context (its deadline may be what ended it).
// It reports the settle to the observer (ReasonSettled).
func (m *meter) settle() {
	s := m.state.Swap(sealed)
	if s == sealed {
		return
	}
	m.mu.Lock() // a chunk in flight on another goroutine comes first
	defer m.mu.Unlock()
	l := m.l
	actual := m.covered
	res := m.rsv.Result
	var uncharged int64
	var settleErr error
	// fresh: the store settled, and res is the bucket after the settle,
	// not as the reservation left it.
	fresh := false
	if s > 0 {
		actual = s - 1
		n := toInt(max(actual-m.before, 0))
		var err error
		res, err = m.rsv.Settle(&m.done, n)
		fresh = err == nil && n != m.rsv.Tokens()
		if err != nil {
			if uncharged = unchargedBy(err); uncharged > 0 {
				fresh = true
			} else {
				settleErr = err
			}
		}
	}
	if l.o.observer == nil {
		return
	}
	e := Event{Context: m.ctx, Settled: actual, Uncharged: uncharged}
	l.event(m.v, ReasonSettled, true, &e)
	e.Reserved, e.InvalidCosts, e.Err = m.covered, int(m.invalid.Load()), settleErr
	e.Source, e.Metered = res.Source, floodgate.Result{}
	if fresh {
		e.Metered = res
	}
	l.o.observer(e)
}

// unchargedBy returns the units a settle's error reports not charged (a
// floodgate.DebtLimitError), or 0. It unwraps by hand: errors.As would
// move its target to the heap on every settle.
func unchargedBy(err error) int64 {
	for err != nil {
		if dl, ok := err.(*floodgate.DebtLimitError); ok {
			return int64(dl.Uncharged)
		}
		err = errors.Unwrap(err)
	}
	return 0
}

// release gives back the whole reservation of a call that did not run
// (the overload controller shed it, or its context ended while it waited).
func (m *meter) release() {
	if m.state.Swap(sealed) == sealed {
		return
	}
	_, _ = m.rsv.Settle(&m.done, 0)
}
