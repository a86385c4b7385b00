package main

import (
	"bytes"
	"context"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	completionv1 "github.com/floodgate-go/floodgate/proto/completion/v1"
	"github.com/floodgate-go/floodgate/tenant"
)

// workerEnv makes the test binary a worker process (processStarter runs
// the test binary in TestWorkerProcesses).
const workerEnv = "TOKENS_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			os.Exit(2)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func TestDrawReply(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n = 200_000
	sum, lo, hi := 0, maxReply, minReply
	for range n {
		v := drawReply(r)
		sum += v
		lo, hi = min(lo, v), max(hi, v)
	}
	if lo < minReply || hi > maxReply {
		t.Errorf("drawReply drew from %d to %d, want within [%d, %d]", lo, hi, minReply, maxReply)
	}
	if mean := float64(sum) / n; math.Abs(mean-meanReply) > 0.01*meanReply {
		t.Errorf("drawReply's mean = %.1f, want %d within 1%%", mean, meanReply)
	}
}

func TestLasts(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{
		{1, minLasts}, {minReply, minLasts}, {2100, 550 * time.Millisecond}, {maxReply, maxLasts}, {10_000, maxLasts},
	} {
		if got := lasts(c.n); got != c.want {
			t.Errorf("lasts(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}

func TestWindows(t *testing.T) {
	s := func(sec float64, tokens int) sample { return sample{time.Duration(sec * float64(time.Second)), tokens} }
	samples := []sample{s(1, 100), s(30, 200), s(61, 50), s(90, 400), s(150, 10)}
	most, at := maxWindow(samples, window)
	if most != 450 || at != 90*time.Second {
		t.Errorf("maxWindow = %d at %v, want 450 at 1m30s", most, at)
	}
	// A sample exactly a window before t is out of the window (t−60, t].
	if most, _ := maxWindow([]sample{s(0, 5), s(60, 7)}, window); most != 7 {
		t.Errorf("maxWindow over samples 60 s apart = %d, want 7", most)
	}
	steps := []time.Duration{30 * time.Second, 61 * time.Second, 120 * time.Second, 200 * time.Second}
	if diff := cmp.Diff([]float64{300, 250, 450, 10}, trailing(samples, window, steps)); diff != "" {
		t.Errorf("trailing (-want +got):\n%s", diff)
	}
	if got, want := perMinute(samples, window, 150*time.Second), 460/1.5; got != want {
		t.Errorf("perMinute = %v, want %v", got, want)
	}
}

func TestCommas(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 123456789: "123,456,789", -20000: "-20,000"} {
		if got := commas(n); got != want {
			t.Errorf("commas(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSimClock(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newSimClock(t0)
	var mu sync.Mutex
	var woke []time.Duration
	for _, d := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second} {
		c.Go(func() {
			c.Sleep(context.Background(), d)
			c.Sleep(context.Background(), d) // again, from the first wake-up
			mu.Lock()
			woke = append(woke, c.Now().Sub(t0))
			mu.Unlock()
		})
	}
	c.Wait()
	if diff := cmp.Diff([]time.Duration{2 * time.Second, 4 * time.Second, 6 * time.Second}, woke); diff != "" {
		t.Errorf("wake-ups (-want +got):\n%s", diff)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-burst", "1000"},
		{"-debt", "-2"},
		{"-callers", "0"},
		{"-estimate", "most"},
		{"-estimate", "5000"},
		{"-strategies", "floodgate,leaky"},
		{"-workers", "4"},
		{"-kill-after", "1m"},
		{"-duration", "0s"},
		{"extra"},
	} {
		if err := run(context.Background(), append(args, "-sim"), io.Discard, io.Discard); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
}

// experimentConfig is the setup, run in simulated time: a quota of
// 100,000 tokens a minute in bursts of 20,000, 64 callers back to back.
func experimentConfig(d time.Duration, strategies ...string) config {
	cfg := defaultConfig()
	cfg.Sim, cfg.Duration, cfg.Chart = true, d, ""
	if strategies != nil {
		cfg.Strategies = strategies
	}
	return cfg
}

func runSim(t *testing.T, cfg config) *report {
	t.Helper()
	rep, err := experiment(context.Background(), cfg, inProcess)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.write(&b)
	t.Logf("\n%s", b.String())
	return rep
}

// rowOf returns the first tenant's row of strategy.
func (r *report) rowOf(t *testing.T, strategy string) row {
	t.Helper()
	for _, byTenant := range r.rows {
		if byTenant[0].strategy == strategy {
			return byTenant[0]
		}
	}
	t.Fatalf("no row of %s", strategy)
	return row{}
}

// (i) 64 callers back to back: floodgate delivers at most the quota and
// one burst in any 60 s, the strategies without reservations many times
// the quota.
func TestBackToBack(t *testing.T) {
	cfg := experimentConfig(2 * time.Minute)
	rep := runSim(t, cfg)
	bound := cfg.Quota + cfg.Burst
	if fg := rep.rowOf(t, stratFloodgate); fg.maxWindow > bound {
		t.Errorf("floodgate delivered %d tokens in 60 s, want at most %d (quota + burst)", fg.maxWindow, bound)
	}
	for _, s := range []string{stratChargeAtEnd, stratCheckThenCount} {
		if r := rep.rowOf(t, s); r.maxWindow <= 2*bound {
			t.Errorf("%s delivered %d tokens in 60 s, want more than twice the bound, %d", s, r.maxWindow, 2*bound)
		}
	}
}

// (ii) Open-loop demand at twice the quota: floodgate delivers at least
// 95% of the quota.
func TestOpenLoop(t *testing.T) {
	cfg := experimentConfig(10 * time.Minute)
	cfg.Demand = 2
	rep := runSim(t, cfg)
	fg := rep.rowOf(t, stratFloodgate)
	if got := perMinute(fg.samples, window, cfg.Duration); got < 0.95*float64(cfg.Quota) {
		t.Errorf("floodgate delivered %.0f tokens a minute after the first 60 s, want at least 95%% of %d", got, cfg.Quota)
	}
	if fg.maxWindow > cfg.Quota+cfg.Burst {
		t.Errorf("floodgate delivered %d tokens in 60 s, want at most %d", fg.maxWindow, cfg.Quota+cfg.Burst)
	}
}

// (iii) Estimates of half the reply: any 60 s within the quota, one burst
// and the debt limit, and over 10 minutes the rate within 1% of the quota.
func TestShortEstimates(t *testing.T) {
	cfg := experimentConfig(10*time.Minute, stratFloodgate)
	cfg.Estimate = "half"
	rep := runSim(t, cfg)
	fg := rep.rowOf(t, stratFloodgate)
	if bound := cfg.Quota + cfg.Burst + cfg.limit().DebtLimit(); fg.maxWindow > bound {
		t.Errorf("floodgate delivered %d tokens in 60 s, want at most %d (quota + burst + debt limit)", fg.maxWindow, bound)
	}
	if got := perMinute(fg.samples, window, cfg.Duration); math.Abs(got-float64(cfg.Quota)) > 0.01*float64(cfg.Quota) {
		t.Errorf("floodgate delivered %.0f tokens a minute after the first 60 s, want %d within 1%%", got, cfg.Quota)
	}
	if fg.calls[rejectedDebt] == 0 {
		t.Error("no call was rejected for debt, want some: the settles charge beyond the estimates")
	}
}

// (iv) On Redis, four workers share each bucket, and the first is killed
// holding reservations: floodgate stays within its bound.
func TestRedisWorkers(t *testing.T) {
	srv := redistest.Start(t)
	cfg := experimentConfig(90*time.Second, stratFloodgate)
	cfg.Redis, cfg.Workers, cfg.KillAfter = srv.Addr, 4, 45*time.Second
	rep := runSim(t, cfg)
	fg := rep.rowOf(t, stratFloodgate)
	if fg.maxWindow > cfg.Quota+cfg.Burst {
		t.Errorf("floodgate delivered %d tokens in 60 s, want at most %d", fg.maxWindow, cfg.Quota+cfg.Burst)
	}
	if fg.calls[failed] == 0 {
		t.Error("no call failed, want those of the killed worker")
	}
}

// The loopback run: every strategy over gRPC, briefly, in real time, with
// the report and the chart.
func TestLoopback(t *testing.T) {
	cfg := defaultConfig()
	cfg.Duration, cfg.Callers, cfg.Chart = 2*time.Second, 8, filepath.Join(t.TempDir(), "tokens.png")
	start := time.Now()
	rep, err := experiment(context.Background(), cfg, inProcess)
	if err != nil {
		t.Fatal(err)
	}
	checkRealBound(t, cfg, rep, time.Since(start))
	for _, s := range allStrategies {
		if r := rep.rowOf(t, s); r.calls[served] == 0 {
			t.Errorf("%s served no call", s)
		}
	}
	if err := rep.chart(cfg.Chart); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.Chart); err != nil {
		t.Error(err)
	}
}

// The workers as processes of their own, on Redis, one killed.
func TestWorkerProcesses(t *testing.T) {
	srv := redistest.Start(t)
	t.Setenv(workerEnv, "1")
	cfg := defaultConfig()
	cfg.Duration, cfg.Callers, cfg.Chart = 3*time.Second, 8, ""
	cfg.Redis, cfg.Workers, cfg.KillAfter = srv.Addr, 2, 500*time.Millisecond
	start := time.Now()
	rep, err := experiment(context.Background(), cfg, processStarter(os.Args[0], io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	checkRealBound(t, cfg, rep, time.Since(start))
	if fg := rep.rowOf(t, stratFloodgate); fg.calls[failed] == 0 {
		t.Error("no call failed, want those of the killed worker")
	}
}

// checkRealBound checks floodgate's tokens over a run in real time of
// elapsed against a burst and the quota's rate over that time, the bound
// when estimates are the replies' most.
func checkRealBound(t *testing.T, cfg config, rep *report, elapsed time.Duration) {
	t.Helper()
	var b bytes.Buffer
	rep.write(&b)
	t.Logf("\n%s", b.String())
	fg := rep.rowOf(t, stratFloodgate)
	if max := cfg.Burst + int(cfg.limit().Rate*elapsed.Seconds()); fg.tokens > max {
		t.Errorf("floodgate delivered %d tokens, want at most %d (a burst and the rate over the run)", fg.tokens, max)
	}
}

// TestTenantConfig: floodgate's tenant config holds each tenant to the
// quota the other strategies' buckets apply, with the debt limit asked
// for.
func TestTenantConfig(t *testing.T) {
	for _, debt := range []int{0, floodgate.NoDebt, 5000} {
		cfg := defaultConfig()
		cfg.Tenants, cfg.Debt = 2, debt
		table, err := tenant.Parse("tenants.yaml", []byte(cfg.tenantConfig()))
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range cfg.tenants() {
			ten, ok := table.TenantByID(id)
			if !ok {
				t.Fatalf("debt %d: no tenant %s", debt, id)
			}
			m := ten.Rule(completionv1.Completion_Complete_FullMethodName).Meter
			if m == nil {
				t.Fatalf("debt %d: %s has no metered quota", debt, id)
			}
			want := cfg.limit()
			if m.Limit.Burst != want.Burst || m.Limit.DebtLimit() != want.DebtLimit() || math.Abs(m.Limit.Rate-want.Rate) > 1e-9 {
				t.Errorf("debt %d: %s's limit = %v, want %v", debt, id, m.Limit, want)
			}
			if m.Estimate != maxReply || m.EstimateHeader != estimateHeader {
				t.Errorf("debt %d: %s's estimate = %d from %q, want %d from %q", debt, id, m.Estimate, m.EstimateHeader, maxReply, estimateHeader)
			}
		}
	}
}
