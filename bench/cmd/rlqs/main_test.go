package main

import (
	"bytes"
	"context"
	"github.com/floodgate-go/floodgate/bench/internal/fair"
	"os"
	"strings"
	"testing"
	"time"
)

// TestQuick runs the quick experiment (5 Envoys, 30 s of fake time, 1 s
// reports) and fails while floodgate's RLQS leaves the band in a steady
// 10 s window after the first two reports, or the restart admits more than
// the band's top in a 10 s window. The other targets are logged.
func TestQuick(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer stopRedis()
	res, err := experiment(ctx, quickConfig(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Results {
		if got, want := len(r.Windows), 3; got != want {
			t.Errorf("%s %s: %d windows, want %d", r.Variant, r.Scenario, got, want)
		}
		for _, w := range r.Windows {
			if w.Offered == 0 {
				t.Errorf("%s %s: no request offered in the window from %g s", r.Variant, r.Scenario, w.From)
			}
		}
		if r.Variant != vFloodgate && r.Variant != vReplicas {
			continue
		}
		switch r.Scenario {
		case sSteady:
			if r.FleetMin < bandLow || r.FleetMax > bandHigh {
				t.Errorf("%s steady: 10 s windows admitted %.3f–%.3f of the limit, want within %.2f–%.2f", r.Variant, r.FleetMin, r.FleetMax, bandLow, bandHigh)
			}
			if r.RPCs <= 0 || r.RPCs >= 1 {
				t.Errorf("%s steady: %.3f RPC a request, want in (0, 1)", r.Variant, r.RPCs)
			}
		case sRestart, sCrash:
			if r.SlidingMax > bandHigh {
				t.Errorf("%s restart: a 10 s window admitted %.3f of the limit, want ≤ %.2f", r.Variant, r.SlidingMax, bandHigh)
			}
		}
	}
	for _, c := range res.Checks {
		t.Logf("%s %s: %s", c.Mark(), c.Target, c.Value)
	}
	if _, err := page(res); err != nil {
		t.Fatal(err)
	}
}

// TestMaxMinFair: whoever wants less than an equal part of what is left
// gets it; the rest share equally.
func TestMaxMinFair(t *testing.T) {
	got := fair.MaxMin(1000, []float64{600, 10, 300, 100})
	want := []float64{590, 10, 300, 100}
	for i := range want {
		if d := got[i] - want[i]; d > 1e-9 || d < -1e-9 {
			t.Fatalf("maxMinFair = %v, want %v", got, want)
		}
	}
}

// TestCommittedPage: the committed results render the committed page byte
// for byte. After editing page.md.tmpl, re-render with
// `go run ./cmd/rlqs -render results/rlqs.json`.
func TestCommittedPage(t *testing.T) {
	res, err := readResults("../../results/rlqs.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := page(res)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../../docs/benchmarks/rlqs.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(g), len(w)) {
			if i >= len(g) || i >= len(w) || g[i] != w[i] {
				t.Fatalf("docs/benchmarks/rlqs.md is not the rendering of results/rlqs.json (re-render with -render): line %d differs", i+1)
			}
		}
	}
}
