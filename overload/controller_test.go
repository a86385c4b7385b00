package overload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
)

const ms = time.Millisecond

// newTest returns a controller of one slot (WithLimits(1, 1)) and the
// other options.
func newTest(t *testing.T, opts ...Option) *Controller {
	t.Helper()
	c, err := New(append([]Option{WithLimits(1, 1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// teach runs 16 calls of cost through c, one at a time, so that it knows
// their latency.
func teach(t *testing.T, c *Controller, cost time.Duration) {
	t.Helper()
	for range 16 {
		p, err := c.Acquire(t.Context(), Flow{Key: "teach"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(cost)
		p.Done()
	}
	if got := c.Snapshot().Latency; got != cost {
		t.Fatalf("Latency = %v after 16 calls of %v", got, cost)
	}
}

// acquireAsync starts an Acquire and returns where its outcome will arrive.
func acquireAsync(ctx context.Context, c *Controller, f Flow) chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := c.Acquire(ctx, f)
		ch <- result{f.Key, p, err}
	}()
	return ch
}

type result struct {
	key string
	p   Permit
	err error
}

func shedCause(err error) (ShedCause, bool) {
	var se *ShedError
	if errors.As(err, &se) {
		return se.Cause, true
	}
	return 0, false
}

// serveOne lets the call holding the slot end, and returns the result of
// the call that got the slot next, from chans.
func serveOne(t *testing.T, held *Permit, chans map[chan result]bool) result {
	t.Helper()
	held.Done()
	synctest.Wait()
	for ch := range chans {
		select {
		case r := <-ch:
			delete(chans, ch)
			if r.err != nil {
				t.Fatalf("%s: %v, want a slot", r.key, r.err)
			}
			*held = r.p
			return r
		default:
		}
	}
	t.Fatal("no waiting call got the freed slot")
	return result{}
}

// Slots go to the flows in proportion to their weights, however many calls
// each has waiting: a light flow's one call does not wait behind a flood.
func TestFairShareOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithQueueTarget(time.Hour))
		teach(t, c, ms)
		held, err := c.Acquire(t.Context(), Flow{Key: "x"})
		if err != nil {
			t.Fatal(err)
		}
		chans := map[chan result]bool{}
		for range 6 {
			chans[acquireAsync(t.Context(), c, Flow{Key: "heavy", Weight: 2})] = true
			synctest.Wait()
		}
		for range 3 {
			chans[acquireAsync(t.Context(), c, Flow{Key: "light", Weight: 1})] = true
			synctest.Wait()
		}
		var order []string
		for range 9 {
			order = append(order, serveOne(t, &held, chans).key)
		}
		held.Done()
		// Start-time fair queueing: heavy advances by ½ a call, light by
		// 1, both from the same virtual time.
		want := "heavy light heavy heavy light heavy heavy light heavy"
		if got := strings.Join(order, " "); got != want {
			t.Errorf("order of service:\n got %s\nwant %s", got, want)
		}
	})
}

// A full queue makes room for a flow under its share by displacing the
// oldest waiting call of the flow furthest over it, and for a higher
// priority by displacing the lowest; the flow over its share is shed.
func TestFullQueueDisplacesTheFlowOverItsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One slot, and a queue of 4 until a call completes.
		c := newTest(t, WithQueueTarget(time.Hour))
		held, _ := c.Acquire(t.Context(), Flow{Key: "heavy"})
		var heavy []chan result
		for range 4 {
			heavy = append(heavy, acquireAsync(t.Context(), c, Flow{Key: "heavy"}))
			synctest.Wait()
		}
		if s := c.Snapshot(); s.Queued != 4 || s.QueueCap != 4 {
			t.Fatalf("queued %d of %d, want a full queue of 4", s.Queued, s.QueueCap)
		}
		if _, err := c.Acquire(t.Context(), Flow{Key: "heavy"}); err == nil {
			t.Fatal("a heavy call into a full queue of heavy calls was admitted")
		} else if cause, _ := shedCause(err); cause != ShedQueueFull {
			t.Errorf("heavy call: %v, want queue_full", err)
		}
		light := acquireAsync(t.Context(), c, Flow{Key: "light"})
		synctest.Wait()
		if r := <-heavy[0]; !errors.Is(r.err, ErrShed) {
			t.Fatalf("oldest heavy call: %v, want displaced", r.err)
		} else if cause, _ := shedCause(r.err); cause != ShedDisplaced {
			t.Errorf("oldest heavy call: %v, want displaced", r.err)
		}
		// A critical call does not wait for the slot a default call holds:
		// it runs beside it. A second one finds its own priority holding
		// the limit, waits, and displaces the lowest priority's oldest call.
		critFlow := Flow{Key: "heavy", Priority: floodgate.Critical}
		first, err := c.Acquire(t.Context(), critFlow)
		if err != nil {
			t.Fatalf("critical call beside a default one: %v, want a slot at once", err)
		}
		if s := c.Snapshot(); s.Inflight != 2 || s.Queued != 4 {
			t.Fatalf("inflight %d, queued %d; want 2 (over the limit of 1) and 4", s.Inflight, s.Queued)
		}
		crit := acquireAsync(t.Context(), c, critFlow)
		synctest.Wait()
		if r := <-heavy[1]; !errors.Is(r.err, ErrShed) {
			t.Fatalf("second heavy call: %v, want displaced by the critical call", r.err)
		}
		first.Done() // back at the limit: no waiting call gets a slot yet
		synctest.Wait()
		if s := c.Snapshot(); s.Inflight != 1 || s.Queued != 4 {
			t.Fatalf("after the first critical call: inflight %d, queued %d; want 1 and 4", s.Inflight, s.Queued)
		}
		var got []string
		chans := map[chan result]bool{crit: true, light: true, heavy[2]: true, heavy[3]: true}
		for range 4 {
			r := serveOne(t, &held, chans)
			got = append(got, r.key+"/"+r.p.f.k.prio.String())
		}
		held.Done()
		// Start-time fair queueing: heavy has started a call already.
		if g, w := strings.Join(got, " "), "heavy/critical light/default heavy/default heavy/default"; g != w {
			t.Errorf("order %s, want %s", g, w)
		}
		s := c.Snapshot()
		if s.ShedBy(ShedQueueFull) != 1 || s.ShedBy(ShedDisplaced) != 2 || s.Admitted != 6 || s.Waited != 4 {
			t.Errorf("counts: shed %d queue_full, %d displaced; admitted %d, waited %d; want 1, 2; 6, 4",
				s.ShedBy(ShedQueueFull), s.ShedBy(ShedDisplaced), s.Admitted, s.Waited)
		}
	})
}

func TestTimeoutDeadlineAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithQueueTarget(5*ms))
		f := Flow{Key: "f"}
		held, _ := c.Acquire(t.Context(), f)
		start := time.Now()
		_, err := c.Acquire(t.Context(), f)
		if cause, ok := shedCause(err); !ok || cause != ShedTimeout {
			t.Fatalf("a call that found no slot: %v, want wait_timeout", err)
		}
		if waited := time.Since(start); waited != 10*ms {
			t.Errorf("waited %v, want twice the 5ms target", waited)
		}
		// A deadline sooner than the longest wait bounds the wait.
		ctx, cancel := context.WithTimeout(t.Context(), 6*ms)
		start = time.Now()
		_, err = c.Acquire(ctx, f)
		cancel()
		if cause, _ := shedCause(err); cause != ShedTimeout || time.Since(start) != 6*ms {
			t.Fatalf("Acquire with 6ms left = %v after %v, want wait_timeout after 6ms", err, time.Since(start))
		}
		// A caller that gives up gets its context's error, not a shed.
		ctx, cancel = context.WithCancel(t.Context())
		ch := acquireAsync(ctx, c, f)
		synctest.Wait()
		cancel()
		if r := <-ch; !errors.Is(r.err, context.Canceled) || errors.Is(r.err, ErrShed) {
			t.Fatalf("canceled wait: %v, want context.Canceled", r.err)
		}
		held.Done()
		s := c.Snapshot()
		if s.Queued != 0 || s.Inflight != 0 || s.ShedBy(ShedTimeout) != 2 || s.ShedTotal() != 2 {
			t.Errorf("snapshot %+v, want nothing queued or in flight and 2 timeouts", s)
		}
	})
}

// A call whose deadline leaves less than its expected wait plus the
// service time is shed at once: its work would be wasted.
func TestDeadlineAwareAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithQueueTarget(time.Hour))
		f := Flow{Key: "f"}
		teach(t, c, 10*ms)
		held, _ := c.Acquire(t.Context(), f)
		var waiting []chan result
		for range 2 {
			waiting = append(waiting, acquireAsync(t.Context(), c, f))
			synctest.Wait()
		}
		// Two calls ahead of one slot: 20 ms of wait, then 10 ms to run.
		for _, c2 := range []struct {
			left time.Duration
			shed bool
		}{{25 * ms, true}, {31 * ms, false}} {
			ctx, cancel := context.WithTimeout(t.Context(), c2.left)
			ch := acquireAsync(ctx, c, f)
			synctest.Wait()
			select {
			case r := <-ch:
				cause, _ := shedCause(r.err)
				if !c2.shed || cause != ShedDeadline {
					t.Errorf("a call with %v left: %v at once, want it to wait", c2.left, r.err)
				}
			default:
				if c2.shed {
					t.Errorf("a call with %v left waits, want it shed at once (deadline)", c2.left)
				}
				waiting = append(waiting, ch)
			}
			defer cancel()
		}
		held.Done()
		for _, ch := range waiting {
			synctest.Wait()
			if r := <-ch; r.err == nil {
				r.p.Done()
			}
		}
		if got := c.Snapshot().ShedBy(ShedDeadline); got != 1 {
			t.Errorf("deadline sheds = %d, want 1", got)
		}
	})
}

func TestStateChangesAreLoggedWithTheirSignals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		var snaps []Snapshot
		c := newTest(t, WithQueueTarget(ms), WithLogger(slog.New(slog.NewTextHandler(&buf, nil))),
			WithOnChange(func(s Snapshot) { snaps = append(snaps, s) }))
		held, _ := c.Acquire(t.Context(), Flow{Key: "f"})
		if _, err := c.Acquire(t.Context(), Flow{Key: "f"}); !errors.Is(err, ErrShed) {
			t.Fatalf("Acquire = %v, want shed", err)
		}
		held.Done()
		// A second of calls without a shed: Open again at the next step.
		for range 11 {
			for range 16 {
				p, _ := c.Acquire(t.Context(), Flow{Key: "f"})
				time.Sleep(ms / 2)
				p.Done()
			}
			time.Sleep(100 * ms)
		}
		log := buf.String()
		for _, want := range []string{"level=WARN msg=\"overload: shedding", "level=INFO msg=\"overload: open", "limit=1", "queue_cap=", "latency=500µs"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q:\n%s", want, log)
			}
		}
		if len(snaps) != 2 || snaps[0].State != Shedding || snaps[1].State != Open {
			t.Errorf("OnChange saw %d snapshots (%+v), want Shedding then Open", len(snaps), snaps)
		}
	})
}

func TestGuardReadingsGoIntoSnapshots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithGuard(GuardFunc(func() (float64, time.Duration) { return 0.42, 3 * ms })))
		for range 16 {
			p, _ := c.Acquire(t.Context(), Flow{})
			time.Sleep(10 * ms)
			p.Done()
		}
		if s := c.Snapshot(); s.CPU != 0.42 || s.SchedP99 != 3*ms {
			t.Errorf("CPU %v sched %v, want 0.42 and 3ms", s.CPU, s.SchedP99)
		}
	})
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	for name, opt := range map[string]Option{
		"WithLimits":       WithLimits(4, 2),
		"WithLimits(-1":    WithLimits(-1, 0),
		"WithQueueTarget":  WithQueueTarget(-ms),
		"WithRetryAfter":   WithRetryAfter(-ms),
		"WithLimits(0, -1": WithLimits(0, -1),
	} {
		_, err := New(opt)
		if !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), strings.SplitN(name, "(", 2)[0]) {
			t.Errorf("New(%s) = %v, want an ErrInvalidOption naming it", name, err)
		}
	}
	for _, opt := range []Option{WithLimits(0, 0), WithLimits(2, 2), WithLimits(0, 8), WithQueueTarget(0), nil} {
		if _, err := New(opt); err != nil {
			t.Errorf("New(valid option) = %v", err)
		}
	}
}

// The least limit defaults to GOMAXPROCS: a CPU-bound server needs a
// slot per CPU from its first call.
func TestDefaultLimitIsGOMAXPROCS(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Snapshot().Limit, float64(runtime.GOMAXPROCS(0)); got != want {
		t.Errorf("Limit = %v, want GOMAXPROCS, %v", got, want)
	}
}

// Enter counts calls as they enter, before anything queues them, and turns
// away the calls of a flow holding the most places once the server holds
// all it can run and queue; a flow under its share takes a place of the
// flood's instead, and a call's place comes back when it ends, or when its
// context ends if it never reached Acquire.
func TestEnter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One slot and, before any call has completed, a queue of 4:
		// five places.
		c := newTest(t)
		heavy, light := Flow{Key: "heavy"}, Flow{Key: "light"}
		var ctxs []context.Context
		var cancels []context.CancelFunc
		for range 5 {
			ctx, cancel := context.WithCancel(t.Context())
			ctx, in := c.Enter(ctx, heavy)
			if !in {
				t.Fatalf("Enter(heavy) = false with %d inside, want true", c.Snapshot().Inside)
			}
			ctxs, cancels = append(ctxs, ctx), append(cancels, cancel)
		}
		if _, in := c.Enter(t.Context(), heavy); in {
			t.Fatal("Enter(heavy) = true with all five places held by heavy")
		}
		if s := c.Snapshot(); s.Inside != 5 || s.ShedBy(ShedTap) != 1 || s.State != Shedding {
			t.Fatalf("inside %d, tap sheds %d, state %v; want 5, 1, shedding", s.Inside, s.ShedBy(ShedTap), s.State)
		}
		// light holds nothing: it takes a place of heavy's, and the next
		// heavy call to reach Acquire goes instead.
		lctx, in := c.Enter(t.Context(), light)
		if !in {
			t.Fatal("Enter(light) = false, want it to take a place of heavy's")
		}
		if _, err := c.Acquire(ctxs[0], heavy); !errors.Is(err, ErrShed) {
			t.Fatalf("the heavy call whose place light took: %v, want displaced", err)
		} else if cause, _ := shedCause(err); cause != ShedDisplaced {
			t.Errorf("cause %v, want displaced", cause)
		}
		p, err := c.Acquire(lctx, light)
		if err != nil {
			t.Fatalf("light's Acquire: %v", err)
		}
		if got := c.Snapshot().Inside; got != 5 {
			t.Errorf("inside = %d after the displacement, want 5", got)
		}
		p.Done()
		// Heavy calls that never reach Acquire (a quota rejection, a reset
		// stream) give their places back when their contexts end.
		for _, cancel := range cancels {
			cancel()
		}
		synctest.Wait()
		if s := c.Snapshot(); s.Inside != 0 {
			t.Errorf("inside = %d after every call ended, want 0", s.Inside)
		}
		forgets(t, c)
		// A stream gives its place back at once, and only once.
		sctx, in := c.Enter(t.Context(), light)
		if !in {
			t.Fatal("Enter(light) = false in an empty server")
		}
		c.Leave(sctx)
		c.Leave(sctx)
		c.Leave(t.Context()) // a context Enter did not mark
		if got := c.Snapshot().Inside; got != 0 {
			t.Errorf("inside = %d after Leave, want 0", got)
		}
		// A critical call enters a server full of default ones.
		for range 5 {
			c.Enter(t.Context(), heavy)
		}
		if _, in := c.Enter(t.Context(), Flow{Key: "heavy", Priority: floodgate.Critical}); !in {
			t.Error("Enter(critical) = false with only default calls inside")
		}
	})
}

// EnterAlways counts a call in as Enter does, but in a full server it
// neither turns the call away nor takes another flow's place: it enters
// beyond the places, and Leave gives its place back.
func TestEnterAlways(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t) // five places before any control step
		heavy, light := Flow{Key: "heavy"}, Flow{Key: "light"}
		var ctxs []context.Context
		for range 5 {
			ctx, in := c.Enter(t.Context(), heavy)
			if !in {
				t.Fatal("Enter(heavy) = false in a server with room")
			}
			ctxs = append(ctxs, ctx)
		}
		// Full, all of it heavy's: Enter would turn heavy away, and let
		// light take a place of heavy's.
		before := c.Snapshot()
		hctx := c.EnterAlways(t.Context(), heavy)
		lctx := c.EnterAlways(t.Context(), light)
		after := c.Snapshot()
		if after.Inside != before.Inside+2 || after.ShedBy(ShedTap) != before.ShedBy(ShedTap) {
			t.Errorf("EnterAlways in a full server: inside %d → %d, tap sheds %d → %d; want two more inside and no shed",
				before.Inside, after.Inside, before.ShedBy(ShedTap), after.ShedBy(ShedTap))
		}
		// heavy's first call keeps its place: light took none of heavy's.
		p, err := c.Acquire(ctxs[0], heavy)
		if err != nil {
			t.Fatalf("heavy's Acquire after EnterAlways(light): %v, want its place kept", err)
		}
		p.Done()
		c.Leave(hctx)
		c.Leave(lctx)
		if got := c.Snapshot().Inside; got != before.Inside-1 {
			t.Errorf("inside = %d after heavy's call and two Leaves, want %d", got, before.Inside-1)
		}
	})
}

// A latency inflated by an overload must not shed every call that waits
// by its deadline: nothing would complete to correct it.
func TestDeadlineUsesTheBaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithQueueTarget(time.Second))
		teach(t, c, 10*ms)
		// Calls now take 600 ms, longer than the callers' deadline.
		for range 16 {
			p, _ := c.Acquire(t.Context(), Flow{Key: "slow"})
			time.Sleep(600 * ms)
			p.Done()
		}
		if s := c.Snapshot(); s.Latency != 600*ms || s.Baseline != 10*ms {
			t.Fatalf("latency %v baseline %v, want 600ms and 10ms", s.Latency, s.Baseline)
		}
		held, _ := c.Acquire(t.Context(), Flow{Key: "x"})
		ctx, cancel := context.WithTimeout(t.Context(), 500*ms)
		defer cancel()
		ch := acquireAsync(ctx, c, Flow{Key: "y"})
		synctest.Wait()
		select {
		case r := <-ch:
			t.Fatalf("a call with 500 ms left and nothing ahead: %v at once, want it to wait", r.err)
		default:
		}
		held.Done()
		if r := <-ch; r.err != nil {
			t.Errorf("the waiting call: %v, want the freed slot", r.err)
		} else {
			r.p.Done()
		}
	})
}

// Whatever path a call takes (shed at the tap, displaced, timed out, its
// context ended before or after Acquire, a stream that leaves, a call
// whose tap and interceptor name different flows), every place, slot and
// owed place comes back once the calls end, and an empty server admits.
func TestEveryPlaceComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithLimits(2, 2))
		teach(t, c, 2*ms)
		rng := rand.New(rand.NewPCG(1, 2))
		flows := []Flow{{Key: "a"}, {Key: "a"}, {Key: "a"}, {Key: "b"}, {Key: "c", Weight: 2}, {Key: "d", Priority: floodgate.Sheddable}, {Key: "e", Priority: floodgate.Critical}, {Key: "f", Priority: 7}}
		var wg sync.WaitGroup
		for i := range 2000 {
			f, g := flows[rng.IntN(len(flows))], flows[rng.IntN(len(flows))]
			if rng.IntN(4) != 0 {
				g = f // mostly, the tap and the interceptor agree
			}
			path, cost := rng.IntN(5), time.Duration(rng.IntN(4))*ms
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(t.Context(), time.Duration(1+i%40)*ms)
				defer cancel()
				ctx, in := c.Enter(ctx, f)
				if !in {
					return
				}
				switch path {
				case 0: // rejected before Acquire (a quota), or a reset stream
					return
				case 1: // a stream
					c.Leave(ctx)
					return
				case 2: // its context ends before it reaches Acquire
					cancel()
					time.Sleep(time.Nanosecond) // its release runs while time stands
				}
				p, err := c.Acquire(ctx, g)
				if err != nil {
					return
				}
				time.Sleep(cost)
				p.Done()
			})
			if i%7 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		wg.Wait()
		synctest.Wait()
		s := c.Snapshot()
		if s.Inside != 0 || s.Inflight != 0 || s.Queued != 0 {
			t.Errorf("inside %d, inflight %d, queued %d after every call ended; want 0, 0, 0", s.Inside, s.Inflight, s.Queued)
		}
		if c.owed != 0 || len(c.holding) != 0 {
			t.Errorf("owed %d, flows holding places %d after every call ended; want 0, 0", c.owed, len(c.holding))
		}
		forgets(t, c)
		if s.ShedBy(ShedTap) == 0 || s.ShedBy(ShedDisplaced) == 0 {
			t.Errorf("%d tap and %d displaced sheds: the mix should reach both paths", s.ShedBy(ShedTap), s.ShedBy(ShedDisplaced))
		}
		for i := range 3 {
			if _, in := c.Enter(t.Context(), Flow{Key: "a"}); !in {
				t.Fatalf("Enter #%d in an empty server = false", i+1)
			}
		}
	})
}

// stepClock is a clock that moves only when told.
type stepClock struct{ t atomic.Int64 }

func (s *stepClock) Now() time.Time          { return time.Unix(0, s.t.Load()) }
func (s *stepClock) advance(d time.Duration) { s.t.Add(int64(d)) }

// A call that takes a millisecond or more yields the CPU once when it is
// admitted, so that goroutines already waiting for it (a connection's
// reader and writer) run first; a cheaper one does not.
func TestAdmittedLongCallsYield(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, tc := range []struct {
		cost  time.Duration
		yield bool
	}{{100 * time.Microsecond, false}, {2 * ms, true}} {
		clk := &stepClock{}
		c := newTest(t, WithClock(clk))
		for range 16 {
			p, err := c.Acquire(t.Context(), Flow{Key: "teach"})
			if err != nil {
				t.Fatal(err)
			}
			clk.advance(tc.cost)
			p.Done()
		}
		// The race detector shuffles the run queue at times: three
		// tries, of which a yielding call lets the goroutine run first
		// in at least one and one that does not yield in none.
		yielded := false
		for range 3 {
			var ran atomic.Bool
			done := make(chan struct{})
			go func() { ran.Store(true); close(done) }() // runnable, not running: one CPU
			p, err := c.Acquire(t.Context(), Flow{Key: "call"})
			yielded = yielded || ran.Load()
			if err != nil {
				t.Fatal(err)
			}
			p.Done()
			<-done
		}
		if yielded != tc.yield {
			t.Errorf("calls of %v: a waiting goroutine ran before the admitted call = %v, want %v", tc.cost, yielded, tc.yield)
		}
	}
}

// A call that reaches Acquire without Enter (a gRPC server without the tap
// handle) is counted, and the controller says so once.
func TestUntappedCallsAreReported(t *testing.T) {
	var buf bytes.Buffer
	c := newTest(t, WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	ctx, in := c.Enter(t.Context(), Flow{Key: "a"})
	if !in {
		t.Fatal("Enter = false in an empty server")
	}
	p, err := c.Acquire(ctx, Flow{Key: "a"})
	if err != nil {
		t.Fatal(err)
	}
	p.Done()
	if n := c.Snapshot().Untapped; n != 0 || buf.Len() != 0 {
		t.Fatalf("after a call that entered: Untapped = %d, log %q; want 0 and nothing", n, buf.String())
	}
	for range 3 {
		p, err := c.Acquire(t.Context(), Flow{Key: "a"})
		if err != nil {
			t.Fatal(err)
		}
		p.Done()
	}
	if n := c.Snapshot().Untapped; n != 3 {
		t.Errorf("Untapped = %d after three calls without Enter, want 3", n)
	}
	if got := strings.Count(buf.String(), "without Enter"); got != 1 || !strings.Contains(buf.String(), "level=WARN") {
		t.Errorf("log %q: want one warning", buf.String())
	}
}

// WithClock(nil) restores the real clock, as in every package.
func TestNilClockIsTheDefault(t *testing.T) {
	c, err := New(WithClock(&stepClock{}), WithClock(nil))
	if err != nil {
		t.Fatal(err)
	}
	if since := time.Since(c.Snapshot().Since); since < 0 || since > time.Minute {
		t.Errorf("Since = %v, %v ago: want the real clock's now", c.Snapshot().Since, since)
	}
}

// The queue keeps its long target through a shed that is a burst among
// many admitted calls, and takes the short one while more than a tenth of
// the calls offered lately are shed: an overload.
func TestShortTargetOnlyUnderOverload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t)
		f := Flow{Key: "f"}
		if got := c.Snapshot().Target; got != 25*ms {
			t.Fatalf("target %v on a new controller, want 25ms", got)
		}
		// One slot held, a queue of 4 full, and one more call: 1 shed of 6.
		held, _ := c.Acquire(t.Context(), f)
		var waiting []chan result
		for range 4 {
			waiting = append(waiting, acquireAsync(t.Context(), c, f))
			synctest.Wait()
		}
		if _, err := c.Acquire(t.Context(), f); err == nil {
			t.Fatal("a call into a full queue was admitted")
		}
		if got := c.Snapshot().Target; got != 5*ms {
			t.Errorf("target %v after 1 of 6 calls shed, want 5ms", got)
		}
		held.Done()
		for _, ch := range waiting {
			r := <-ch
			if r.err != nil {
				t.Fatal(r.err)
			}
			r.p.Done()
		}
		// 14 more calls served: 1 shed of 20 is a burst, not an overload.
		for range 14 {
			p, err := c.Acquire(t.Context(), f)
			if err != nil {
				t.Fatal(err)
			}
			p.Done()
		}
		if got := c.Snapshot().Target; got != 25*ms {
			t.Errorf("target %v after 1 of 20 calls shed, want 25ms", got)
		}
	})
}

// forgets checks, in a bubble, that c remembers the flows of calls that
// ended until forgetAfter has passed, and then forgets them all as a new
// flow arrives.
func forgets(t *testing.T, c *Controller) {
	t.Helper()
	if len(c.flows) == 0 {
		t.Error("no flow remembered right after its calls ended")
	}
	time.Sleep(forgetAfter)
	ctx, in := c.Enter(t.Context(), Flow{Key: "new", Weight: 3})
	if !in {
		t.Fatal("Enter(new) = false in an empty server")
	}
	c.Leave(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.flows) != 1 || c.weights != 3 || len(c.holding) != 0 {
		t.Errorf("flows %d, weights %v, holding %d once the others were idle for %v; want 1, 3, 0", len(c.flows), c.weights, len(c.holding), forgetAfter)
	}
}

// A flow that asks for no more than an equal split of what the server
// completes enters a full server even when no flow can give it a place,
// and is never the flow that gives one up; a flow that asks for more, or
// one the controller has not seen long enough to know, is shed.
func TestWithinSplitEntersBeyondThePlaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t)
		teach(t, c, 10*ms) // about 100 calls/s
		light := Flow{Key: "light"}
		for range 10 { // 10/s for a second
			ctx, in := c.Enter(t.Context(), light)
			if !in {
				t.Fatal("Enter(light) = false in an empty server")
			}
			c.Leave(ctx)
			time.Sleep(100 * ms)
		}
		// A flood fills every place.
		heavy := Flow{Key: "heavy"}
		var held []context.Context
		for {
			ctx, in := c.Enter(t.Context(), heavy)
			if !in {
				break
			}
			held = append(held, ctx)
		}
		// light was let in more calls lately than the flood, so it takes
		// no place of the flood's; it asks for a tenth of an equal split
		// (100/s among three flows), so it enters beyond the places.
		ctx, in := c.Enter(t.Context(), light)
		if !in {
			t.Fatalf("Enter(light) = false with %d places held by a flood; want it let in beyond them", len(held))
		}
		if got := c.Snapshot().Inside; got != len(held)+1 {
			t.Errorf("inside %d, want the %d places and light's call", got, len(held))
		}
		c.mu.Lock()
		within := map[string]bool{}
		for _, k := range []string{"light", "heavy"} {
			within[k] = c.withinSplitLocked(c.flows[flowKey{key: k}], c.o.now())
		}
		c.mu.Unlock()
		if !within["light"] || within["heavy"] {
			t.Errorf("within their split: %v; want light, not heavy", within)
		}
		// A flow the controller has just met has shown nothing yet: it
		// gets a place only from a flow over its split, as any flow.
		c.mu.Lock()
		fresh := c.flowLocked(Flow{Key: "fresh"}, c.o.now())
		fresh.offered.add(c.o.now(), 1)
		if c.withinSplitLocked(fresh, c.o.now()) {
			t.Error("a flow met a moment ago is within its split")
		}
		c.mu.Unlock()
		// Nor does a call of a lower priority while higher ones wait.
		p, err := c.Acquire(ctx, light)
		if err != nil {
			t.Fatal(err)
		}
		vip := Flow{Key: "vip", Priority: floodgate.Critical}
		first, err := c.Acquire(t.Context(), vip) // runs beside light's call
		if err != nil {
			t.Fatal(err)
		}
		waiting := acquireAsync(t.Context(), c, vip)
		synctest.Wait()
		if s := c.Snapshot(); s.Queued != 1 {
			t.Fatalf("queued %d, want the second critical call waiting", s.Queued)
		}
		c.mu.Lock()
		if c.withinSplitLocked(c.flows[flowKey{key: "light"}], c.o.now()) {
			t.Error("light is within its split while a critical call waits")
		}
		c.mu.Unlock()
		p.Done()
		first.Done()
		if r := <-waiting; r.err == nil {
			r.p.Done()
		}
	})
}

// A first control step at the instant the controller was made (calls that
// took no time on the clock) leaves the throughput unknown rather than
// infinite, so that the equal split, and the protection of the flows
// within it, still works after the next step.
func TestWithinSplitAfterAnInstantStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t)
		for range 16 { // the clock does not move: the first step at dt = 0
			p, err := c.Acquire(t.Context(), Flow{Key: "teach"})
			if err != nil {
				t.Fatal(err)
			}
			p.Done()
		}
		teach(t, c, 10*ms) // about 100 calls/s
		if got := c.Snapshot().Throughput; !(got > 0) || math.IsInf(got, 0) {
			t.Fatalf("Throughput = %v after 16 calls of 10 ms, want a positive, finite rate", got)
		}
		light := Flow{Key: "light"}
		for range 10 { // 10/s for a second
			ctx, in := c.Enter(t.Context(), light)
			if !in {
				t.Fatal("Enter(light) = false in an empty server")
			}
			c.Leave(ctx)
			time.Sleep(100 * ms)
		}
		for { // a flood fills every place
			if _, in := c.Enter(t.Context(), Flow{Key: "heavy"}); !in {
				break
			}
		}
		if _, in := c.Enter(t.Context(), light); !in {
			t.Error("Enter(light) = false with the places held by a flood; want it let in within its split")
		}
	})
}

// A flood of made-up flow keys is bounded: beyond maxFlows the calls share
// one flow, and flows idle for forgetAfter are forgotten as new ones come.
func TestManyFlowsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t)
		enterLeave := func(key string) {
			ctx, in := c.Enter(t.Context(), Flow{Key: key})
			if in {
				c.Leave(ctx)
			}
		}
		for i := range maxFlows + 1000 {
			enterLeave(fmt.Sprint("addr-", i))
		}
		c.mu.Lock()
		n, overflow := len(c.flows), c.flows[flowKey{key: overflowKey}] != nil
		c.mu.Unlock()
		if n != maxFlows+1 || !overflow {
			t.Fatalf("%d flows, overflow %v after %d keys; want %d and the overflow flow", n, overflow, maxFlows+1000, maxFlows+1)
		}
		time.Sleep(forgetAfter)
		for i := range maxFlows / 8 {
			enterLeave(fmt.Sprint("later-", i))
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if n := len(c.flows); n > maxFlows/8+1 {
			t.Errorf("%d flows once the first ones were idle for %v, want at most the %d new ones", n, forgetAfter, maxFlows/8)
		}
		if n := len(c.idle) - c.idleHead; n > len(c.flows) {
			t.Errorf("%d flows listed idle, more than the %d remembered", n, len(c.flows))
		}
	})
}
