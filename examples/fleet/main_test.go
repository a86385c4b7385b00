package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testExperiment is a small, short experiment on in-process servers: the
// fleet's capacity is 350 calls/s, so that the race detector keeps up.
func testExperiment() experimentConfig {
	cfg := defaultExperiment()
	cfg.Warmup, cfg.Measure = 4*time.Second, 3*time.Second
	cfg.Pools, cfg.Hold = []int{12, 12, 4}, 80*time.Millisecond
	cfg.Conns = 2
	cfg.Start = inProcessStarter
	return cfg
}

// Fed by the replicas' load reports, weighted_round_robin sends the weak
// replica about its share of the capacity (a seventh), where round_robin
// sends it a third of the calls, more than twice what it completes. (How
// much the fleet sheds is measured by the experiment, over longer runs:
// three seconds after the balancer's blackout are too few to judge it.)
func TestReportsSteerTheBalancer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 14 s")
	}
	cfg := testExperiment()
	capacity := 350.0
	rr, err := balanceCell(t.Context(), cfg, "round_robin", 0.9*capacity)
	if err != nil {
		t.Fatal(err)
	}
	wrr, err := balanceCell(t.Context(), cfg, "weighted_round_robin", 0.9*capacity)
	if err != nil {
		t.Fatal(err)
	}
	weak := func(r cellResult) float64 { return r.picks[r.replicas[2]] / r.offered }
	t.Logf("round_robin: shed %.1f%%, weak replica's share %.1f%%; weighted_round_robin: shed %.1f%%, weak replica's share %.1f%%",
		100*rr.shed/rr.offered, 100*weak(rr), 100*wrr.shed/wrr.offered, 100*weak(wrr))
	if weak(wrr) > 0.6*weak(rr) {
		t.Errorf("weak replica's share %.2f under weighted_round_robin, want well under round_robin's %.2f", weak(wrr), weak(rr))
	}
}

// Behind a front that forwards every call, the back sheds the noisy
// sheddable tenant's calls before the quiet critical one's only when the
// front carries the priority.
func TestPriorityCrossesTheFront(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 14 s")
	}
	cfg := testExperiment()
	cfg.Hold = 20 * time.Millisecond // the back: 4 connections × 10 ms
	cfg.Warmup = 3 * time.Second
	plain, err := chainCell(t.Context(), cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	carried, err := chainCell(t.Context(), cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	kept := func(r chainResult) float64 { return r.kept["quiet"] / r.sent["quiet"] }
	t.Logf("quiet tenant kept %.1f%% plain, %.1f%% with PropagatePriority (lost: %s)", 100*kept(plain), 100*kept(carried), carried.lost())
	if kept(carried) < 0.95 {
		t.Errorf("quiet critical tenant kept %.1f%% of its calls with propagation, want ≥ 95%%", 100*kept(carried))
	}
	if kept(plain) > 0.8 {
		t.Errorf("quiet tenant kept %.1f%% without propagation: the flood did not reach the back", 100*kept(plain))
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-measure", "0s"},
		{"-conns", "0"},
		{"extra"},
		{"replica", "-pool", "1"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
}

// The chart and the Markdown come out of the halving run.
func TestHalveRunWritesChart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 9 s")
	}
	cfg := testExperiment()
	dir := t.TempDir()
	cfg.Only, cfg.Chart, cfg.MD = "halve", filepath.Join(dir, "fleet.png"), filepath.Join(dir, "fleet.md")
	var out bytes.Buffer
	if err := experiment(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(cfg.Chart); err != nil || fi.Size() == 0 {
		t.Errorf("chart: %v", err)
	}
	md, err := os.ReadFile(cfg.MD)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "r0's share of calls before") || string(md) != out.String() {
		t.Errorf("Markdown %q differs from the output %q", md, out.String())
	}
}

// Without floodgate, closed-loop callers keep every connection busy: the
// measured capacity is close to the pools over the hold, and never above.
func TestMeasureCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 8 s")
	}
	cfg := testExperiment()
	got, err := measureCapacity(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	pools := 350.0 // (12+12+4) connections / 80 ms
	t.Logf("measured %.0f calls/s of %.0f", got, pools)
	if got < 0.5*pools || got > 1.02*pools {
		t.Errorf("measured %.0f calls/s, want between half of and the pools' %.0f", got, pools)
	}
}
