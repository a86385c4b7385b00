package overload

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
)

// testLaw starts at 4 slots, ends its start-up probe after one sample and
// steps on every completion a millisecond apart, so that tests control the
// limit with a few calls.
var testLaw = Law{InitialLimit: 4, MinLimit: 1, MinSamples: 1, Interval: ms, ProbeSamples: 1, ProbeEvery: time.Hour}

// warm ends c's start-up probe with one call of cost.
func warm(t *testing.T, c *Controller, cost time.Duration) {
	t.Helper()
	for c.Snapshot().Probing {
		p, err := c.Acquire(context.Background(), Flow{Key: "warm"})
		if err != nil {
			t.Fatalf("warm-up Acquire: %v", err)
		}
		time.Sleep(cost)
		p.Done()
	}
}

func newTest(t *testing.T, opts ...Option) *Controller {
	t.Helper()
	c, err := New(append([]Option{WithLaw(testLaw)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	warm(t, c, 2*ms)
	if s := c.Snapshot(); s.Limit != 4 || s.Baseline != 2*ms {
		t.Fatalf("after the warm-up: limit %v baseline %v, want 4 and 2ms", s.Limit, s.Baseline)
	}
	return c
}

// acquireAsync starts an Acquire and returns where its outcome will arrive.
func acquireAsync(ctx context.Context, c *Controller, f Flow) chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := c.Acquire(ctx, f)
		ch <- result{p, err}
	}()
	return ch
}

type result struct {
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

func TestFairShareOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithMaxWait(time.Second))
		heavy, light := Flow{Key: "heavy"}, Flow{Key: "light"}
		var held []Permit
		for range 4 {
			p, err := c.Acquire(t.Context(), heavy)
			if err != nil {
				t.Fatalf("Acquire with free slots: %v", err)
			}
			held = append(held, p)
		}
		var queued []chan result
		for range 4 {
			queued = append(queued, acquireAsync(t.Context(), c, heavy))
			synctest.Wait()
		}
		if s := c.Snapshot(); s.Inflight != 4 || s.Queued != 4 {
			t.Fatalf("in flight %d, queued %d, want 4 and 4", s.Inflight, s.Queued)
		}
		_, h := c.Overloaded(t.Context(), heavy)
		_, l := c.Overloaded(t.Context(), light)
		if !h || l {
			t.Errorf("Overloaded(heavy, light) = %v, %v, want true, false", h, l)
		}

		// The light flow, under its share, displaces heavy's newest waiter.
		lightCh := acquireAsync(t.Context(), c, light)
		synctest.Wait()
		r := <-queued[3]
		if cause, ok := shedCause(r.err); !ok || cause != ShedDisplaced {
			t.Fatalf("heavy's newest waiter got %v, want displaced", r.err)
		}
		// More of heavy's calls are shed at once: heavy is the one over
		// its share.
		if _, err := c.Acquire(t.Context(), heavy); !errors.Is(err, ErrShed) {
			t.Fatalf("heavy over its share: %v, want shed", err)
		} else if cause, _ := shedCause(err); cause != ShedQueueFull {
			t.Fatalf("cause %v, want queue_full", cause)
		}

		// A freed slot goes to light, though heavy's calls waited longer.
		time.Sleep(2 * ms)
		held[0].Done()
		synctest.Wait()
		select {
		case r := <-lightCh:
			if r.err != nil {
				t.Fatalf("light: %v", r.err)
			}
			r.p.Done()
		default:
			t.Fatal("the freed slot did not go to the light flow")
		}
		// Then heavy's waiters, oldest first.
		held[1].Done()
		synctest.Wait()
		select {
		case r := <-queued[0]:
			if r.err != nil {
				t.Fatal(r.err)
			}
			r.p.Done()
		default:
			t.Fatal("heavy's oldest waiter was not admitted next")
		}
		for _, p := range held[2:] {
			p.Done()
		}
		for _, ch := range queued[1:3] {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			} else {
				r.p.Done()
			}
		}
		s := c.Snapshot()
		if s.Inflight != 0 || s.Queued != 0 || len(c.flows) != 0 {
			t.Fatalf("after every call ended: %d in flight, %d queued, %d flows kept", s.Inflight, s.Queued, len(c.flows))
		}
		if s.Shed[ShedDisplaced] != 1 || s.Shed[ShedQueueFull] != 1 {
			t.Errorf("Shed = %v, want one displaced and one queue_full", s.Shed)
		}
	})
}

func TestWeights(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithMaxWait(time.Second))
		big, small := Flow{Key: "big", Weight: 3}, Flow{Key: "small"}
		// big holds 3 slots, small 1: both at 1 per unit of weight.
		var held []Permit
		for _, f := range []Flow{big, big, big, small} {
			p, err := c.Acquire(t.Context(), f)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, p)
		}
		bigCh := acquireAsync(t.Context(), c, big)
		synctest.Wait()
		smallCh := acquireAsync(t.Context(), c, small)
		synctest.Wait()
		// big has 3/3 = 1 in flight per weight, small 1/1: a tie, so the
		// older waiter (big) gets the slot.
		held[0].Done()
		synctest.Wait()
		select {
		case r := <-bigCh:
			r.p.Done()
		default:
			t.Fatal("the weighted tie did not go to the older waiter")
		}
		synctest.Wait()
		r := <-smallCh // the slot big's call freed
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.p.Done()
		for _, p := range held[1:] {
			p.Done()
		}
	})
}

func TestPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithMaxWait(time.Second))
		def, batch, crit := Flow{Key: "a"}, Flow{Key: "b", Priority: Sheddable}, Flow{Key: "c", Priority: Critical}
		var held []Permit
		for range 4 {
			p, _ := c.Acquire(t.Context(), def)
			held = append(held, p)
		}
		var waiting []chan result
		for range 4 {
			waiting = append(waiting, acquireAsync(t.Context(), c, def))
			synctest.Wait()
		}
		// A sheddable call finds the queue full of default ones: shed.
		if _, err := c.Acquire(t.Context(), batch); !errors.Is(err, ErrShed) {
			t.Fatalf("sheddable call into a full queue: %v, want shed", err)
		}
		// A critical one displaces a default waiter even of a lighter flow.
		critCh := acquireAsync(t.Context(), c, crit)
		synctest.Wait()
		if r := <-waiting[3]; !errors.Is(r.err, ErrShed) {
			t.Fatalf("default waiter: %v, want displaced", r.err)
		}
		held[0].Done()
		synctest.Wait()
		select {
		case r := <-critCh:
			r.p.Done()
		default:
			t.Fatal("the critical call was not admitted first")
		}
		for _, p := range held[1:] {
			p.Done()
		}
		for _, ch := range waiting[:3] {
			r := <-ch
			if r.err != nil {
				t.Fatal(r.err)
			}
			r.p.Done()
		}
	})
}

func TestTimeoutDeadlineAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t, WithMaxWait(10*ms))
		f := Flow{Key: "f"}
		var held []Permit
		for range 4 {
			p, _ := c.Acquire(t.Context(), f)
			held = append(held, p)
		}
		start := time.Now()
		_, err := c.Acquire(t.Context(), f)
		if cause, ok := shedCause(err); !ok || cause != ShedTimeout {
			t.Fatalf("a call that found no slot: %v, want wait_timeout", err)
		}
		if waited := time.Since(start); waited != 10*ms {
			t.Errorf("waited %v, want the 10ms maximum", waited)
		}

		// A deadline closer than the baseline (2ms): shed at once.
		ctx, cancel := context.WithTimeout(t.Context(), ms)
		_, err = c.Acquire(ctx, f)
		cancel()
		if cause, ok := shedCause(err); !ok || cause != ShedDeadline {
			t.Fatalf("a call without time to run: %v, want deadline", err)
		}
		// A deadline sooner than the longest wait bounds the wait, less
		// the baseline the call needs to run.
		ctx, cancel = context.WithTimeout(t.Context(), 6*ms)
		start = time.Now()
		_, err = c.Acquire(ctx, f)
		cancel()
		if cause, _ := shedCause(err); cause != ShedTimeout || time.Since(start) != 4*ms {
			t.Fatalf("Acquire with 6ms left = %v after %v, want wait_timeout after 4ms", err, time.Since(start))
		}

		// A caller that gives up gets its context's error, not a shed.
		ctx, cancel = context.WithCancel(t.Context())
		ch := acquireAsync(ctx, c, f)
		synctest.Wait()
		cancel()
		if r := <-ch; !errors.Is(r.err, context.Canceled) || errors.Is(r.err, ErrShed) {
			t.Fatalf("canceled wait: %v, want context.Canceled", r.err)
		}
		s := c.Snapshot()
		if s.Queued != 0 || s.Shed[ShedTimeout] != 2 || s.Shed[ShedDeadline] != 1 {
			t.Errorf("snapshot %+v, want nothing queued, 2 timeouts and 1 deadline", s)
		}
		for _, p := range held {
			p.Done()
		}
	})
}

func TestStateChangesAreLoggedWithTheirSignals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		var mu sync.Mutex
		logger := slog.New(slog.NewTextHandler(lockedWriter{&buf, &mu}, &slog.HandlerOptions{Level: slog.LevelInfo}))
		var changes []State
		c := newTest(t, WithMaxWait(ms), WithLogger(logger), WithOnChange(func(s Snapshot) {
			changes = append(changes, s.State)
		}))
		f := Flow{Key: "f"}
		var held []Permit
		for range 4 {
			p, _ := c.Acquire(t.Context(), f)
			held = append(held, p)
		}
		if _, err := c.Acquire(t.Context(), f); !errors.Is(err, ErrShed) {
			t.Fatalf("Acquire = %v, want shed", err)
		}
		if !c.Shedding() {
			t.Fatal("not Shedding after a shed call")
		}
		// A step a second after the last shed call: Open again.
		time.Sleep(2 * ms)
		held[0].Done()
		if !c.Shedding() {
			t.Fatal("Open again right after a shed call")
		}
		time.Sleep(time.Second)
		held[1].Done()
		if c.Shedding() {
			t.Fatal("still Shedding after a clean interval")
		}
		for _, p := range held[2:] {
			p.Done()
		}
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		for _, want := range []string{
			"level=WARN msg=\"overload: shedding", "level=INFO msg=\"overload: open",
			"decided_by=", "limit=", "inflight=4", "queued=", "rtt=", "baseline=2ms", "queue_delay=",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("log lacks %q:\n%s", want, out)
			}
		}
		if !slices.Contains(changes, Shedding) || !slices.Contains(changes, Open) {
			t.Errorf("OnChange saw %v, want Shedding and Open", changes)
		}
	})
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	for _, o := range []Option{WithMaxWait(-1), WithRetryAfter(-1), WithClock(nil), WithLaw(Law{Tolerance: 1})} {
		if _, err := New(o); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("New = %v, want ErrInvalidOption", err)
		}
	}
}

// simulate serves Poisson calls from the flows on one simulated CPU that
// runs one goroutine at a time, in the order they become ready, for dur,
// with deadline on every call, and returns the calls completed within slo
// per flow, the calls sent per flow, and the admitted calls' latencies.
// Every call first spends pre on the CPU to reach the controller (reading
// its request, the interceptors), then cost in its handler if admitted or
// pre/2 more if shed: like a gRPC server whose handlers do not yield, the
// calls queue before the controller.
func simulate(t *testing.T, c *Controller, rates map[string]float64, cost, deadline, slo, dur time.Duration) (ok, sent map[string]int, lat []time.Duration) {
	const pre = 100 * time.Microsecond
	t.Helper()
	var cpu cpuSim
	var mu sync.Mutex
	ok, sent = map[string]int{}, map[string]int{}
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	names := slices.Sorted(maps.Keys(rates))
	for _, name := range names {
		rate := rates[name]
		wg.Add(1)
		seed := rng.Uint64()
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 7))
			for time.Since(start) < dur {
				time.Sleep(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
				mu.Lock()
				sent[name]++
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					begin := time.Now()
					ctx, cancel := context.WithTimeout(Arrived(context.Background(), begin), deadline)
					defer cancel()
					// The call's goroutine waits its turn for the CPU,
					// then runs to its end without yielding: its request,
					// the controller, then the handler or the rejection.
					cpu.acquire()
					defer cpu.release()
					time.Sleep(pre)
					p, err := c.Acquire(ctx, Flow{Key: name})
					if err != nil {
						time.Sleep(pre / 2)
						return
					}
					defer p.Done()
					if ctx.Err() != nil {
						return
					}
					time.Sleep(cost)
					d := time.Since(begin)
					mu.Lock()
					lat = append(lat, d)
					if d <= slo {
						ok[name]++
					}
					mu.Unlock()
				}()
			}
		}()
	}
	wg.Wait()
	return ok, sent, lat
}

// Under three times the load one CPU can serve, one flow sending most of
// it, the controller keeps the CPU busy with calls that meet their SLO,
// and the quiet flows keep nearly all of theirs. Without it, every call
// would wait behind the flood and miss its SLO. The simulated CPU is
// harsher than Go's scheduler (strict FIFO, every call's request costs
// CPU before the controller sees it); the overload experiment in
// bench/cmd/overload measures the real thing.
func TestSimulatedOverload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := New()
		if err != nil {
			t.Fatal(err)
		}
		const cost = 3 * ms // capacity 333/s
		rates := map[string]float64{"noisy": 900}
		for _, q := range []string{"q1", "q2", "q3", "q4", "q5"} {
			rates[q] = 20
		}
		dur := 10 * time.Second
		ok, sent, lat := simulate(t, c, rates, cost, 500*ms, 100*ms, dur)
		total := 0
		for _, n := range ok {
			total += n
		}
		capacity := int(dur / cost)
		if total < capacity*65/100 {
			t.Errorf("goodput %d of a capacity of %d calls (%.0f%%), want ≥ 65%%", total, capacity, 100*float64(total)/float64(capacity))
		}
		for name, n := range sent {
			if name != "noisy" && ok[name] < n*85/100 {
				t.Errorf("quiet flow %s: %d of %d calls within the SLO, want ≥ 85%%", name, ok[name], n)
			}
		}
		slices.Sort(lat)
		if p90 := lat[len(lat)*90/100]; p90 > 100*ms {
			t.Errorf("admitted p90 %v, want within the 100ms SLO", p90)
		}
		s := c.Snapshot()
		t.Logf("goodput %d/%d, limit %.1f, baseline %v, rtt %v, shed %v", total, capacity, s.Limit, s.Baseline, s.RTT, s.Shed)
	})
}

// At half the load one CPU can serve, nothing is shed.
func TestSimulatedHalfLoadShedsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := New()
		if err != nil {
			t.Fatal(err)
		}
		rates := map[string]float64{"a": 80, "b": 40, "c": 40}
		_, _, _ = simulate(t, c, rates, 3*ms, 500*ms, 100*ms, 10*time.Second)
		if s := c.Snapshot(); s.ShedTotal() != 0 {
			t.Errorf("shed %v at half load, want none", s.Shed)
		}
	})
}

// cpuSim is one simulated CPU: goroutines run on it one at a time, in the
// order they asked for it.
type cpuSim struct {
	mu    sync.Mutex
	busy  bool
	queue []chan struct{}
}

func (c *cpuSim) acquire() {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	c.queue = append(c.queue, ch)
	c.mu.Unlock()
	<-ch // handed the CPU
}

func (c *cpuSim) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.busy = false
		return
	}
	close(c.queue[0])
	c.queue = c.queue[1:]
}

// The guard's readings reach the snapshot, and a low one keeps a long
// queueing delay from setting a rate: the wait is not this server's.
func TestGuardReadings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cpu := 0.3
		c := newTest(t, WithGuard(GuardFunc(func() (float64, time.Duration) { return cpu, 7 * ms })))
		call := func(queued time.Duration) {
			ctx := Arrived(t.Context(), time.Now().Add(-queued))
			p, err := c.Acquire(ctx, Flow{Key: "f"})
			if errors.Is(err, ErrShed) {
				return // once a rate is set
			} else if err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * ms)
			p.Done()
		}
		for range 5 {
			call(50 * ms)
		}
		s := c.Snapshot()
		if s.CPU != 0.3 || s.SchedP99 != 7*ms {
			t.Errorf("snapshot CPU %v, SchedP99 %v, want the guard's 0.3 and 7ms", s.CPU, s.SchedP99)
		}
		if s.QueueDelay != 50*ms || s.Rate != 0 {
			t.Errorf("queue delay %v, rate %v at 30%% CPU, want 50ms and no rate", s.QueueDelay, s.Rate)
		}
		cpu = 0.95
		for range 3 {
			call(50 * ms)
		}
		if s := c.Snapshot(); s.Rate == 0 || s.RateCause != CauseQueue {
			t.Errorf("rate %v (%v) at 95%% CPU and 50ms of queueing, want one set by queue_delay", s.Rate, s.RateCause)
		}
	})
}

// A *cpugate.Gate is a guard the controller asks for a current reading.
var _ currentGuard = (*cpugate.Gate)(nil)

// scriptedGuard is a Guard whose latest reading is reading and whose use
// since it is current; peeks counts the calls of Current.
type scriptedGuard struct {
	reading, current float64
	peeks            int
}

func (g *scriptedGuard) Reading() (float64, time.Duration) { return g.reading, 0 }
func (g *scriptedGuard) Current() (float64, bool) {
	g.peeks++
	return g.current, true
}

// A queue that builds within an interval steps the law at once, and a
// guard whose latest reading is low is asked for the CPU use since: a
// burst that began after the reading meets a rate within tens of
// milliseconds, and a wait for a CPU this server does not use sets none.
func TestOnsetAsksTheGuardForACurrentReading(t *testing.T) {
	for _, tc := range []struct {
		name     string
		current  float64
		wantRate bool
	}{
		{"busy since the reading", 0.95, true},
		{"idle since the reading", 0.3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := &scriptedGuard{reading: 0.3, current: tc.current}
				c, err := New(WithLaw(Law{ProbeSamples: 1, ProbeEvery: time.Hour}), WithGuard(g))
				if err != nil {
					t.Fatal(err)
				}
				warm(t, c, 2*ms)
				// The warm-up's last call stepped the law; 10 ms later,
				// calls that queued 50 ms (the target is 6 ms) arrive
				// one after another, each taking 2 ms.
				start := time.Now()
				time.Sleep(10 * ms)
				for range 10 {
					p, err := c.Acquire(Arrived(t.Context(), time.Now().Add(-50*ms)), Flow{Key: "f"})
					if err != nil {
						break // shed once a rate is set
					}
					time.Sleep(2 * ms)
					p.Done()
				}
				if took := time.Since(start); took >= DefaultInterval {
					t.Fatalf("the calls took %v, not within an interval", took)
				}
				if g.peeks == 0 {
					t.Error("the guard was not asked for its current reading")
				}
				s := c.Snapshot()
				if got := s.Rate > 0; got != tc.wantRate {
					t.Errorf("rate %v (CPU %v) within %v of the queue, want a rate: %v", s.Rate, s.CPU, DefaultInterval, tc.wantRate)
				}
			})
		})
	}
}

// controllerWithFlow returns a default controller with one flow, "noisy",
// for tests that set its internals under c.mu.
func controllerWithFlow(t *testing.T) (*Controller, Flow, *flow) {
	t.Helper()
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	f := Flow{Key: "noisy"}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c, f, c.flow(f)
}

// mustShedAtTap fails t unless the tap would turn a call of f away now;
// why says what makes it.
func mustShedAtTap(t *testing.T, c *Controller, f Flow, why string) {
	t.Helper()
	if _, shed := c.Overloaded(t.Context(), f); !shed {
		t.Fatalf("Overloaded = false for %s", why)
	}
}

// A flood turned away at the tap (by Overloaded) is still demand,
// and a shed of the rate: otherwise the fair shares would take it for a
// flow that gets all it asks.
func TestTapRejectionsCountAsDemand(t *testing.T) {
	c, f, fl := controllerWithFlow(t)
	c.mu.Lock()
	c.ctl.Rate, fl.alloc, fl.tokens, fl.at = 100, 10, 0, c.o.now()
	c.mu.Unlock()
	mustShedAtTap(t, c, f, "a flow without tokens under a rate")
	c.mu.Lock()
	defer c.mu.Unlock()
	if fl.arrivals != 1 || c.rateShed != 1 {
		t.Errorf("after a tap rejection: arrivals %d, rate sheds %d; want 1 and 1", fl.arrivals, c.rateShed)
	}
	// The flow's next share sees the flood: a quiet flow asks 10/s, the
	// flood 1,000/s of which the tap let none in.
	quiet := c.flow(Flow{Key: "quiet"})
	fl.demand, quiet.demand = 0, 10
	fl.arrivals, quiet.arrivals = 1000, 10
	c.share(time.Second, c.o.now())
	if want := 100 - 10.0; math.Abs(fl.alloc-want) > 1e-9 {
		t.Errorf("the flood's share %v of a rate of 100 beside a flow asking 10, want %v", fl.alloc, want)
	}
}

// While every slot and queue place is taken, a call of a flow over its
// share turned away at the tap counts in its flow's demand too, and the
// tap sheds it before it takes a token of a limited rate for it: the call
// would be shed after its request is read, and the token is left for the
// flow's next call.
func TestTapQueueRejectionsCountAsDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, f, fl := controllerWithFlow(t)
		c.mu.Lock()
		c.ctl.Rate, c.ctl.Limit, fl.alloc, fl.tokens, fl.at = 100, 1, 10, 1, c.o.now()
		fl.inflight, c.inflight = 1, 1
		fl.q, c.queued = make([]*waiter, c.queueCap()), c.queueCap()
		c.mu.Unlock()
		mustShedAtTap(t, c, f, "the only flow with every slot and place taken")
		c.mu.Lock()
		defer c.mu.Unlock()
		if fl.arrivals != 1 || fl.tokens != 1 {
			t.Errorf("after a tap rejection: arrivals %d, tokens %v; want 1 and the 1 it had", fl.arrivals, fl.tokens)
		}
	})
}

// When the rate covers every flow's demand, each flow's share is the
// largest demand scaled by the room the rate leaves, not the whole rate.
func TestShareWhenEveryFlowIsSatisfied(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.o.now()
	noisy, quiet := c.flow(Flow{Key: "noisy"}), c.flow(Flow{Key: "quiet"})
	noisy.demand, quiet.demand = 50, 10
	noisy.arrivals, quiet.arrivals = 5, 1
	c.ctl.Rate = 100
	c.share(time.Second, now)
	// After a second, the smoothed demands are the arrivals: 5 and 1,
	// 6 in all: the rate has room for 100/6 times that.
	if want := 5 * 100.0 / 6; math.Abs(noisy.alloc-want) > 1e-9 || math.Abs(quiet.alloc-want) > 1e-9 {
		t.Errorf("shares %v and %v of a rate of 100, want %v each", noisy.alloc, quiet.alloc, want)
	}

	// With unequal weights, no flow's share exceeds the rate: a light
	// flow of weight 0.1 asking 5 puts the level at 50 per unit weight.
	light := c.flow(Flow{Key: "light", Weight: 0.1})
	light.demand, light.arrivals = 5, 5
	noisy.arrivals, quiet.arrivals = 5, 1
	c.share(time.Second, now)
	for _, fl := range []*flow{noisy, quiet, light} {
		if fl.alloc > c.ctl.Rate {
			t.Errorf("flow %s (weight %v): share %v of a rate of %v", fl.k.key, fl.weight, fl.alloc, c.ctl.Rate)
		}
	}
}

// The tap takes a passing call's token from its flow's share, so that calls
// read in one batch cannot all pass on the same last token only to be shed
// after their requests are read; Acquire then takes no second token.
func TestTapReservesTheToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, f, fl := controllerWithFlow(t)
		c.mu.Lock()
		c.ctl.Rate, fl.alloc, fl.tokens, fl.at = 100, 10, 1, c.o.now()
		c.mu.Unlock()
		ctx, shed := c.Overloaded(t.Context(), f)
		if shed {
			t.Fatal("the tap shed a call of a flow with a token left")
		}
		if _, shed := c.Overloaded(t.Context(), f); !shed {
			t.Fatal("a second call read at the same time passed the tap on the same token")
		}
		p, err := c.Acquire(ctx, f)
		if err != nil {
			t.Fatalf("Acquire of the call whose token the tap took: %v", err)
		}
		p.Done()
		if _, err := c.Acquire(t.Context(), f); !errors.Is(err, ErrShed) {
			t.Fatalf("Acquire of a call the tap did not see, with no token left: %v, want shed", err)
		}
		if s := c.Snapshot(); s.Admitted != 1 || s.Shed[ShedTap] != 1 || s.Shed[ShedRate] != 1 {
			t.Errorf("admitted %d, shed %v; want 1 admitted, 1 shed at the tap and 1 by the rate", s.Admitted, s.Shed)
		}
	})
}

// Under a limited rate, a flow without a call in one interval keeps its
// demand: forgotten, it would come back as a flow asking nothing, and the
// shares would let the flows admit more than the rate in all. A new flow's
// demand is its first interval's arrivals.
func TestQuietIntervalKeepsDemand(t *testing.T) {
	c, _, noisy := controllerWithFlow(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.o.now()
	quiet := c.flow(Flow{Key: "quiet"})
	k := quiet.k
	c.ctl.Rate = 100
	noisy.demand, quiet.demand = 500, 20
	noisy.arrivals = 50 // and none of quiet's in these 100 ms
	c.share(100*ms, now)
	if c.flows[k] != quiet {
		t.Fatal("a flow asking 20/s was forgotten after one interval without a call")
	}
	if math.Abs(quiet.demand-18) > 1e-9 {
		t.Errorf("quiet's demand %v after an interval without a call, want 18 (20 smoothed with 0)", quiet.demand)
	}
	if used := quiet.demand + noisy.alloc; used > c.ctl.Rate+1e-9 {
		t.Errorf("quiet asks %v and noisy may admit %v: %v in all, above the rate of %v", quiet.demand, noisy.alloc, used, c.ctl.Rate)
	}
	fresh := c.flow(Flow{Key: "fresh"})
	fresh.arrivals = 3
	noisy.arrivals = 50
	c.share(100*ms, now)
	if math.Abs(fresh.demand-30) > 1e-9 {
		t.Errorf("a new flow with 3 calls in 100 ms asks %v/s, want 30", fresh.demand)
	}
	// Once its demand has decayed below forgetBelow, it is forgotten.
	for range 40 {
		noisy.arrivals, fresh.arrivals = 50, 3
		c.share(100*ms, now)
	}
	if _, ok := c.flows[k]; ok {
		t.Errorf("a flow idle for 4 s is still tracked, asking %v/s", quiet.demand)
	}
}

// A flow whose last call ends between two steps is kept while the rate is
// limited and it still asks a call per second or more, and the tap's mark
// admits one call only.
func TestEndedCallKeepsItsFlowUnderARate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, f, fl := controllerWithFlow(t)
		c.mu.Lock()
		c.ctl.Rate, fl.demand, fl.alloc, fl.tokens, fl.at = 100, 20, 10, 1, c.o.now()
		c.mu.Unlock()
		ctx, shed := c.Overloaded(t.Context(), f)
		if shed {
			t.Fatal("the tap shed a call of a flow with a token left")
		}
		p, err := c.Acquire(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		fl.arrivals = 0 // a step passed: no call of the flow since
		c.mu.Unlock()
		p.Done()
		c.mu.Lock()
		if c.flows[fl.k] != fl {
			c.mu.Unlock()
			t.Fatal("a flow asking 20/s was forgotten when its only call ended")
		}
		c.mu.Unlock()
		if _, err := c.Acquire(ctx, f); !errors.Is(err, ErrShed) {
			t.Fatalf("a second Acquire on the tap's spent mark: %v, want shed", err)
		}
	})
}

// The share a flow within its share leaves unused goes to the flows that
// ask for more, through spare tokens bounded like a flow's bucket, while
// the quiet flow keeps its own tokens; a lifted rate drops them.
func TestUnusedShareGoesToTheFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, f, noisy := controllerWithFlow(t)
		c.mu.Lock()
		quietF := Flow{Key: "quiet"}
		quiet := c.flow(quietF)
		now := c.o.now()
		c.ctl.Rate = 100
		noisy.alloc, noisy.tokens, noisy.at = 50, 0, now
		quiet.alloc, quiet.tokens, quiet.at = 50, 2, now
		c.mu.Unlock()
		// A second on, the quiet flow's full bucket has overflowed with
		// its whole share; the spare holds what the rate admits in the
		// queueing target (20 ms before anything is measured): 2 calls.
		// The flood, refilled just now, has none of its own.
		time.Sleep(time.Second)
		c.mu.Lock()
		c.refill(quiet, c.o.now())
		noisy.at = c.o.now()
		c.mu.Unlock()
		for i := range 2 {
			if _, shed := c.Overloaded(t.Context(), f); shed {
				t.Fatalf("the flood's call %d was shed with 2 spare tokens the quiet flow left", i+1)
			}
		}
		mustShedAtTap(t, c, f, "the flood after the spare tokens")
		for i := range 2 {
			if _, shed := c.Overloaded(t.Context(), quietF); shed {
				t.Fatalf("the quiet flow's call %d was shed: the flood took its tokens", i+1)
			}
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.spare = 2
		c.ctl.Rate = 0
		c.share(100*time.Millisecond, c.o.now())
		if c.spare != 0 {
			t.Errorf("spare tokens %v after the rate was lifted, want 0", c.spare)
		}
	})
}
