package middleware_test

import (
	"context"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
)

// The acceptance tests of cost known after the call, in memory: simulated
// tenants call a model through the unary interceptor, with a fake handler
// whose calls last 0.1 to 1 s and cost 200 to 4,000 tokens (about 1,000
// on average), known only when they end, under a quota of 100,000 tokens
// a minute in bursts of 20,000 with a debt limit of one burst. Time is
// synctest's: every sleep is simulated, and a run of minutes takes
// milliseconds.

const (
	simQuota = 100000 // tokens a minute
	simBurst = 20000
	simDebt  = 20000
)

// plan is a call's fate, which its request carries: how long it lasts and
// what it costs.
type plan struct {
	dur  time.Duration
	cost int64
}

func newPlan(rng *rand.Rand) *plan {
	// Exponential above 200, capped at 4,000: a mean near 1,000.
	cost := min(4000, 200+int64(rng.ExpFloat64()*806))
	return &plan{dur: 100*time.Millisecond + time.Duration(rng.Int64N(int64(900*time.Millisecond))), cost: cost}
}

// settled is one call's end: when, and what it cost.
type settled struct {
	at   time.Duration
	cost int64
}

// sim runs the simulated tenants against one Limiter and records every
// settle.
type sim struct {
	icpt  grpc.UnaryServerInterceptor
	start time.Time
	mu    sync.Mutex
	ends  []settled
}

func newSim(t *testing.T, opts ...middleware.Option) *sim {
	t.Helper()
	store, err := keyed.New() // on synctest's clock
	if err != nil {
		t.Fatal(err)
	}
	spec := tokensPerMinute
	spec.Debt = simDebt
	l, err := middleware.New(store, middleware.Static(meteredTable(t, spec)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &sim{icpt: l.UnaryServerInterceptor(), start: time.Now()}
}

var simInfo = &grpc.UnaryServerInfo{FullMethod: llmGenerate}

// call makes one call of p, and returns the wait its rejection asks for,
// or 0 once it ran.
func (s *sim) call(ctx context.Context, p *plan) time.Duration {
	_, err := s.icpt(ctx, p, simInfo, func(ctx context.Context, req any) (any, error) {
		p := req.(*plan)
		time.Sleep(p.dur)
		middleware.ReportCost(ctx, p.cost)
		s.mu.Lock()
		s.ends = append(s.ends, settled{time.Since(s.start), p.cost})
		s.mu.Unlock()
		return nil, nil
	})
	if err == nil {
		return 0
	}
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r.RetryDelay.AsDuration()
		}
	}
	return time.Second
}

// closedLoop runs n callers back to back, each retrying after the wait
// its rejection states, for d.
func (s *sim) closedLoop(n int, d time.Duration) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(1, uint64(i)))
			ctx := simContext()
			p := newPlan(rng)
			for time.Since(s.start) < d {
				if wait := s.call(ctx, p); wait > 0 {
					time.Sleep(wait)
					continue
				}
				p = newPlan(rng)
			}
		}()
	}
	wg.Wait()
}

// openLoop sends calls as a Poisson stream of rate calls a second for d,
// each tried once.
func (s *sim) openLoop(rate float64, d time.Duration) {
	rng := rand.New(rand.NewPCG(2, 0))
	var wg sync.WaitGroup
	for time.Since(s.start) < d {
		p := newPlan(rng)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.call(simContext(), p)
		}()
		time.Sleep(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
	}
	wg.Wait()
}

// simContext is acme's call context, on a transport that records nothing.
func simContext() context.Context {
	ctx, _ := acmeCall.context(llmGenerate)
	return grpc.NewContextWithServerTransportStream(ctx, nopStream{})
}

// worstMinute returns the most tokens settled in any 60 s.
func (s *sim) worstMinute() int64 {
	ends := append([]settled(nil), s.ends...)
	sort.Slice(ends, func(i, j int) bool { return ends[i].at < ends[j].at })
	var worst, sum int64
	j := 0
	for _, e := range ends {
		sum += e.cost
		for ends[j].at <= e.at-time.Minute {
			sum -= ends[j].cost
			j++
		}
		worst = max(worst, sum)
	}
	return worst
}

// between returns the tokens settled in [from, to).
func (s *sim) between(from, to time.Duration) int64 {
	var sum int64
	for _, e := range s.ends {
		if e.at >= from && e.at < to {
			sum += e.cost
		}
	}
	return sum
}

// (a) 64 callers back to back, each estimated at 4,000, at least what any
// call costs: settled cost stays within the quota and one burst in any
// minute.
func TestSimBackToBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t)
		s.closedLoop(64, 5*time.Minute)
		t.Logf("worst minute %d, minutes 1 to 5 %d, %d calls", s.worstMinute(), s.between(time.Minute, 5*time.Minute), len(s.ends))
		if worst := s.worstMinute(); worst > simQuota+simBurst {
			t.Errorf("%d tokens settled in the worst minute, want ≤ %d", worst, simQuota+simBurst)
		}
		if got, want := s.between(time.Minute, 5*time.Minute), int64(0.95*4*simQuota); got < want {
			t.Errorf("%d tokens settled in minutes 1 to 5, want ≥ %d", got, want)
		}
	})
}

// (b) Open-loop demand at twice the quota: the tenant gets at least 95% of
// its quota, although each call reserves four times what it costs on
// average.
func TestSimOpenLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t)
		const run = 10 * time.Minute
		s.openLoop(2*simQuota/60.0/1000, run) // calls of about 1,000 a second
		// Beyond the initial burst, which a full bucket gives at once.
		got := s.between(0, run) - simBurst
		t.Logf("delivered %d beyond the burst, worst minute %d, %d calls", got, s.worstMinute(), len(s.ends))
		if want := int64(0.95 * simQuota * run.Minutes()); got < want {
			t.Errorf("%d tokens delivered in %v beyond the burst, want ≥ %d (95%% of the quota)", got, run, want)
		}
		if worst := s.worstMinute(); worst > simQuota+simBurst {
			t.Errorf("%d tokens settled in the worst minute, want ≤ %d", worst, simQuota+simBurst)
		}
	})
}

// (c) 64 callers back to back, each estimated at half what it costs: the
// debt bounds any minute by the quota, one burst and the debt limit, and
// over ten minutes the tenant gets its quota, within 1%.
func TestSimUnderestimated(t *testing.T) {
	half := func(_ context.Context, _ string, req any) (int64, bool) {
		return req.(*plan).cost / 2, true
	}
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, middleware.WithCostEstimate(half))
		s.closedLoop(64, 11*time.Minute)
		if worst := s.worstMinute(); worst > simQuota+simBurst+simDebt {
			t.Errorf("%d tokens settled in the worst minute, want ≤ %d", worst, simQuota+simBurst+simDebt)
		}
		// Ten minutes after the first, which spends the burst and the
		// debt allowance once.
		got := float64(s.between(time.Minute, 11*time.Minute)) / (10 * simQuota)
		t.Logf("worst minute %d, %.4f of the quota over minutes 1 to 11, %d calls", s.worstMinute(), got, len(s.ends))
		if got < 0.99 || got > 1.01 {
			t.Errorf("over ten minutes the tenant got %.4f of its quota, want within 1%%", got)
		}
	})
}
