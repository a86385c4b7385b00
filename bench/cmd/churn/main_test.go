package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
	"github.com/floodgate-go/floodgate/internal/redistest"
)

// The bounds a fleet of floodgate-rls replicas is held to, as its
// token bucket of rate 200/s and burst 200 would keep them alone.
const (
	// slackRate and slackTokens widen the steady bound on a sliding
	// second after the first: the rate's error, and the term stated in
	// docs/stores.md: what the bucket and its leases hold when the window
	// opens, which under demand above the limit is about one lease, at
	// most an eighth of the burst.
	slackRate   = 1.02
	slackTokens = burst / 8
	// minSteady is the least share of rate × (run − 1 s) admitted while
	// the callers ask for twice the limit or more.
	minSteady = 0.95
	// maxTo95 is when, alone with every call, one replica must have
	// admitted 0.95 × rate in a sliding second after the first: a perfect
	// bucket does at 1.95 s, which leaves it 10 tokens' time.
	maxTo95 = 2.0
)

// TestChurnQuick runs every scenario in -quick mode against floodgate-rls
// (FLOODGATE_RLS, or built from the working tree) and checks the bounds.
// With CHURN_RATELIMIT=1 and its binary cached, envoyproxy/ratelimit runs
// beside it as a control of the harness: its figures are logged, and only
// the load is checked. The test fails while the store over- or
// under-admits under churn: the figures say by how much.
func TestChurnQuick(t *testing.T) {
	if !redistest.Installed() {
		t.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
	}
	// The test's budget: the floodgate runs fit within it whatever the
	// machine; the control runs only while time is left.
	deadline := time.Now().Add(85 * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	fg, _, err := floodgateBinary(ctx, os.Getenv("FLOODGATE_RLS"), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	run := []string{"floodgate"}
	rl, _ := rlsproc.RatelimitPath()
	switch _, err := os.Stat(rl); {
	case os.Getenv("CHURN_RATELIMIT") != "1":
	case err == nil:
		run = append(run, "ratelimit")
	default:
		t.Logf("ratelimit: not cached at %s; go run ./cmd/churn -variants ratelimit installs it", rl)
	}
	l, err := newLab(fg, rl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.close)
	for _, v := range run {
		for _, sc := range scenarios {
			sc = sc.scaled(1.0 / 3)
			t.Run(v+"/"+sc.Name, func(t *testing.T) {
				if v != "floodgate" && time.Until(deadline) < sc.Run+5*time.Second {
					t.Skip("out of the test's time budget")
				}
				r, err := l.runScenario(ctx, v, sc, 12)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("admitted per second %v, max 1 s %d (all %d), %g s %d, share %.3f, steady %.3f over %.2f s, to 95%% %.2f s, calls/s %v, over %d, errors %d, events %v",
					r.PerSecond, r.Max1s, r.Max1sAll, r.Long, r.MaxLong, r.Share, r.Steady, r.SteadySeconds, r.To95, r.Calls, r.Over, r.Errors, r.Events)
				check(t, v, sc, r)
			})
		}
	}
}

func check(t *testing.T, v string, sc scenario, r *Result) {
	t.Helper()
	if r.SteadySeconds < 0.5*(r.Seconds-1) {
		t.Errorf("the callers started 2×rate calls in only %.2f s of %.2f: the load did not overload the fleet (calls/s %v)", r.SteadySeconds, r.Seconds-1, r.Calls)
	}
	if v != "floodgate" {
		return
	}
	if got, want := r.Max1sAll, burst+rate; got > want {
		t.Errorf("max admitted in a sliding second = %d, want ≤ burst + rate = %d", got, want)
	}
	if got, want := float64(r.Max1s), slackRate*rate+slackTokens; got > want {
		t.Errorf("max admitted in a sliding second after the first = %.0f, want ≤ %.0f (%.2f × rate + %d)", got, want, slackRate, slackTokens)
	}
	if got := r.Steady; got < minSteady {
		t.Errorf("admitted %.3f of rate × %.2f s after the first second, want ≥ %.2f", got, r.SteadySeconds, minSteady)
	}
	if sc.Skew && (r.To95 < 0 || r.To95 > maxTo95) {
		t.Errorf("one replica with every call reached 0.95 × rate in a sliding second at %.2f s (−1: never), want ≤ %.2f s", r.To95, maxTo95)
	}
}
