package overload

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/overload/internal/law"
)

// A Controller runs at most a concurrency limit of calls at once, queues
// the next few in the order of their flows' fair shares, and sheds the
// rest. The limit adapts to what the server completes; it is never told
// the server's capacity. See the package doc for the law.
//
// Make one with [New]; it is safe for concurrent use and starts no
// goroutine: the calls themselves update the limit when they complete.
// The zero Controller is not usable.
type Controller struct {
	o options

	mu       sync.Mutex
	st       law.State
	inflight int
	queued   int
	inside   int     // calls Enter let in that have not ended: queued anywhere, or running
	owed     int     // of those, places given up (the flows' owed summed)
	top      decayed // the most calls any flow was let in lately, per weight
	flows    map[flowKey]*flow
	weights  float64 // the weights of the flows remembered, summed
	holding  []*flow // the flows with calls inside
	idle     []*flow // from idle[idleHead]: flows to forget once idle for forgetAfter, oldest first
	idleHead int
	free     []*flow
	active   [nPriorities][]*flow // flows with waiting calls, by priority
	running  [nPriorities]int     // calls holding a slot, by priority
	vclock   [nPriorities]float64 // start-time fair queueing's virtual time

	// Since the latest step.
	n       int
	sum     time.Duration
	bound   bool
	waitSum time.Duration
	waitN   int

	wait                time.Duration // the latest step's mean wait
	lastShed            time.Time
	offered, shedLately decayed // calls offered (entered, or untapped at Acquire) and shed, lately
	state               State
	since               time.Time
	cpu                 float64
	sched               time.Duration
	admitted, waited    uint64
	shed                [nShedCauses]uint64
	untapped            atomic.Uint64
}

type flowKey struct {
	key  string
	prio floodgate.Priority
}

type flow struct {
	k        flowKey
	weight   float64
	inflight int
	inside   int       // the flow's calls Enter let in
	pending  int       // of those, calls that have not reached Acquire yet
	owed     int       // places it gave up to flows under their share: its next calls to reach Acquire are shed (at most pending)
	entered  decayed   // calls Enter let in lately: the flow's recent share
	offered  decayed   // calls of the flow offered lately
	born     time.Time // when the controller began to remember it
	last     time.Time // its latest call
	held     int       // the flow's index in holding, or -1
	listed   bool      // in idle
	q        []*waiter
	vt       float64 // virtual start time of the flow's next call
}

func (fl *flow) busy() bool { return fl.inflight > 0 || fl.inside > 0 || len(fl.q) > 0 }

// maxFlows bounds the flows the controller tracks: calls of further flows
// (a flood of made-up addresses) share one.
const maxFlows = 1 << 14

// forgetAfter is how long the controller remembers a flow none of whose
// calls is in the server: by then what it was let in and offered has
// decayed to a twentieth, and a flow that comes back starts afresh.
const forgetAfter = 3 * entryMemory

// overflowKey is the flow of calls beyond maxFlows.
const overflowKey = "\x00overflow"

// openAfter is how long the controller sheds nothing before it is Open
// again: long enough that the lulls of a sustained overload do not show as
// changes of state, short enough that a dashboard sees the end of one.
const openAfter = time.Second

type waiter struct {
	ch      chan struct{}
	f       *flow
	at      time.Time
	granted bool
	evicted bool
	grantAt time.Time
}

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
// for a slot at most twice the target. The default, 0, is 5 ms while calls
// are being shed and 25 ms otherwise, so that a server that is not
// overloaded absorbs a burst; one completion's worth when that is longer.
// A repeated call replaces it.
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

// New returns a Controller. It returns an error wrapping
// [floodgate.ErrInvalidOption], naming the option, when the configuration
// is invalid.
func New(opts ...Option) (*Controller, error) {
	o := options{now: time.Now}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.retry == 0 {
		o.retry = 2 * law.Interval
	}
	c := &Controller{o: o, flows: make(map[flowKey]*flow)}
	now := o.now()
	c.st = law.Start(c.bounds(), now)
	c.since = now
	return c, nil
}

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

// bounds returns the limit's bounds in force.
func (c *Controller) bounds() law.Bounds {
	b := law.Bounds{Min: float64(c.o.minLimit), Max: float64(c.o.maxLimit)}
	if b.Min == 0 {
		b.Min = float64(runtime.GOMAXPROCS(0))
	}
	if b.Max == 0 {
		b.Max = max(b.Min, law.MaxLimit)
	}
	return b
}

// A Permit is an admitted call's slot. Call Done exactly once, when the
// call ends; the zero Permit's Done does nothing.
type Permit struct {
	c      *Controller
	f      *flow
	start  time.Time
	inside *flow // the flow whose place Enter counted the call in, or nil
	wait   time.Duration
}

// Wait returns how long the call waited for its slot: 0 for a call
// admitted at once, and for the zero Permit.
func (p Permit) Wait() time.Duration { return p.wait }

// A ticket is a call's place among those Enter let in. The call gives it
// back when it ends; a call that never reaches Acquire (a quota rejection,
// an unknown method, a stream reset before its handler ran) gives it back
// when its stream's context ends.
type ticket struct {
	c    *Controller
	f    *flow
	stop func() bool // stops the context's release; true when it had not run
}

type ticketKey struct{}

// claim returns the flow the call of ctx holds a place of, the one Enter
// counted it in, taking over its release from the context; or nil.
func (c *Controller) claim(ctx context.Context) *flow {
	if t, _ := ctx.Value(ticketKey{}).(*ticket); t != nil && t.c == c && t.stop() {
		return t.f
	}
	return nil
}

// Leave gives back the place Enter counted for the call of ctx, for a call
// that will not Acquire: a stream, whose lifetime says nothing about load,
// must not hold a place while it lasts. It does nothing for a context
// Enter did not mark, and when called again.
func (c *Controller) Leave(ctx context.Context) {
	if in := c.claim(ctx); in != nil {
		c.mu.Lock()
		c.arrive(in)
		c.exit(in)
		c.mu.Unlock()
	}
}

// leave gives back a place Enter counted, for a call that never claimed it.
func (t *ticket) leave() {
	c := t.c
	c.mu.Lock()
	c.arrive(t.f)
	c.exit(t.f)
	c.mu.Unlock()
}

// arrive records that a call of flow in (nil: none) that Enter let in is
// no longer pending: it reached Acquire, or left without. A flow owes no
// more places than it has calls pending; the rest is forgiven.
func (c *Controller) arrive(in *flow) {
	if in == nil {
		return
	}
	in.pending--
	if d := in.owed - in.pending; d > 0 {
		in.owed -= d
		c.owed -= d
	}
}

// exit gives back a place of flow in (nil: none) among the calls Enter let
// in, and lists the flow idle if that was all it held.
func (c *Controller) exit(in *flow) {
	if in == nil {
		return
	}
	in.inside--
	c.inside--
	if in.inside == 0 {
		c.unhold(in)
	}
	c.listIdle(in)
}

// Acquire admits a call of flow f, waiting for a slot if every one is
// taken, or sheds it. It returns a Permit whose Done must be called when
// the call ends, or a *[ShedError], or ctx's error when ctx ends while the
// call waits. A call waits at most twice the queue target, and is shed at
// once when ctx's deadline leaves less than its expected wait plus the
// service time of a call that does not queue (the baseline).
func (c *Controller) Acquire(ctx context.Context, f Flow) (Permit, error) {
	now := c.o.now()
	inside := c.claim(ctx)
	if inside == nil && ctx.Err() == nil && c.untapped.Add(1) == 1 {
		c.warnUntapped()
	}
	c.mu.Lock()
	fl := c.flow(f, now)
	if inside == nil {
		c.offered.add(now, 1) // Enter did not count it
		fl.offered.add(now, 1)
	}
	if inside != nil && inside.owed > 0 {
		// A call of a flow under its share took this call's place as it
		// entered: this one goes instead.
		inside.owed--
		c.owed--
		c.arrive(inside)
		return Permit{}, c.shedUnlock(fl, inside, ShedDisplaced, now)
	}
	c.arrive(inside)
	if err := ctx.Err(); err != nil {
		c.exit(inside)
		c.listIdle(fl)
		c.mu.Unlock()
		return Permit{}, err
	}
	slots := c.st.Slots()
	if c.queued == 0 && c.inflight < slots || c.overtakes(fl, slots) {
		// A call that starts at once counts for fair queueing too.
		i := prioIndex(fl.k.prio)
		fl.vt = max(fl.vt, c.vclock[i]) + 1/fl.weight
		c.grant(fl)
		c.admitted++
		p := Permit{c: c, f: fl, start: now, inside: inside}
		c.unlockYield()
		return p, nil
	}
	c.bound = true
	floor := c.floor(now)
	wait := 2 * c.st.Target(floor)
	if dl, ok := ctx.Deadline(); ok {
		// Expect to wait for the calls ahead to start, then to run as
		// long as a call that does not queue (the baseline: a latency
		// inflated by an overload must not shed every call that waits,
		// or nothing would complete to correct it).
		left := dl.Sub(now) - c.st.Baseline
		expect := time.Duration(float64(c.st.Latency) * float64(c.queued) / float64(slots))
		if left <= min(expect, wait) {
			return Permit{}, c.shedUnlock(fl, inside, ShedDeadline, now)
		}
		wait = min(wait, left)
	}
	if c.queued >= c.st.QueueCap(floor) {
		switch v := c.victim(fl, now); {
		case v != nil:
			c.evict(v)
		case !c.withinSplit(fl, now):
			return Permit{}, c.shedUnlock(fl, inside, ShedQueueFull, now)
		}
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
		p := Permit{c: c, f: fl, start: w.grantAt, inside: inside, wait: w.grantAt.Sub(w.at)}
		c.unlockYield()
		return p, nil
	case w.granted:
		// Admitted as the context ended: give the slot to the next.
		c.release(fl, inside)
		c.dispatch(c.o.now())
		c.mu.Unlock()
		return Permit{}, ctxErr
	case w.evicted:
		return Permit{}, c.shedUnlock(fl, inside, ShedDisplaced, c.o.now())
	}
	c.dequeue(w)
	if ctxErr != nil {
		c.exit(inside)
		c.listIdle(fl)
		c.mu.Unlock()
		return Permit{}, ctxErr
	}
	return Permit{}, c.shedUnlock(fl, inside, ShedTimeout, c.o.now())
}

// yieldAbove is the least baseline service time at which an admitted call
// yields the CPU once before it runs. In the Go scheduler, a goroutine that
// was just made runnable (a call's, by its connection's reader or by Done)
// runs ahead of those already waiting, the connections' readers and
// writers among them; a 10 ms handler run ahead of each made them wait
// 60–80 ms (the median, from a trace of one CPU at 4× its capacity) and
// held the admitted p99 at 300 ms. Yielding puts the call behind them. It
// costs a reschedule and smaller read batches: 5–10% of the goodput of
// 0.2–0.5 ms calls, and no loss that showed with 2 ms calls (BENCHMARKS.md,
// run 8).
const yieldAbove = time.Millisecond

// unlockYield releases the lock and, when calls take yieldAbove or more,
// yields the CPU before the admitted call runs. The call's service time
// includes the yield: the time a call waits for the CPU behind others is
// the signal that the limit is above what the CPUs run at once.
func (c *Controller) unlockYield() {
	long := c.st.Baseline >= yieldAbove
	c.mu.Unlock()
	if long {
		runtime.Gosched()
	}
}

// warnUntapped logs, once, that calls reach Acquire without Enter.
func (c *Controller) warnUntapped() {
	l := c.o.logger
	if l == nil {
		l = slog.Default()
	}
	l.Warn("overload: a call reached Acquire without Enter: calls that wait to start in the Go scheduler are not bounded; " +
		"install the tap handle (middleware's Limiter.ServerOptions, or grpc.InTapHandle(limiter.TapHandle)), or call Enter where calls enter")
}

// Done ends the call: its slot goes to the next waiting call, and its
// service time to the control law.
func (p Permit) Done() {
	c := p.c
	if c == nil {
		return
	}
	now := c.o.now()
	c.mu.Lock()
	c.release(p.f, p.inside)
	c.n++
	c.sum += now.Sub(p.start)
	var ev event
	if law.Due(c.st, c.n, c.bound, now) {
		ev = c.step(now)
	}
	c.dispatch(now)
	c.mu.Unlock()
	c.emit(ev)
}

// Enter counts a call of flow f as it enters the server, before its
// request is read, and returns ctx carrying its place and true; or, when
// the server already holds as many calls as it runs at once and lets wait
// (the limit plus the queue's cap) and f holds at least its fair share of
// them, counts the call as shed (ShedTap) and returns false. A gRPC tap
// handle calls it for every call (middleware.Limiter.TapHandle does).
//
// Calls wait to be started in places the controller cannot see: in the Go
// scheduler, a CPU-bound handler runs to its end before the next call's
// goroutine starts, so calls queue there and never in Acquire. Counting
// them where they enter bounds that queue too. A call gives its place back
// when it ends, or when its context ends if it never reaches Acquire.
func (c *Controller) Enter(ctx context.Context, f Flow) (context.Context, bool) {
	now := c.o.now()
	c.mu.Lock()
	fl := c.flow(f, now)
	c.offered.add(now, 1)
	fl.offered.add(now, 1)
	if places := c.places(now); c.inside-c.owed >= places {
		// The call takes a place of v's: v's waiting call if it has one,
		// else the next of v's calls to reach Acquire, else (all of v's
		// calls are running) one beyond the places until one of v's ends.
		switch v := c.displaced(fl, now); {
		case v == nil && !c.withinSplit(fl, now):
			c.countShed(ShedTap, now)
			c.listIdle(fl)
			ev := c.enter(now)
			c.mu.Unlock()
			c.emit(ev)
			return ctx, false
		case v == nil:
			// fl asks for no more than an equal split: it enters
			// beyond the places.
		case len(v.q) > 0:
			c.evict(v)
		case v.pending > v.owed:
			v.owed++
			c.owed++
		}
	}
	if fl.inside == 0 {
		fl.held = len(c.holding)
		c.holding = append(c.holding, fl)
	}
	fl.inside++
	fl.pending++
	c.inside++
	fl.entered.add(now, 1)
	c.top.v = max(c.top.value(now), fl.entered.v/fl.weight)
	c.mu.Unlock()
	t := &ticket{c: c, f: fl}
	ctx = context.WithValue(ctx, ticketKey{}, t)
	t.stop = context.AfterFunc(ctx, t.leave)
	return ctx, true
}

// floor returns the least queue target in force: the configured one
// (WithQueueTarget); else law.MinTarget while the server is overloaded,
// shedding more than overloadShare of the calls offered lately, and
// law.OpenTarget otherwise, so that a server below its capacity absorbs the
// bursts of random arrivals instead of shedding them (Facebook's adaptive
// queue timeout: a long one, and a short one once the queue stands).
func (c *Controller) floor(now time.Time) time.Duration {
	switch {
	case c.o.target > 0:
		return c.o.target
	case c.shedLately.value(now) > overloadShare*c.offered.value(now):
		return law.MinTarget
	}
	return law.OpenTarget
}

// overloadShare is the share of the calls offered lately that a server
// sheds once it is overloaded: a tenth, an offered load a ninth above what
// it completes. The bursts of random (Poisson) arrivals at 80–90% of a
// server's capacity shed a few percent at most with the long target, and
// shed more with the short one, which a shed alone would switch to.
const overloadShare = 0.1

// places returns how many calls the server may hold: what it runs at once,
// and what those complete in the queue target.
func (c *Controller) places(now time.Time) int {
	return c.st.Slots() + c.st.QueueCap(c.floor(now))
}

// entryMemory is how long the controller remembers the calls it was
// offered, let in and shed (decayed), when it judges shares and overload:
// long enough to span many calls of a flow under its share, short enough
// to follow a change of load within a second or two.
const entryMemory = time.Second

// decayed is a count that decays over entryMemory: what happened lately.
type decayed struct {
	v  float64
	at time.Time
}

// value returns the count decayed to now, and records it as of now.
func (d *decayed) value(now time.Time) float64 {
	if dt := now.Sub(d.at); dt > 0 && !d.at.IsZero() {
		d.v *= math.Exp(-float64(dt) / float64(entryMemory))
	}
	d.at = now
	return d.v
}

// add counts n more as of now.
func (d *decayed) add(now time.Time, n float64) { d.v = d.value(now) + n }

// displaced returns the flow that gives up a place so that a call of fl
// may enter a full server, or nil when fl's call should be shed. A flow of
// a lower priority than fl's goes first. Within fl's priority, fl may enter
// when, with this call, it would still have been let in fewer calls lately
// for its weight than the flow let in the most (which may have nothing
// inside at the moment), and the flow that gives up a place is the one
// let in the most of those holding one not yet given up, if it was let in
// more than fl and asks for more than its split (withinSplit). So a flow
// under its weighted max-min fair share keeps its calls while another
// floods, and the flood gets what is left.
func (c *Controller) displaced(fl *flow, now time.Time) *flow {
	own := (fl.entered.value(now) + 1) / fl.weight
	if own >= c.top.value(now) {
		return nil
	}
	var victim, lower *flow
	var most float64
	for _, g := range c.holding {
		if g.inside-g.owed <= 0 || g == fl || g.k.prio > fl.k.prio {
			continue
		}
		if g.k.prio < fl.k.prio {
			if lower == nil || g.k.prio < lower.k.prio {
				lower = g
			}
			continue
		}
		if l := g.entered.value(now) / g.weight; l > most && !c.withinSplit(g, now) {
			most, victim = l, g
		}
	}
	switch {
	case lower != nil:
		return lower
	case most > own:
		return victim
	}
	return nil
}

// RetryAfter returns the retry delay shed calls are given (WithRetryAfter).
func (c *Controller) RetryAfter() time.Duration { return c.o.retry }

// Snapshot returns the controller's observable state.
func (c *Controller) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshot()
}

// snapshot is Snapshot under the lock.
func (c *Controller) snapshot() Snapshot {
	floor := c.floor(c.o.now())
	return Snapshot{
		State: c.state, Since: c.since,
		Limit: c.st.Limit, Inflight: c.inflight, Queued: c.queued, QueueCap: c.st.QueueCap(floor), Inside: c.inside,
		Latency: c.st.Latency, Baseline: c.st.Baseline, Wait: c.wait, Target: c.st.Target(floor),
		Throughput: c.st.Throughput, CPU: c.cpu, SchedP99: c.sched,
		Admitted: c.admitted, Waited: c.waited, Shed: c.shed, Untapped: c.untapped.Load(),
	}
}

func weight(w float64) float64 {
	if !(w > 0) || math.IsInf(w, 0) {
		return 1
	}
	return w
}

// flow returns f's flow as of now, making it if needed.
func (c *Controller) flow(f Flow, now time.Time) *flow {
	// A priority outside the three counts as the nearest of them.
	k := flowKey{f.Key, min(max(f.Priority, floodgate.Sheddable), floodgate.Critical)}
	fl, ok := c.flows[k]
	if !ok {
		c.sweep(now)
		if len(c.flows) >= maxFlows {
			k.key = overflowKey
			fl, ok = c.flows[k]
		}
	}
	if !ok {
		if n := len(c.free); n > 0 {
			fl, c.free = c.free[n-1], c.free[:n-1]
		} else {
			fl = new(flow)
		}
		*fl = flow{k: k, weight: weight(f.Weight), held: -1, born: now, q: fl.q[:0]}
		c.flows[k] = fl
		c.weights += fl.weight
	}
	fl.last = now
	return fl
}

// listIdle lists fl to be forgotten (sweep) when nothing of it is in flight,
// inside or waiting.
func (c *Controller) listIdle(fl *flow) {
	if fl.busy() || fl.listed || c.flows[fl.k] != fl {
		return
	}
	fl.listed = true
	c.idle = append(c.idle, fl)
}

// sweep forgets the flows listed idle whose latest call came forgetAfter
// or more before now, looking at a few of the list at most: a flow busy
// again leaves the list, one idle but recent goes to its end.
func (c *Controller) sweep(now time.Time) {
	for range min(len(c.idle)-c.idleHead, 16) {
		fl := c.idle[c.idleHead]
		c.idle[c.idleHead] = nil
		c.idleHead++
		switch {
		case fl.busy():
			fl.listed = false
		case now.Sub(fl.last) < forgetAfter:
			c.idle = append(c.idle, fl)
		default:
			delete(c.flows, fl.k)
			c.weights -= fl.weight
			if len(c.flows) == 0 {
				c.weights = 0 // no rounding left over
			}
			fl.listed = false
			if len(c.free) < 64 {
				c.free = append(c.free, fl)
			}
		}
	}
	if c.idleHead > len(c.idle)/2 {
		n := copy(c.idle, c.idle[c.idleHead:])
		clear(c.idle[n:])
		c.idle, c.idleHead = c.idle[:n], 0
	}
}

// unhold removes fl, which has no call inside any more, from holding.
func (c *Controller) unhold(fl *flow) {
	last := c.holding[len(c.holding)-1]
	c.holding[fl.held], last.held = last, fl.held
	c.holding[len(c.holding)-1] = nil
	c.holding = c.holding[:len(c.holding)-1]
	fl.held = -1
}

// withinSplit reports whether fl asks for no more, for its weight, than an
// equal split of what the server completes among the flows remembered,
// and no call of a higher priority waits. Such a flow is never shed for
// room nor displaced: what all of them ask fits in the capacity.
func (c *Controller) withinSplit(fl *flow, now time.Time) bool {
	for i := prioIndex(fl.k.prio) + 1; i < nPriorities; i++ {
		if len(c.active[i]) > 0 {
			return false
		}
	}
	// The flow's calls offered lately, against what an equal split would
	// have let in over the part of entryMemory it has been remembered:
	// a flow new to the controller has shown nothing yet.
	seen := -math.Expm1(-float64(now.Sub(fl.born)) / float64(entryMemory))
	return fl.offered.value(now) <= fl.weight*c.st.Throughput*entryMemory.Seconds()*seen/c.weights
}

func (c *Controller) grant(fl *flow) {
	fl.inflight++
	c.inflight++
	c.running[prioIndex(fl.k.prio)]++
}

// overtakes reports whether a call of fl takes a slot at once although
// every slot is taken: lower-priority calls hold some, its own and higher
// priorities hold fewer than the limit, and none of those waits. Calls of
// a priority never wait for slots held by lower ones: they run beside
// them, and no slot goes to a waiting call until the calls running are
// back within the limit, so the lower-priority calls give theirs back as
// they end.
func (c *Controller) overtakes(fl *flow, slots int) bool {
	p := prioIndex(fl.k.prio)
	above := 0
	for i := p; i < nPriorities; i++ {
		if len(c.active[i]) > 0 {
			return false
		}
		above += c.running[i]
	}
	return above < slots && above < c.inflight
}

// release ends a call of fl that held a slot and, unless inside is nil, a
// place Enter counted.
func (c *Controller) release(fl *flow, inside *flow) {
	fl.inflight--
	c.inflight--
	c.running[prioIndex(fl.k.prio)]--
	c.exit(inside)
	c.listIdle(fl)
}

func (c *Controller) enqueue(w *waiter) {
	fl := w.f
	if len(fl.q) == 0 {
		i := prioIndex(fl.k.prio)
		c.active[i] = append(c.active[i], fl)
		fl.vt = max(fl.vt, c.vclock[i])
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
		a := c.active[prioIndex(fl.k.prio)]
		for i, x := range a {
			if x == fl {
				a[i] = a[len(a)-1]
				a[len(a)-1] = nil
				c.active[prioIndex(fl.k.prio)] = a[:len(a)-1]
				break
			}
		}
	}
}

// dispatch hands free slots to waiting calls: the highest priority first,
// then, by start-time fair queueing, the flow whose virtual time is least
// (each call it starts advances it by 1/weight), so that flows get slots in
// proportion to their weights however many calls each has waiting.
func (c *Controller) dispatch(now time.Time) {
	for c.queued > 0 && c.inflight < c.st.Slots() {
		var best *flow
		p := nPriorities - 1
		for ; p >= 0 && best == nil; p-- {
			for _, fl := range c.active[p] {
				if best == nil || fl.vt < best.vt || (fl.vt == best.vt && fl.q[0].at.Before(best.q[0].at)) {
					best = fl
				}
			}
		}
		c.vclock[p+1] = best.vt
		best.vt += 1 / best.weight
		w := best.q[0]
		c.dequeue(w)
		c.grant(best)
		w.granted, w.grantAt = true, now
		c.waitSum += now.Sub(w.at)
		c.waitN++
		w.ch <- struct{}{}
	}
}

// victim returns the flow that should lose a waiting call so that a call
// of fl can wait, or nil when fl's call should be shed instead: the lowest
// priority first, then the flow holding the most slots and queue places
// for its weight, save flows within their split (withinSplit). A flow no
// further under its share than the victim does not displace it.
func (c *Controller) victim(fl *flow, now time.Time) *flow {
	p := prioIndex(fl.k.prio)
	for i := range p + 1 {
		var worst *flow
		var worstLoad float64
		for _, v := range c.active[i] {
			if i == p && c.withinSplit(v, now) {
				continue
			}
			if l := float64(v.inflight+len(v.q)) / v.weight; worst == nil || l > worstLoad {
				worst, worstLoad = v, l
			}
		}
		switch {
		case worst == nil:
			continue
		case i < p:
			return worst
		case float64(fl.inflight+len(fl.q)+1)/fl.weight < worstLoad && worst != fl:
			return worst
		}
		return nil
	}
	return nil
}

// evict displaces v's oldest waiting call, the one closest to its wait
// running out.
func (c *Controller) evict(v *flow) {
	w := v.q[0]
	c.dequeue(w)
	w.evicted = true
	w.ch <- struct{}{}
}

// countShed counts a shed call of cause.
func (c *Controller) countShed(cause ShedCause, now time.Time) {
	c.shed[cause]++
	c.shedLately.add(now, 1)
	c.lastShed = now
}

// shedUnlock, called with c.mu held, counts a shed call of fl, gives back
// its place Enter counted, lists fl idle if it is empty, releases the lock,
// logs a change of state and returns the call's error. (A …Locked helper
// expects the lock held and leaves it held; this one releases it.)
func (c *Controller) shedUnlock(fl *flow, inside *flow, cause ShedCause, now time.Time) error {
	c.countShed(cause, now)
	c.exit(inside)
	c.listIdle(fl)
	ev := c.enter(now)
	c.mu.Unlock()
	c.emit(ev)
	return &ShedError{Cause: cause, RetryAfter: c.o.retry}
}

// event is what to log and report after the lock is released.
type event struct {
	snap         Snapshot
	state, limit bool
}

// enter returns the event of entering Shedding, or none when the
// controller is shedding already.
func (c *Controller) enter(now time.Time) event {
	if c.state == Shedding {
		return event{}
	}
	c.state, c.since = Shedding, now
	return event{state: true, snap: c.snapshot()}
}

// step feeds the law the calls completed since the latest step.
func (c *Controller) step(now time.Time) event {
	if g := c.o.guard; g != nil {
		c.cpu, c.sched = g.Reading()
	}
	c.sweep(now)
	prev := c.st.Limit
	c.st = law.Step(c.st, law.Sample{N: c.n, Sum: c.sum, Bound: c.bound}, c.bounds(), now)
	c.wait = 0
	if c.waitN > 0 {
		c.wait = c.waitSum / time.Duration(c.waitN)
	}
	c.n, c.sum, c.bound, c.waitSum, c.waitN = 0, 0, false, 0, 0
	var ev event
	if c.state == Shedding && now.Sub(c.lastShed) >= openAfter {
		c.state, c.since = Open, now
		ev.state = true
	}
	ev.limit = c.st.Slots() != int(max(1, prev))
	if ev.state || ev.limit {
		ev.snap = c.snapshot()
	}
	return ev
}

// emit logs an event and reports it, outside the lock.
func (c *Controller) emit(ev event) {
	if !ev.state && !ev.limit {
		return
	}
	if l := c.o.logger; l != nil {
		s := ev.snap
		attrs := []slog.Attr{
			slog.Float64("limit", math.Round(s.Limit*10)/10),
			slog.Int("inflight", s.Inflight),
			slog.Int("queued", s.Queued),
			slog.Int("queue_cap", s.QueueCap),
			slog.Int("inside", s.Inside),
			slog.Duration("wait", s.Wait),
			slog.Duration("target", s.Target),
			slog.Duration("latency", s.Latency),
			slog.Duration("baseline", s.Baseline),
			slog.Float64("throughput", math.Round(s.Throughput)),
		}
		if c.o.guard != nil {
			attrs = append(attrs, slog.Float64("cpu", math.Round(s.CPU*1000)/1000), slog.Duration("sched_p99", s.SchedP99))
		}
		ctx := context.Background()
		switch {
		case ev.state && s.State == Shedding:
			l.LogAttrs(ctx, slog.LevelWarn, "overload: shedding: every slot is taken and the queue is full", attrs...)
		case ev.state:
			l.LogAttrs(ctx, slog.LevelInfo, "overload: open: nothing shed for a second", attrs...)
		}
		if ev.limit {
			l.LogAttrs(ctx, slog.LevelDebug, "overload: limit changed", attrs...)
		}
	}
	if c.o.onChange != nil {
		c.o.onChange(ev.snap)
	}
}
