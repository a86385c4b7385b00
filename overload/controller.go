package overload

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/floodgate-go/floodgate"
)

// ErrShed is wrapped by every [ShedError]: errors.Is(err, ErrShed) tells a
// call the controller turned away from one its context ended.
var ErrShed = errors.New("overload: shed")

// ShedCause says why a call was shed.
type ShedCause uint8

const (
	// ShedQueueFull: every slot was taken, the queue was full, and the call's
	// flow was at least as far over its fair share as any waiting flow.
	ShedQueueFull ShedCause = iota
	// ShedDisplaced: the call waited, and a call of a flow further under its
	// fair share (or of a higher priority) took its place in the full queue.
	ShedDisplaced
	// ShedTimeout: the call waited for a slot for the longest wait.
	ShedTimeout
	// ShedDeadline: the call's deadline was too close for it to complete
	// even without waiting.
	ShedDeadline
	// ShedRate: calls queue before they reach the controller, so it limits
	// the rate of admissions, and the call's flow had used its fair share
	// of that rate.
	ShedRate
	// ShedLate: while the admission rate is limited, the call had waited
	// longer than Law.MaxQueueDelay to reach the controller.
	ShedLate
	// ShedTap: a tap handle turned the call away before the controller saw
	// it, because Overloaded said it would be shed.
	ShedTap
	nShedCauses
)

var shedNames = [...]string{"queue_full", "displaced", "wait_timeout", "deadline", "rate", "late", "tap"}

// String returns the cause's lower-case name, such as "queue_full", fit for
// a metric label.
func (s ShedCause) String() string {
	if int(s) < len(shedNames) {
		return shedNames[s]
	}
	return "unknown"
}

// A ShedError is the error of a call the controller shed. It wraps
// [ErrShed].
type ShedError struct {
	Cause ShedCause
	// RetryAfter is a hint of when capacity may be free again.
	RetryAfter time.Duration
}

func (e *ShedError) Error() string { return "overload: shed (" + e.Cause.String() + ")" }

// Unwrap returns ErrShed.
func (e *ShedError) Unwrap() error { return ErrShed }

type arrivalKey struct{}

// Arrived returns ctx marked with the time its call arrived at the server,
// before anything queued it: a gRPC tap handle's time (middleware's
// TapHandle does this). The controller measures how long calls wait
// between arrival and Acquire, the queueing delay that shows a saturated
// CPU (see [Law.QueueTarget]). Without it, only the concurrency limit
// protects the server.
func Arrived(ctx context.Context, at time.Time) context.Context {
	return context.WithValue(ctx, arrivalKey{}, at)
}

// Arrive returns ctx marked with the controller's clock's time as its
// call's arrival: Arrived(ctx, now).
func (c *Controller) Arrive(ctx context.Context) context.Context {
	return Arrived(ctx, c.o.now())
}

// arrival returns the time Arrived marked ctx with.
func arrival(ctx context.Context) (time.Time, bool) {
	at, ok := ctx.Value(arrivalKey{}).(time.Time)
	return at, ok
}

// Priority orders calls when the controller must shed: a waiting call of a
// higher priority is admitted before any of a lower one, and the queue makes
// room for it by displacing the lowest. Within a priority, fairness decides.
type Priority int8

const (
	// Sheddable calls (batch jobs, prefetches, retries that can wait) are
	// shed first.
	Sheddable Priority = -1
	// Default is the priority of calls nobody ranked.
	Default Priority = 0
	// Critical calls (interactive, user-facing) are shed last.
	Critical Priority = 1
)

const nPriorities = 3

func (p Priority) index() int { return int(p) + 1 }

var priorityNames = [...]string{"sheddable", "default", "critical"}

// String returns the priority's lower-case name, such as "critical".
func (p Priority) String() string {
	if p >= Sheddable && p <= Critical {
		return priorityNames[p.index()]
	}
	return "unknown"
}

// ParsePriority returns the priority named s ("sheddable", "default" or
// "critical"; "" is Default), and false for any other name.
func ParsePriority(s string) (Priority, bool) {
	if s == "" {
		return Default, true
	}
	for i, n := range priorityNames {
		if n == s {
			return Priority(i - 1), true
		}
	}
	return Default, false
}

// A Flow says whose a call is, for fairness: calls of one Key share a fair
// share of the server in proportion to Weight.
type Flow struct {
	// Key names the flow: a tenant, or an anonymous caller's address. The
	// controller keeps it only while the flow has calls in flight or
	// waiting, so it must not be a buffer the caller reuses.
	Key string
	// Weight is the flow's share relative to other flows; ≤ 0 means 1.
	Weight float64
	// Priority ranks the call (see [Priority]).
	Priority Priority
}

// State is the controller's regime.
type State uint8

const (
	// Open: nothing has been shed for a second.
	Open State = iota
	// Shedding: calls are being shed.
	Shedding
)

var stateNames = [...]string{"open", "shedding"}

// String returns the state's lower-case name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// openAfter is how long the controller sheds nothing before it is Open
// again: long enough that the lulls of a sustained overload do not show as
// changes of state, short enough that a dashboard sees the end of one.
const openAfter = time.Second

// A Snapshot is the controller's observable state.
type Snapshot struct {
	// State is the regime and Since when it began.
	State State
	Since time.Time
	// Limit is the concurrency limit in force (during a probe, the probe's
	// limit), Inflight the calls holding a slot and Queued those waiting.
	Limit    float64
	Inflight int
	Queued   int
	// Probing reports a baseline probe in progress.
	Probing bool
	// Cause is what set the limit last.
	Cause Cause
	// RTT is the mean latency of the calls completed in the last control
	// interval, Baseline the latency of a call that does not queue, as
	// last probed, QueueDelay the mean wait of the interval's calls from
	// their arrival to the controller (see Arrived), and Wait the mean
	// wait for a slot of the calls that waited (0 when none did).
	RTT, Baseline, QueueDelay, Wait time.Duration
	// QueueTarget is the queueing delay the admission rate steers to
	// (see [Law.Target]).
	QueueTarget time.Duration
	// Rate is the admission rate in calls per second, 0 when admissions
	// are not rate-limited, and RateCause what set or lifted it last.
	Rate      float64
	RateCause Cause
	// Capacity is what the server completed per second while its
	// queueing delay was over the target, smoothed: the controller's
	// estimate of how many calls per second the server can complete,
	// which bounds the rate's growth ([Control.Saturated]). 0 until the
	// delay first exceeds the target.
	Capacity float64
	// CPU and SchedP99 are the guard's latest readings (WithGuard); 0
	// without a guard.
	CPU      float64
	SchedP99 time.Duration
	// Admitted counts admitted calls, Waited those of them that waited for
	// a slot, and Shed the shed calls by cause, since the controller was
	// made.
	Admitted, Waited uint64
	Shed             [nShedCauses]uint64
}

// ShedTotal returns the shed calls of every cause.
func (s Snapshot) ShedTotal() uint64 {
	var n uint64
	for _, v := range s.Shed {
		n += v
	}
	return n
}

// A Controller admits calls up to an adaptive concurrency limit, the number
// of calls the server completes without queueing them, and makes the rest
// wait briefly for a slot or sheds them. Its limit follows the latency of
// the calls it admits (see [Law]); it is never told the server's capacity.
//
// When calls must wait, slots go to the highest priority first and, within
// a priority, to the flow with the fewest calls in flight for its weight;
// when the queue is full, the flow furthest over its fair share loses its
// newest waiting call. So a tenant under its fair share keeps its calls
// while another floods, and a flood takes whatever capacity the others
// leave.
//
// Make one with [New]; it is safe for concurrent use and starts no
// goroutine: the limit is updated by the calls themselves, at most once per
// [Law.Interval]. The zero Controller is not usable.
type Controller struct {
	law Law
	o   options

	mu       sync.Mutex
	ctl      Control
	inflight int
	queued   int
	flows    map[flowKey]*flow
	free     []*flow
	active   [nPriorities][]*flow // flows with waiting calls, by priority
	weights  float64              // sum of the weights of the flows in flows
	gen      uint64               // increments when a probe starts

	// Since the last step.
	n                int
	sum              time.Duration
	probeN           int
	probeSum         time.Duration
	binding          bool
	shedInterval     int
	waitSum          time.Duration
	waitN            int
	lastRTT, lastQD  time.Duration
	arrSum           time.Duration // queueing delays before the controller
	arrN             int
	rateShed         int
	lastArr          time.Duration
	level            float64   // water level of the rate's fair shares, per unit of weight
	spare            float64   // tokens the flows' full buckets overflowed with, for any flow
	pending          event     // a step's event, emitted by shedLocked
	onsetAt          time.Time // the latest early step (Law.Onset)
	lastShed         time.Time
	state            State
	since            time.Time
	cpu              float64
	sched            time.Duration
	admitted, waited uint64
	stepAdmitted     uint64 // admitted at the last step
	shed             [nShedCauses]uint64
}

type flowKey struct {
	key  string
	prio Priority
}

type flow struct {
	k        flowKey
	weight   float64
	inflight int
	q        []*waiter
	// arrivals counts the flow's calls since the last step; the rate's
	// fair share of the flow, alloc calls per second, fills tokens, the
	// flow's bucket, up to burst, as of at.
	arrivals int
	demand   float64 // arrivals per second, smoothed over about a second
	alloc    float64
	tokens   float64
	at       time.Time
}

// maxFlows bounds the flows the controller tracks: calls of further flows
// (a flood of made-up addresses) share one.
const maxFlows = 1 << 14

// overflowKey is the flow of calls beyond maxFlows.
const overflowKey = "\x00overflow"

type waiter struct {
	ch       chan struct{}
	f        *flow
	at       time.Time
	granted  bool
	evicted  bool
	grantAt  time.Time
	grantGen uint64
}

type options struct {
	law      Law
	logger   *slog.Logger
	guard    Guard
	now      func() time.Time
	maxWait  time.Duration
	retry    time.Duration
	errs     []error
	onChange func(Snapshot)
}

// An Option configures a [Controller].
type Option func(*options)

// WithLaw sets the control law; [New] validates it. The zero Law is the
// default. A repeated call replaces the law.
func WithLaw(l Law) Option { return func(o *options) { o.law = l } }

// WithLogger sets the logger for the controller's events, each with the
// signals that drove it (latency, baseline, queueing delay, in-flight
// calls and limit, and the guard's CPU and scheduler readings): entering
// Shedding at Warn, back to Open and each probe's result at Info, every
// change of the limit at Debug. A nil logger, the default, logs nothing. A
// repeated call replaces the logger.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// A Guard supplies CPU readings: the latest fraction of the CPU available
// to this process that was busy, and the 99th percentile of goroutine
// scheduling latency (0 when not measured). A running *cpugate.Gate is
// one.
//
// A Guard that also has a method Current() (cpu float64, ok bool), the
// CPU use since its latest reading, is asked for it when a queueing delay
// over its target meets a reading below [Law.RateCPU], or 0 (none yet): a
// reading up to an interval old may predate the queue, and a burst that
// begins just after it would otherwise wait for the next reading before a
// rate is set. A *cpugate.Gate has it when its sampler is a
// cpugate.Peeker, as the cgroup and process samplers are.
type Guard interface {
	Reading() (cpu float64, schedP99 time.Duration)
}

// currentGuard is a [Guard] that reads the CPU use since its latest
// reading (see Guard).
type currentGuard interface {
	Current() (cpu float64, ok bool)
}

// GuardFunc adapts a function to a [Guard].
type GuardFunc func() (float64, time.Duration)

// Reading returns f().
func (f GuardFunc) Reading() (float64, time.Duration) { return f() }

// WithGuard sets where the controller reads the CPU: its readings go into
// log lines and snapshots, so that an operator can tell a server that is
// slow because it is busy from one that is slow for other reasons; a
// reading below [Law.RateCPU] keeps a queueing delay from setting a rate
// (the wait is someone else's), one at or above [Law.SaturatedCPU] holds
// a rate the queueing delay has set and, above it, trims that rate, and
// [Law.GuardCPU] acts on them when set.
// Pass a running cpugate.Gate (only its readings are used, not its
// scale). A nil guard, the default, means no CPU readings. A repeated call
// replaces it.
func WithGuard(g Guard) Option { return func(o *options) { o.guard = g } }

// WithClock sets the clock, for tests; the default reads time.Now. A
// repeated call replaces it.
func WithClock(c floodgate.Clock) Option {
	return func(o *options) {
		if c == nil {
			o.errs = append(o.errs, invalid("WithClock", "nil", "a clock"))
			return
		}
		o.now = c.Now
	}
}

// WithMaxWait sets the longest a call waits for a slot before it is shed.
// The default, 0, is four times the baseline (before the first probe ends,
// 50 ms), between 1 ms and 100 ms: long enough to keep the server busy
// between arrivals, short enough that an admitted call's latency stays a
// few times its baseline. A call also never waits past the point where its
// deadline leaves less than the baseline to run. A repeated call replaces
// the wait.
func WithMaxWait(d time.Duration) Option {
	return duration("WithMaxWait", d, func(o *options) *time.Duration { return &o.maxWait })
}

// duration returns an option that sets the duration field returns to d,
// or records an error naming the option when d is negative.
func duration(name string, d time.Duration, field func(*options) *time.Duration) Option {
	return func(o *options) {
		if d < 0 {
			o.errs = append(o.errs, invalid(name, d, "0 (the default) or a positive duration"))
			return
		}
		*field(o) = d
	}
}

// WithRetryAfter sets the retry delay a shed call is given (ShedError's
// RetryAfter). The default, 0, is two control intervals. A repeated call
// replaces it.
func WithRetryAfter(d time.Duration) Option {
	return duration("WithRetryAfter", d, func(o *options) *time.Duration { return &o.retry })
}

// WithOnChange sets a function called after every change of state or of
// the limit, with the new snapshot, outside the controller's lock, from
// the goroutine of the call that caused it. It should return quickly. A
// repeated call replaces it; nil removes it.
func WithOnChange(f func(Snapshot)) Option { return func(o *options) { o.onChange = f } }

// New returns a Controller. It returns an error wrapping
// [floodgate.ErrInvalidOption], naming the option or field, when the configuration
// is invalid.
func New(opts ...Option) (*Controller, error) {
	o := options{now: time.Now}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := errors.Join(o.errs...); err != nil {
		return nil, err
	}
	if err := o.law.Validate(); err != nil {
		return nil, err
	}
	c := &Controller{law: o.law.withDefaults(), o: o, flows: make(map[flowKey]*flow)}
	if c.o.retry == 0 {
		c.o.retry = 2 * c.law.Interval
	}
	c.ctl = c.law.Step(Control{}, Sample{}, o.now())
	c.since = c.ctl.LastStep
	return c, nil
}

// Law returns the controller's law, with its defaults filled in.
func (c *Controller) Law() Law { return c.law }

// A Permit is an admitted call's slot. Call Done exactly once, when the
// call ends; the zero Permit's Done does nothing.
type Permit struct {
	c     *Controller
	f     *flow
	start time.Time
	gen   uint64
}

// Acquire admits a call of flow f, waiting for a slot if the limit is
// reached, or sheds it. It returns a Permit whose Done must be called when
// the call ends, or a *[ShedError], or ctx's error when ctx ends while the
// call waits. It waits at most the controller's longest wait
// (WithMaxWait), and never once ctx's deadline leaves less than the
// baseline latency.
func (c *Controller) Acquire(ctx context.Context, f Flow) (Permit, error) {
	now := c.o.now()
	at, known := arrival(ctx)
	c.mu.Lock()
	if known {
		c.arrSum += max(0, now.Sub(at))
		c.arrN++
		if now.Sub(c.onsetAt) >= c.law.Interval && c.law.Onset(c.ctl, c.n, c.arrN, c.arrSum/time.Duration(c.arrN), now) {
			// A queue building within an interval: step now, once an
			// interval at most (a neighbour's wait sets no rate).
			c.onsetAt = now
			ev := c.step(now)
			c.mu.Unlock()
			c.emit(ev)
			c.mu.Lock()
		}
	}
	fl := c.flow(f)
	fl.arrivals++
	if c.ctl.Rate > 0 {
		held := claim(ctx, fl)
		if known && now.Sub(at) > c.law.MaxDelay(c.ctl) && fl.demand > fl.alloc {
			// Late already, and of a flow asking more than its share:
			// serving it would make the calls behind it late too.
			// Shedding it drains the queue. A flow within its share
			// keeps its calls, late or not, and a shed call's token
			// goes back to its flow.
			if held {
				fl.tokens++
			}
			return Permit{}, c.shedLocked(fl, ShedLate, now)
		}
		if !held && !c.take(fl, now) {
			c.rateShed++
			if c.law.Due(c.ctl, c.n, now) {
				// No call may complete for a while at a low rate.
				c.pending = c.step(now)
			}
			return Permit{}, c.shedLocked(fl, ShedRate, now)
		}
	}
	if c.queued == 0 && c.inflight < c.slots() {
		c.grant(fl)
		c.admitted++
		p := Permit{c: c, f: fl, start: now, gen: c.gen}
		c.mu.Unlock()
		return p, nil
	}
	c.binding = true
	wait := c.maxWait()
	if dl, ok := ctx.Deadline(); ok {
		left := dl.Sub(now) - c.ctl.Baseline
		if left <= 0 {
			return Permit{}, c.shedLocked(fl, ShedDeadline, now)
		}
		wait = min(wait, left)
	}
	if c.queued >= c.queueCap() {
		v := c.victim(fl)
		if v == nil {
			return Permit{}, c.shedLocked(fl, ShedQueueFull, now)
		}
		c.evict(v)
	}
	w := &waiter{ch: make(chan struct{}, 1), f: fl, at: now}
	c.enqueue(w)
	c.mu.Unlock()

	t := time.NewTimer(wait)
	var ctxErr error
	select {
	case <-w.ch:
	case <-ctx.Done():
		ctxErr = ctx.Err()
	case <-t.C:
	}
	t.Stop()

	c.mu.Lock()
	switch {
	case w.granted && ctxErr == nil:
		c.admitted++
		c.waited++
		c.mu.Unlock()
		return Permit{c: c, f: fl, start: w.grantAt, gen: w.grantGen}, nil
	case w.granted:
		// Admitted as the context ended: give the slot to the next.
		c.release(fl)
		c.dispatch(c.o.now())
		c.mu.Unlock()
		return Permit{}, ctxErr
	case w.evicted:
		return Permit{}, c.shedLocked(fl, ShedDisplaced, c.o.now())
	}
	c.dequeue(w)
	if ctxErr != nil {
		c.drop(fl)
		c.mu.Unlock()
		return Permit{}, ctxErr
	}
	return Permit{}, c.shedLocked(fl, ShedTimeout, c.o.now())
}

// Done ends the call: its slot goes to the next waiting call, and its
// latency to the control law.
func (p Permit) Done() {
	c := p.c
	if c == nil {
		return
	}
	now := c.o.now()
	rtt := now.Sub(p.start)
	c.mu.Lock()
	c.release(p.f)
	c.n++
	c.sum += rtt
	if c.ctl.Probing && p.gen == c.gen {
		c.probeN++
		c.probeSum += rtt
	}
	var ev event
	if c.law.Due(c.ctl, c.n, now) {
		ev = c.step(now)
	}
	c.dispatch(now)
	c.mu.Unlock()
	c.emit(ev)
}

// take takes a token from fl's share of the admission rate, refilled at
// its fair share, or else one its flows' full buckets left unused (spare).
func (c *Controller) take(fl *flow, now time.Time) bool {
	c.refill(fl, now)
	switch {
	case fl.tokens >= 1:
		fl.tokens--
	case c.spare >= 1:
		c.spare--
	default:
		return false
	}
	return true
}

func (c *Controller) refill(fl *flow, now time.Time) {
	if dt := now.Sub(fl.at); dt > 0 {
		// A bucket holds what its share admits in the queueing target, at
		// least two calls: a burst admitted at once queues no longer than
		// the target, and a quiet flow's Poisson arrivals fit. What a full
		// bucket would overflow with goes to the spare tokens, bounded
		// alike by what the whole rate admits in the target: a flow within
		// its share keeps its own tokens, and the share it leaves unused
		// goes to the flows that ask for more instead of to nobody.
		burst := c.bucket(fl.alloc)
		t := fl.tokens + fl.alloc*dt.Seconds()
		if t > burst {
			c.spare = min(c.bucket(c.ctl.Rate), c.spare+t-burst)
			t = burst
		}
		fl.tokens, fl.at = t, now
	}
}

// bucket returns the most tokens a bucket refilled at rate holds: what the
// rate admits in the queueing target, at least two calls.
func (c *Controller) bucket(rate float64) float64 {
	return max(2, rate*c.law.Target(c.ctl).Seconds())
}

// Overloaded reports whether a call of flow f, whose context is ctx, would
// be shed now, and is meant for a tap handle, which can turn such a call
// away before its request is read: it has used its flow's share of a
// limited admission rate, or every slot is taken, the queue is full, and
// f holds at least its fair share of the slots and the queue. A call it
// reports true for is counted as shed (cause ShedTap) and in its flow's
// demand, which the fair shares must see: turn it away.
//
// A call it lets pass while the rate is limited takes its token from its
// flow's share here, and the context returned marks it, so that Acquire
// takes no second: a server that reads many calls' headers at once (as a
// starved one does) then lets through no more of them than the rate
// allows, instead of every one that finds the same last token, only to
// shed the rest after reading their requests. Pass the returned context
// on (a gRPC tap handle returns it for the call): Acquire spends its mark
// once, and gives the token back if it sheds the call as late.
//
// It never waits for the controller's lock: when another call holds it,
// it reports false and leaves the call to Acquire.
func (c *Controller) Overloaded(ctx context.Context, f Flow) (context.Context, bool) {
	if !c.mu.TryLock() {
		return ctx, false
	}
	defer c.mu.Unlock()
	fl, ok := c.flows[flowKey{f.Key, f.Priority}]
	if !ok {
		return ctx, false
	}
	now := c.o.now()
	if c.inflight >= c.slots() && c.queued >= c.queueCap() {
		share := float64(c.slots()+c.queueCap()) * fl.weight / c.weights
		if float64(fl.inflight+len(fl.q)+1) > share {
			c.tapShed(fl, now)
			return ctx, true
		}
	}
	if c.ctl.Rate == 0 {
		return ctx, false
	}
	if !c.take(fl, now) {
		// The rate binds.
		c.rateShed++
		c.tapShed(fl, now)
		return ctx, true
	}
	return context.WithValue(ctx, reservedKey{}, &reservation{fl}), false
}

// tapShed counts a call of fl that Overloaded turned away: in its flow's
// demand (Acquire never sees it) and in the shed calls.
func (c *Controller) tapShed(fl *flow, now time.Time) {
	fl.arrivals++
	c.shed[ShedTap]++
	c.shedInterval++
	c.lastShed = now
}

// reservedKey marks a call's context with the token Overloaded took for
// it: a *reservation.
type reservedKey struct{}

// A reservation is a token Overloaded took from fl's share; claim spends
// it once.
type reservation struct{ fl *flow }

// claim reports whether Overloaded took ctx's call's token from fl, and
// spends the reservation, so that a context passed on cannot admit a
// second call on it. c.mu must be held.
func claim(ctx context.Context, fl *flow) bool {
	r, _ := ctx.Value(reservedKey{}).(*reservation)
	if r == nil || r.fl != fl {
		return false
	}
	r.fl = nil
	return true
}

// Full reports whether calls are being shed for want of capacity: the
// admission rate is limited, or every slot is taken and the queue is full.
// It is meant as a cheap first test before Overloaded, and like it never
// waits for the lock.
func (c *Controller) Full() bool {
	if !c.mu.TryLock() {
		return false
	}
	defer c.mu.Unlock()
	return c.ctl.Rate > 0 || (c.inflight >= c.slots() && c.queued >= c.queueCap())
}

// RetryAfter returns the retry delay shed calls are given (WithRetryAfter).
func (c *Controller) RetryAfter() time.Duration { return c.o.retry }

// Shedding reports whether the controller is in the Shedding state.
func (c *Controller) Shedding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == Shedding
}

// Snapshot returns the controller's observable state.
func (c *Controller) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshotLocked()
}

func (c *Controller) snapshotLocked() Snapshot {
	return Snapshot{
		State: c.state, Since: c.since,
		Limit: c.ctl.Limit, Inflight: c.inflight, Queued: c.queued,
		Probing: c.ctl.Probing, Cause: c.ctl.Cause,
		RTT: c.lastRTT, Baseline: c.ctl.Baseline, QueueDelay: c.lastArr, Wait: c.lastQD,
		QueueTarget: c.law.Target(c.ctl),
		Rate:        c.ctl.Rate, RateCause: c.ctl.RateCause, Capacity: c.ctl.Saturated,
		CPU: c.cpu, SchedP99: c.sched,
		Admitted: c.admitted, Waited: c.waited, Shed: c.shed,
	}
}

// slots returns the limit as a count of calls, at least 1.
func (c *Controller) slots() int { return max(1, int(c.ctl.Limit)) }

// queueCap returns how many calls may wait: as many as may run, at least
// 4, so that the server finds a call waiting whenever one completes.
func (c *Controller) queueCap() int { return max(4, int(math.Ceil(c.ctl.Limit))) }

func (c *Controller) maxWait() time.Duration {
	d := c.o.maxWait
	switch {
	case d > 0:
	case c.ctl.Baseline == 0:
		d = 50 * time.Millisecond
	default:
		d = min(100*time.Millisecond, max(time.Millisecond, 4*c.ctl.Baseline))
	}
	if c.ctl.Probing {
		// A probe admits nothing until the calls admitted before it have
		// drained: waiting calls are given that long too, so that a
		// probe delays calls rather than shedding them.
		d += 2 * c.lastRTT
	}
	return d
}

// flow returns f's flow, making it if needed.
func (c *Controller) flow(f Flow) *flow {
	k := flowKey{f.Key, f.Priority}
	if fl, ok := c.flows[k]; ok {
		return fl
	}
	if len(c.flows) >= maxFlows {
		k.key = overflowKey
		if fl, ok := c.flows[k]; ok {
			return fl
		}
	}
	var fl *flow
	if n := len(c.free); n > 0 {
		fl, c.free = c.free[n-1], c.free[:n-1]
	} else {
		fl = new(flow)
	}
	w := f.Weight
	if !(w > 0) || math.IsInf(w, 0) {
		w = 1
	}
	fl.k, fl.weight, fl.inflight, fl.arrivals, fl.demand = k, w, 0, 0, 0
	// A flow new under a rate limit gets the share of a flow at the water
	// level, and a bucket to match.
	fl.alloc = c.alloc(w)
	fl.tokens, fl.at = 1, c.o.now()
	c.flows[k] = fl
	c.weights += w
	return fl
}

// idle reports whether fl may be forgotten: nothing in flight or waiting,
// no call since the last step, and, while the rate is limited, a demand
// decayed below forgetBelow. A flow still busy or asking is left to the
// step, which forgets it once it is idle.
func (c *Controller) idle(fl *flow) bool {
	return fl.inflight == 0 && len(fl.q) == 0 && fl.arrivals == 0 &&
		(c.ctl.Rate == 0 || fl.demand < forgetBelow)
}

// drop forgets fl if it is idle.
func (c *Controller) drop(fl *flow) {
	if fl == nil || !c.idle(fl) || c.flows[fl.k] != fl {
		return
	}
	delete(c.flows, fl.k)
	c.weights -= fl.weight
	if len(c.flows) == 0 {
		c.weights = 0 // no drift from float sums
	}
	fl.q = fl.q[:0]
	fl.k = flowKey{}
	if len(c.free) < 64 {
		c.free = append(c.free, fl)
	}
}

func (c *Controller) grant(fl *flow) {
	fl.inflight++
	c.inflight++
}

func (c *Controller) release(fl *flow) {
	fl.inflight--
	c.inflight--
	c.drop(fl)
}

func (c *Controller) enqueue(w *waiter) {
	fl := w.f
	if len(fl.q) == 0 {
		i := fl.k.prio.index()
		c.active[i] = append(c.active[i], fl)
	}
	fl.q = append(fl.q, w)
	c.queued++
}

// dequeue removes w from its flow's queue.
func (c *Controller) dequeue(w *waiter) {
	fl := w.f
	for i, x := range fl.q {
		if x == w {
			copy(fl.q[i:], fl.q[i+1:])
			fl.q[len(fl.q)-1] = nil
			fl.q = fl.q[:len(fl.q)-1]
			c.queued--
			break
		}
	}
	if len(fl.q) == 0 {
		c.deactivate(fl)
	}
}

func (c *Controller) deactivate(fl *flow) {
	a := c.active[fl.k.prio.index()]
	for i, x := range a {
		if x == fl {
			a[i] = a[len(a)-1]
			a[len(a)-1] = nil
			c.active[fl.k.prio.index()] = a[:len(a)-1]
			return
		}
	}
}

// dispatch hands free slots to waiting calls: the highest priority first,
// then the flow with the fewest calls in flight for its weight, the one
// waiting longest on a tie.
func (c *Controller) dispatch(now time.Time) {
	for c.queued > 0 && c.inflight < c.slots() {
		var best *flow
		for i := nPriorities - 1; i >= 0 && best == nil; i-- {
			for _, fl := range c.active[i] {
				if best == nil {
					best = fl
					continue
				}
				a, b := float64(fl.inflight)/fl.weight, float64(best.inflight)/best.weight
				if a < b || (a == b && fl.q[0].at.Before(best.q[0].at)) {
					best = fl
				}
			}
		}
		w := best.q[0]
		c.dequeue(w)
		c.grant(best)
		w.granted, w.grantAt, w.grantGen = true, now, c.gen
		c.waitSum += now.Sub(w.at)
		c.waitN++
		w.ch <- struct{}{}
	}
}

// victim returns the flow that should lose a waiting call so that a call
// of fl can wait, or nil when fl's call should be shed instead: the lowest
// priority first, then the flow holding the most slots and queue places
// for its weight. A flow no further under its share than the victim does
// not displace it.
func (c *Controller) victim(fl *flow) *flow {
	for i := 0; i < nPriorities; i++ {
		var worst *flow
		var worstLoad float64
		for _, v := range c.active[i] {
			if l := float64(v.inflight+len(v.q)) / v.weight; worst == nil || l > worstLoad {
				worst, worstLoad = v, l
			}
		}
		if worst == nil {
			continue
		}
		if p := fl.k.prio.index(); p != i {
			if p > i {
				return worst
			}
			return nil
		}
		if float64(fl.inflight+len(fl.q)+1)/fl.weight < worstLoad && worst != fl {
			return worst
		}
		return nil
	}
	return nil
}

// evict displaces v's newest waiting call.
func (c *Controller) evict(v *flow) {
	w := v.q[len(v.q)-1]
	c.dequeue(w)
	w.evicted = true
	w.ch <- struct{}{}
}

// shedLocked counts a shed call of cause, forgets fl if it is empty,
// unlocks, logs a change of state and returns the error.
func (c *Controller) shedLocked(fl *flow, cause ShedCause, now time.Time) error {
	c.shed[cause]++
	c.shedInterval++
	c.lastShed = now
	c.drop(fl)
	pending := c.pending
	c.pending = event{}
	var ev event
	if c.state != Shedding {
		ev = c.transition(Shedding, now)
	}
	c.mu.Unlock()
	c.emit(pending)
	c.emit(ev)
	return &ShedError{Cause: cause, RetryAfter: c.o.retry}
}

// event is what to log and report after the lock is released.
type event struct {
	snap         Snapshot
	state, limit bool
	probeEnded   bool
}

func (c *Controller) transition(to State, now time.Time) event {
	ev := event{state: true}
	c.state, c.since = to, now
	ev.snap = c.snapshotLocked()
	return ev
}

// step feeds the control law the sample since the last step.
func (c *Controller) step(now time.Time) event {
	s := Sample{N: c.n, ProbeN: c.probeN, Binding: c.binding, QN: c.arrN, RateShed: c.rateShed, Admitted: int(c.admitted - c.stepAdmitted)}
	c.stepAdmitted = c.admitted
	if c.arrN > 0 {
		s.QueueDelay = c.arrSum / time.Duration(c.arrN)
		c.lastArr = s.QueueDelay
	}
	dt := now.Sub(c.ctl.LastStep)
	if c.n > 0 {
		s.RTT = c.sum / time.Duration(c.n)
	}
	if c.probeN > 0 {
		s.ProbeRTT = c.probeSum / time.Duration(c.probeN)
	}
	if g := c.o.guard; g != nil {
		c.cpu, c.sched = g.Reading()
		s.CPU = c.cpu
		if cg, ok := g.(currentGuard); ok && c.law.lowCPUHolds(c.ctl, s) {
			// A peek reads a counter (a cgroup file, or getrusage), a
			// few microseconds, and happens only while a queue meets a
			// low reading without a rate in force.
			if v, ok := cg.Current(); ok && v > s.CPU {
				c.cpu, s.CPU = v, v
			}
		}
	}
	prev := c.ctl
	c.ctl = c.law.Step(prev, s, now)
	if c.ctl.Probing && !prev.Probing {
		c.gen++
		c.probeN, c.probeSum = 0, 0
	}
	if s.N > 0 {
		c.lastRTT = s.RTT
	}
	c.lastQD = 0
	if c.waitN > 0 {
		c.lastQD = c.waitSum / time.Duration(c.waitN)
	}
	shed := c.shedInterval
	c.n, c.sum, c.binding, c.shedInterval, c.waitSum, c.waitN = 0, 0, false, 0, 0, 0
	c.share(dt, now)
	c.arrSum, c.arrN, c.rateShed = 0, 0, 0

	var ev event
	if shed > 0 {
		c.lastShed = now
	}
	switch {
	case c.state == Shedding && now.Sub(c.lastShed) >= openAfter:
		ev = c.transition(Open, now)
	case c.state == Open && shed > 0:
		ev = c.transition(Shedding, now)
	}
	ev.limit = c.ctl.Limit != prev.Limit || (c.ctl.Rate == 0) != (prev.Rate == 0)
	ev.probeEnded = prev.Probing && !c.ctl.Probing
	if ev.limit || ev.probeEnded {
		ev.snap = c.snapshotLocked()
	}
	return ev
}

// emit logs an event and reports it, outside the lock.
func (c *Controller) emit(ev event) {
	if !ev.state && !ev.limit && !ev.probeEnded {
		return
	}
	if l := c.o.logger; l != nil {
		s := ev.snap
		cause := s.Cause
		if s.Rate > 0 || s.RateCause == CauseNotOurs {
			cause = s.RateCause
		}
		attrs := []slog.Attr{
			slog.String("decided_by", cause.String()),
			slog.Duration("queue_delay", s.QueueDelay),
			slog.Duration("queue_target", s.QueueTarget),
			slog.Float64("rate", math.Round(s.Rate)),
			slog.Float64("limit", math.Round(s.Limit*10)/10),
			slog.Int("inflight", s.Inflight),
			slog.Int("queued", s.Queued),
			slog.Duration("wait", s.Wait),
			slog.Duration("rtt", s.RTT),
			slog.Duration("baseline", s.Baseline),
		}
		if c.o.guard != nil {
			attrs = append(attrs, slog.Float64("cpu", math.Round(s.CPU*1000)/1000), slog.Duration("sched_p99", s.SchedP99))
		}
		ctx := context.Background()
		switch {
		case ev.state && s.State == Shedding && s.Rate > 0:
			l.LogAttrs(ctx, slog.LevelWarn, "overload: shedding: calls wait too long to start, admissions are rate-limited", attrs...)
		case ev.state && s.State == Shedding:
			l.LogAttrs(ctx, slog.LevelWarn, "overload: shedding: the concurrency limit is reached and the queue is full", attrs...)
		case ev.state:
			l.LogAttrs(ctx, slog.LevelInfo, "overload: open: nothing shed for a second", attrs...)
		}
		switch {
		case ev.probeEnded:
			l.LogAttrs(ctx, slog.LevelInfo, "overload: baseline probed", attrs...)
		case ev.limit && s.RateCause == CauseNotOurs && s.Rate == 0:
			l.LogAttrs(ctx, slog.LevelWarn, "overload: rate lifted: cutting it did not shorten the queueing delay (another process holds the CPU?)", attrs...)
		case ev.limit && s.Probing:
			l.LogAttrs(ctx, slog.LevelDebug, "overload: probing the baseline", attrs...)
		case ev.limit:
			l.LogAttrs(ctx, slog.LevelDebug, "overload: limit changed", attrs...)
		}
	}
	if c.o.onChange != nil {
		c.o.onChange(ev.snap)
	}
}

// forgetBelow is the demand, in calls per second, below which a flow idle
// for a whole interval is forgotten while the admission rate is limited.
// A flow that merely had no call in one interval keeps its demand:
// forgotten, it would come back as a flow that asks nothing, and the fair
// shares would let every flow admit more than the rate.
const forgetBelow = 1.0

// share forgets the flows idle for the interval of length dt that ends at
// now (under a limited rate, once their demand has decayed below
// forgetBelow), and, while the admission rate is limited, divides it among
// the others by weighted max-min fairness over their arrival rates (smoothed
// over about a second): the water level is the share per unit of weight
// at which the flows asking less get what they ask and the others split
// the rest; every flow may then admit up to the level times its weight,
// so that a quiet flow's bursts fit in the share it does not use.
func (c *Controller) share(dt time.Duration, now time.Time) {
	type demand struct {
		fl   *flow
		rate float64 // demand per unit of weight
	}
	var ds []demand
	alpha := min(1, dt.Seconds())
	for _, fl := range c.flows {
		if dt > 0 {
			a := alpha
			if fl.demand == 0 {
				a = 1 // a new flow: its first interval is all there is
			}
			fl.demand += a * (float64(fl.arrivals)/dt.Seconds() - fl.demand)
		}
		if c.idle(fl) {
			c.drop(fl)
			continue
		}
		fl.arrivals = 0
		if c.ctl.Rate > 0 {
			c.refill(fl, now)
			ds = append(ds, demand{fl, fl.demand / fl.weight})
		}
	}
	if c.ctl.Rate == 0 {
		c.level, c.spare = 0, 0
		return
	}
	slices.SortFunc(ds, func(a, b demand) int { return cmp.Compare(a.rate, b.rate) })
	left, weights := c.ctl.Rate, 0.0
	for _, d := range ds {
		weights += d.fl.weight
	}
	level := math.Inf(1)
	for _, d := range ds {
		if d.rate*weights > left {
			level = left / weights
			break
		}
		left -= d.rate * d.fl.weight
		weights -= d.fl.weight
	}
	if math.IsInf(level, 1) {
		// The rate covers every flow's demand: every flow may admit up
		// to the largest demand per weight, scaled by the room the rate
		// leaves, so that the largest flow's bunched arrivals are not
		// shed; no flow more than the whole rate (see alloc).
		level = c.ctl.Rate
		if asked := c.ctl.Rate - left; asked > 0 && len(ds) > 0 {
			level = ds[len(ds)-1].rate * c.ctl.Rate / asked
		}
	}
	c.level = level
	for _, d := range ds {
		d.fl.alloc = c.alloc(d.fl.weight)
	}
}

// alloc returns the share of the admission rate of a flow of weight w at
// the water level: level × w, never more than the whole rate.
func (c *Controller) alloc(w float64) float64 { return min(c.ctl.Rate, c.level*w) }
