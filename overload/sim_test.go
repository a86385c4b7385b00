package overload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
)

// A simServer is a server in a synctest bubble as the Go runtime runs a gRPC
// server. Calls wait in the socket until the connection's reader gets a
// CPU, which it asks for in turn with every other goroutine (FIFO, the
// scheduler's run queue); it then reads every call waiting and passes each
// through Enter, the tap handle. Every call's goroutine waits for a CPU
// before it reaches Acquire, gives its CPU up while it waits for a slot,
// and takes one again to run its handler. A CPU-bound handler holds its
// CPU for its whole cost; a blocking one (pool > 0) waits cost on one of
// pool connections and holds no CPU.
type simServer struct {
	c    *Controller
	cpu  chan struct{}
	pool chan struct{}
	cost func(now time.Time) time.Duration
	sock chan simCall
}

type simCall struct {
	f    Flow
	done chan bool
}

// read is the connection's reader: it runs until the socket is closed.
func (s *simServer) read() {
	for first := range s.sock {
		s.cpu <- struct{}{}
		batch := []simCall{first}
	more:
		for {
			select {
			case c, ok := <-s.sock:
				if !ok {
					break more
				}
				batch = append(batch, c)
			default:
				break more
			}
		}
		for _, c := range batch {
			ctx, cancel := context.WithTimeout(context.Background(), 500*ms)
			ctx, in := s.c.Enter(ctx, c.f)
			if !in {
				cancel()
				c.done <- false
				continue
			}
			go func() {
				defer cancel()
				c.done <- s.serve(ctx, c.f)
			}()
		}
		<-s.cpu
	}
}

type simResult struct {
	at, end time.Time
	flow    int
	ok      bool
}

func newSim(c *Controller, cpus, pool int, cost func(time.Time) time.Duration) *simServer {
	s := &simServer{c: c, cpu: make(chan struct{}, cpus), cost: cost, sock: make(chan simCall, 1<<16)}
	if pool > 0 {
		s.pool = make(chan struct{}, pool)
	}
	go s.read()
	return s
}

// call sends a call of f and reports whether it completed in time.
func (s *simServer) call(f Flow) bool {
	done := make(chan bool, 1)
	s.sock <- simCall{f, done}
	return <-done
}

func (s *simServer) serve(ctx context.Context, f Flow) (ok bool) {
	s.cpu <- struct{}{} // the goroutine's turn to run
	if s.pool != nil {
		// A blocking handler uses next to no CPU: it gives the CPU up
		// before it waits, for a slot or for a connection.
		<-s.cpu
		p, err := s.c.Acquire(ctx, f)
		if err != nil {
			return false
		}
		s.pool <- struct{}{}
		time.Sleep(s.cost(time.Now()))
		<-s.pool
		p.Done()
		return ctx.Err() == nil
	}
	// A CPU-bound handler keeps its CPU from Acquire to the end of the
	// handler, and its interceptor calls Done before it gives the CPU up.
	p, err := s.c.Acquire(ctx, f)
	if err != nil {
		<-s.cpu
		return false
	}
	time.Sleep(s.cost(time.Now()))
	p.Done()
	<-s.cpu
	return ctx.Err() == nil
}

// simLoad offers Poisson load for dur: rates[i] calls per second of flow i,
// scaled by load(t), and returns every call's result.
func simLoad(s *simServer, rates []float64, load func(time.Duration) float64, dur time.Duration, seed uint64) []simResult {
	return simLoadFrom(s, 0, rates, load, dur, seed)
}

// simLoadFrom is simLoad for flows numbered from first.
func simLoadFrom(s *simServer, first int, rates []float64, load func(time.Duration) float64, dur time.Duration, seed uint64) []simResult {
	return simLoadPrio(s, first, rates, nil, load, dur, seed)
}

// simLoadPrio is simLoadFrom with flow i at priority prios[i-first] (the
// default for a nil prios).
func simLoadPrio(s *simServer, first int, rates []float64, prios []floodgate.Priority, load func(time.Duration) float64, dur time.Duration, seed uint64) []simResult {
	var mu sync.Mutex
	var out []simResult
	var wg sync.WaitGroup
	start := time.Now()
	for j, rate := range rates {
		i := j + first
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Go(func() {
			f := Flow{Key: fmt.Sprint("flow", i), Weight: 1}
			if prios != nil {
				f.Priority = prios[j]
			}
			for {
				elapsed := time.Since(start)
				l := load(elapsed)
				if elapsed >= dur {
					return
				}
				if l <= 0 {
					time.Sleep(10 * ms)
					continue
				}
				time.Sleep(time.Duration(rng.ExpFloat64() / (rate * l) * float64(time.Second)))
				wg.Go(func() {
					at := time.Now()
					ok := s.call(f)
					mu.Lock()
					out = append(out, simResult{at: at, end: time.Now(), flow: i, ok: ok})
					mu.Unlock()
				})
			}
		})
	}
	wg.Wait()
	return out
}

// stop ends the reader, for the bubble to end.
func (s *simServer) stop() { close(s.sock) }

// window sums the results of calls that arrived in [from, to) after start:
// calls per second completed within slo, the p99 latency of the completed
// ones, and each flow's success ratio.
func window(rs []simResult, start time.Time, from, to, slo time.Duration) (good float64, p99 time.Duration, success []float64) {
	var lat []time.Duration
	sent, okd := map[int]int{}, map[int]int{}
	for _, r := range rs {
		at := r.at.Sub(start)
		if at < from || at >= to {
			continue
		}
		sent[r.flow]++
		if r.ok {
			okd[r.flow]++
			lat = append(lat, r.end.Sub(r.at))
			if r.end.Sub(r.at) <= slo {
				good++
			}
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		p99 = lat[len(lat)*99/100]
	}
	for i := 0; len(sent) > 0; i++ {
		success = append(success, float64(okd[i])/float64(max(1, sent[i])))
		delete(sent, i)
	}
	return good / (to - from).Seconds(), p99, success
}

// The law holds a server at its capacity from its first second, whatever a
// call costs, on one CPU or two, for CPU-bound and blocking handlers, from
// 1.2× to 10× overload, with every admitted call within max(100 ms, 5× its
// cost).
func TestSimulatedOverload(t *testing.T) {
	type cell struct {
		cost       time.Duration
		cpus, pool int
		load       float64
	}
	cells := []cell{
		{cost: 200 * time.Microsecond, cpus: 1, load: 4},
		{cost: 500 * time.Microsecond, cpus: 1, load: 2},
		{cost: 2 * ms, cpus: 1, load: 1.2},
		{cost: 2 * ms, cpus: 1, load: 4},
		{cost: 2 * ms, cpus: 2, load: 2},
		{cost: 2 * ms, cpus: 1, load: 10},
		{cost: 10 * ms, cpus: 1, load: 2},
		{cost: 20 * ms, cpus: 1, load: 4},
		{cost: 10 * ms, cpus: 1, pool: 8, load: 1.8},
	}
	for _, c := range cells {
		name := fmt.Sprintf("%v/cpus=%d/pool=%d/%gx", c.cost, c.cpus, c.pool, c.load)
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				slots := float64(c.cpus)
				opts := []Option{WithLimits(c.cpus, 0)}
				if c.pool > 0 {
					slots = float64(c.pool)
					opts = []Option{WithLimits(1, 0)}
				}
				capacity := slots / c.cost.Seconds()
				ctrl, err := New(opts...)
				if err != nil {
					t.Fatal(err)
				}
				s := newSim(ctrl, c.cpus, c.pool, func(time.Time) time.Duration { return c.cost })
				defer s.stop()
				// One heavy flow with half the load, three light ones.
				rates := []float64{capacity / 2, capacity / 6, capacity / 6, capacity / 6}
				start := time.Now()
				rs := simLoad(s, rates, func(time.Duration) float64 { return c.load }, 3*time.Second, 1)
				slo := max(100*ms, 5*c.cost)
				good, p99, _ := window(rs, start, time.Second, 3*time.Second, slo)
				if good < 0.95*capacity {
					t.Errorf("goodput %.0f/s = %.0f%% of the capacity %.0f/s, want ≥ 95%%", good, 100*good/capacity, capacity)
				}
				if p99 > slo {
					t.Errorf("admitted p99 %v, want ≤ %v", p99, slo)
				}
				// From the first call: at least 90% of the capacity over
				// the first two seconds.
				if cold, _, _ := window(rs, start, 0, 2*time.Second, slo); cold < 0.9*capacity {
					t.Errorf("goodput over the first 2 s %.0f/s = %.0f%% of the capacity, want ≥ 90%%", cold, 100*cold/capacity)
				}
				t.Logf("goodput %.0f%%, p99 %v, limit %.1f, shed %d", 100*good/capacity, p99, ctrl.Snapshot().Limit, ctrl.Snapshot().ShedTotal())
			})
		})
	}
}

// A server at half its capacity sheds nothing, even when a neighbour
// doubles what each call costs for a while.
func TestSimulatedNeighbourShedsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctrl, err := New(WithLimits(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		s := newSim(ctrl, 1, 0, func(now time.Time) time.Duration {
			if d := now.Sub(start); d > time.Second && d < 2*time.Second {
				return 4 * ms // a neighbour takes half the CPU
			}
			return 2 * ms
		})
		defer s.stop()
		rates := []float64{50, 25, 25} // 100/s of 2 ms: a fifth of the CPU
		rs := simLoad(s, rates, func(time.Duration) float64 { return 1 }, 3*time.Second, 2)
		if n := ctrl.Snapshot().ShedTotal(); n != 0 {
			t.Errorf("%d of %d calls shed at a fifth of the capacity, want 0", n, len(rs))
		}
	})
}

// A noisy flow bursting to 5× its rate takes what the others leave, and
// the light flows keep at least 99% of their calls. Three light flows, each
// a tenth of the capacity, share a handful of places with the flood, which
// the controller must remember between its calls to know it for the flood
// (a rule that forgot a flow whenever none of its calls was inside kept
// 93.6%); and they ask for less than an equal split of the capacity, so
// they enter beyond the places when the flood holds none.
func TestSimulatedBurstKeepsTheLightFlows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctrl, err := New(WithLimits(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		s := newSim(ctrl, 1, 0, func(time.Time) time.Duration { return 2 * ms })
		defer s.stop()
		// Capacity 500/s; 0.6× of it before the burst, the heavy flow at
		// 5× its 150/s during it.
		rates := []float64{150, 50, 50, 50}
		start := time.Now()
		var all []simResult
		var mu sync.Mutex
		var wg sync.WaitGroup
		wg.Go(func() {
			r := simLoad(s, rates[:1], func(d time.Duration) float64 {
				if d > time.Second && d < 2500*ms {
					return 5
				}
				return 1
			}, 3*time.Second, 4)
			mu.Lock()
			all = append(all, r...)
			mu.Unlock()
		})
		wg.Go(func() {
			r := simLoadFrom(s, 1, rates[1:], func(time.Duration) float64 { return 1 }, 3*time.Second, 5)
			mu.Lock()
			all = append(all, r...)
			mu.Unlock()
		})
		wg.Wait()
		_, p99, success := window(all, start, time.Second, 2500*ms, 100*ms)
		for i, v := range success[1:] {
			if v < 0.99 {
				t.Errorf("light flow %d kept %.1f%% of its calls in the burst, want ≥ 99%%", i+1, 100*v)
			}
		}
		if p99 > 100*ms {
			t.Errorf("admitted p99 in the burst %v, want ≤ 100ms", p99)
		}
		good, _, _ := window(all, start, time.Second, 2500*ms, 100*ms)
		if good < 0.95*500 {
			t.Errorf("goodput in the burst %.0f/s, want ≥ 95%% of 500/s", good)
		}
	})
}

// A critical flow keeps its calls while a sheddable one floods a pool, as
// behind a front that carries its callers' priorities.
func TestSimulatedCriticalBesideAFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctrl, err := New(WithLimits(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		// A pool of 4 connections × 10 ms: 400 calls/s.
		s := newSim(ctrl, 1, 4, func(time.Time) time.Duration { return 10 * ms })
		defer s.stop()
		start := time.Now()
		rs := simLoadPrio(s, 0, []float64{1200, 40}, []floodgate.Priority{floodgate.Sheddable, floodgate.Critical},
			func(time.Duration) float64 { return 1 }, 3*time.Second, 6)
		good, _, success := window(rs, start, time.Second, 3*time.Second, 100*ms)
		if success[1] < 0.99 {
			t.Errorf("the critical flow kept %.1f%% of its calls beside a sheddable flood of 3×, want ≥ 99%%", 100*success[1])
		}
		if good < 0.95*400 {
			t.Errorf("goodput %.0f/s, want ≥ 95%% of 400/s", good)
		}
		t.Logf("critical kept %.1f%%, sheddable %.1f%%, goodput %.0f/s", 100*success[1], 100*success[0], good)
	})
}
