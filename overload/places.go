package overload

import (
	"context"
	"time"

	"github.com/floodgate-go/floodgate/overload/internal/law"
)

// Enter counts a call of flow f as it enters the server, before its
// request is read, and returns ctx carrying its place and true; or, when
// the server already holds as many calls as it runs at once and lets wait
// (the limit plus the queue's cap) and f holds at least its fair share of
// them, counts the call as shed (ShedTap) and returns false. A gRPC tap
// handle calls it, or EnterAlways, for every call the controller may hold
// (middleware.Limiter.TapHandle does: all but exempt calls and the
// streams it knows).
//
// Calls wait to be started in places the controller cannot see: in the Go
// scheduler, a CPU-bound handler runs to its end before the next call's
// goroutine starts, so calls queue there and never in Acquire. Counting
// them where they enter bounds that queue too. A call gives its place back
// when it ends, or when its context ends if it never reaches Acquire.
func (c *Controller) Enter(ctx context.Context, f Flow) (context.Context, bool) {
	return c.enter(ctx, f, true)
}

// EnterAlways counts a call of flow f as it enters, as Enter does, but
// never turns it away nor takes another flow's place: past the places, it
// enters beyond them. It is for a call its caller cannot shed yet, such as
// one a tap handle cannot tell from a stream, which the controller does
// not hold (Leave gives a stream's place back).
func (c *Controller) EnterAlways(ctx context.Context, f Flow) context.Context {
	ctx, _ = c.enter(ctx, f, false)
	return ctx
}

// enter is Enter; only with refuse may it turn the call away or take a
// place of another flow's.
func (c *Controller) enter(ctx context.Context, f Flow, refuse bool) (context.Context, bool) {
	now := c.o.now()
	c.mu.Lock()
	fl := c.flowLocked(f, now)
	c.offered.add(now, 1)
	fl.offered.add(now, 1)
	if places := c.placesLocked(now); refuse && c.inside-c.owed >= places {
		// The call takes a place of v's: v's waiting call if it has one,
		// else the next of v's calls to reach Acquire, else (all of v's
		// calls are running) one beyond the places until one of v's ends.
		switch v := c.displacedLocked(fl, now); {
		case v == nil && !c.withinSplitLocked(fl, now):
			c.countShedLocked(ShedTap, now)
			c.listIdleLocked(fl)
			ev := c.startSheddingLocked(now)
			c.mu.Unlock()
			c.emit(ev)
			return ctx, false
		case v == nil:
			// fl asks for no more than an equal split: it enters
			// beyond the places.
		case len(v.q) > 0:
			c.evictLocked(v)
		case v.pending > v.owed:
			v.owed++
			c.owed++
			c.indexHoldingLocked(v)
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
	c.top.set(now, max(c.top.value(now), fl.entered.v/fl.weight))
	c.indexHoldingLocked(fl)
	c.mu.Unlock()
	t := &ticket{Context: ctx, c: c, f: fl}
	t.stop = context.AfterFunc(t, t.expire)
	return t, true
}

// Leave gives back the place Enter counted for the call of ctx, for a call
// that will not Acquire: a stream, whose lifetime says nothing about load,
// must not hold a place while it lasts. It does nothing for a context
// Enter did not mark, and when called again.
func (c *Controller) Leave(ctx context.Context) {
	if in := c.claim(ctx); in != nil {
		c.returnPlace(in)
	}
}

// A ticket is a call's place among those Enter let in. The call gives it
// back when it ends; a call that never reaches Acquire (a quota rejection,
// an unknown method, a stream reset before its handler ran) gives it back
// when its stream's context ends.
type ticket struct {
	context.Context // the call's, which the ticket extends
	c               *Controller
	f               *flow
	stop            func() bool // stops the context's release; true when it had not run
}

type ticketKey struct{}

// Value returns the ticket for ticketKey, else the call context's value.
func (t *ticket) Value(key any) any {
	if key == (ticketKey{}) {
		return t
	}
	return t.Context.Value(key)
}

// claim returns the flow the call of ctx holds a place of, the one Enter
// counted it in, taking over its release from the context; or nil.
func (c *Controller) claim(ctx context.Context) *flow {
	if t, _ := ctx.Value(ticketKey{}).(*ticket); t != nil && t.c == c && t.stop() {
		return t.f
	}
	return nil
}

// expire gives back the place of a call whose context ended before it
// claimed the place (Acquire, Leave).
func (t *ticket) expire() { t.c.returnPlace(t.f) }

// returnPlace gives back a place of flow in, for a call that will not
// Acquire.
func (c *Controller) returnPlace(in *flow) {
	c.mu.Lock()
	c.arriveLocked(in)
	c.exitLocked(in)
	c.mu.Unlock()
}

// arriveLocked records that a call of flow in (nil: none) that Enter let in
// is no longer pending: it reached Acquire, or left without. A flow owes no
// more places than it has calls pending; the rest is forgiven.
func (c *Controller) arriveLocked(in *flow) {
	if in == nil {
		return
	}
	in.pending--
	if d := in.owed - in.pending; d > 0 {
		in.owed -= d
		c.owed -= d
	}
	c.indexHoldingLocked(in) // its owed places may have been forgiven, or taken back (Acquire)
}

// exitLocked gives back a place of flow in (nil: none) among the calls
// Enter let in, and lists the flow idle if that was all it held.
func (c *Controller) exitLocked(in *flow) {
	if in == nil {
		return
	}
	in.inside--
	c.inside--
	c.indexHoldingLocked(in)
	if in.inside == 0 {
		c.unholdLocked(in)
	}
	c.listIdleLocked(in)
}

// placesLocked returns how many calls the server may hold (law.State.Places).
func (c *Controller) placesLocked(now time.Time) int { return c.st.Places(c.floorLocked(now)) }

// floorLocked returns the least queue target in force: the configured one
// (WithQueueTarget), else the law's for the calls offered and shed lately
// (law.Floor).
func (c *Controller) floorLocked(now time.Time) time.Duration {
	if c.o.target > 0 {
		return c.o.target
	}
	return law.Floor(c.shedLately.value(now), c.offered.value(now))
}
