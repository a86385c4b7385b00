package cpugate_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/google/go-cmp/cmp"
)

// script returns a sampler that replays readings in order, then repeats the
// last, and a function counting its calls. A negative CPU is a failed read.
func script(cpus ...float64) (cpugate.Sampler, func() int) {
	var mu sync.Mutex
	n := 0
	return cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		mu.Lock()
		defer mu.Unlock()
		i := min(n, len(cpus)-1)
		n++
		if cpus[i] < 0 {
			return cpugate.Reading{}, cpugate.ErrNoReading
		}
		return cpugate.Reading{CPU: cpus[i], Source: "script"}, nil
	}), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func TestNewValidates(t *testing.T) {
	s, _ := script(0)
	tests := []struct {
		name    string
		sampler cpugate.Sampler
		opts    []cpugate.Option
		field   string
	}{
		{"nil sampler", nil, nil, "sampler"},
		{"zero interval", s, []cpugate.Option{cpugate.WithInterval(0)}, "WithInterval"},
		{"negative interval", s, []cpugate.Option{cpugate.WithInterval(-time.Second)}, "WithInterval"},
		{"sub-millisecond interval", s, []cpugate.Option{cpugate.WithInterval(200 * time.Microsecond)}, "WithInterval"},
		{"nil policy", s, []cpugate.Option{cpugate.WithPolicy(nil)}, "WithPolicy"},
		{"bad policy", s, []cpugate.Option{cpugate.WithPolicy(cpugate.Fixed{Factor: 2})}, "Fixed.Factor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := cpugate.New(tt.sampler, tt.opts...)
			if g != nil || !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("New() = %v, %v, want nil and ErrInvalidConfig naming %s", g, err, tt.field)
			}
		})
	}
}

func TestNilGate(t *testing.T) {
	var g *cpugate.Gate
	lim := floodgate.PerSecond(100, 10)
	if got := g.Scale(); got != 1 {
		t.Errorf("nil Gate: Scale() = %v, want 1", got)
	}
	if got := g.State(); got != cpugate.Open {
		t.Errorf("nil Gate: State() = %v, want open", got)
	}
	if g.Shedding() {
		t.Error("nil Gate: Shedding() = true, want false")
	}
	if got := g.Apply(lim); got != lim {
		t.Errorf("nil Gate: Apply(%v) = %v, want it unchanged", lim, got)
	}
}

func TestApply(t *testing.T) {
	s, _ := script(0.9)
	g, err := cpugate.New(s, cpugate.WithPolicy(cpugate.Fixed{}))
	if err != nil {
		t.Fatal(err)
	}
	lim := floodgate.PerSecond(100, 10)
	if got := g.Apply(lim); got != lim {
		t.Errorf("before any reading: Apply(%v) = %v, want it unchanged", lim, got)
	}
	if err := g.SampleAt(t0); err != nil {
		t.Fatal(err)
	}
	if got, want := g.Apply(lim), floodgate.PerSecond(20, 2); got != want {
		t.Errorf("shedding: Apply(%v) = %v, want %v", lim, got, want)
	}
	if got := g.Apply(floodgate.Inf); got != floodgate.Inf {
		t.Errorf("shedding: Apply(Inf) = %v, want Inf", got)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = g.Apply(lim); _ = g.Scale(); _ = g.State() }); allocs != 0 {
		t.Errorf("Apply, Scale, State allocate %v times, want 0", allocs)
	}
}

func TestSnapshotAndFailures(t *testing.T) {
	s, _ := script(0.3, -1, -1, 0.9, 0.3)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g, err := cpugate.New(s, cpugate.WithLogger(logger), cpugate.WithPolicy(cpugate.Fixed{}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := g.Snapshot(), (cpugate.Snapshot{Scale: 1}); !cmp.Equal(got, want) {
		t.Errorf("fresh Snapshot() = %+v, want %+v", got, want)
	}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if err := g.SampleAt(at(0)); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{interval, 2 * interval} {
		if err := g.SampleAt(at(d)); !errors.Is(err, cpugate.ErrNoReading) {
			t.Errorf("SampleAt(%v) = %v, want ErrNoReading", d, err)
		}
	}
	// Two failures change nothing but the count.
	want := cpugate.Snapshot{State: cpugate.Open, Scale: 1, CPU: 0.3, Smoothed: 0.3, Source: "script", At: at(0), Cooldown: 5 * time.Second, Failures: 2}
	if diff := cmp.Diff(want, g.Snapshot()); diff != "" {
		t.Errorf("after failures, Snapshot() mismatch (-want +got):\n%s", diff)
	}
	if err := g.SampleAt(at(3 * interval)); err != nil {
		t.Fatal(err)
	}
	snap := g.Snapshot()
	if snap.State != cpugate.Shedding || snap.Since != at(3*interval) || snap.Scale != 0.2 || snap.CPU != 0.9 || snap.Failures != 2 {
		t.Errorf("after a hot reading, Snapshot() = %+v", snap)
	}
	// The smoothed CPU moves toward the reading, but not all the way.
	if !(snap.Smoothed > 0.3 && snap.Smoothed < 0.9) {
		t.Errorf("Smoothed = %v, want between 0.3 and 0.9", snap.Smoothed)
	}
	logs := buf.String()
	for _, want := range []string{
		`level=WARN msg="cpugate: sample failed"`,
		`level=INFO msg="cpugate: sampling recovered"`,
		`level=WARN msg="cpugate: state change" from=open to=shedding cpu=0.9 scale=0.2`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if n := strings.Count(logs, "sample failed"); n != 1 {
		t.Errorf("logged %d failures, want 1 per run of failures:\n%s", n, logs)
	}
}

// TestRun drives Run on a fake clock: it samples once per interval, follows
// the script, and returns ctx's error when cancelled.
func TestRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, calls := script(0.3, 0.3, 0.9, 0.3)
		g, err := cpugate.New(s, cpugate.WithPolicy(cpugate.Fixed{}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- g.Run(ctx) }()

		time.Sleep(3*interval + interval/2) // fake time: three ticks
		synctest.Wait()
		if calls() != 3 || g.Scale() != 0.2 {
			t.Errorf("after 3 ticks: %d samples, scale %v, want 3 samples, scale 0.2", calls(), g.Scale())
		}
		if err := g.Run(ctx); err == nil || !strings.Contains(err.Error(), "already running") {
			t.Errorf("second Run() = %v, want an error saying the gate is already running", err)
		}
		// The hot sample came at the third tick; five seconds later the
		// limits are back.
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if g.Scale() != 1 {
			t.Errorf("5 s after the hot sample: scale %v, want 1", g.Scale())
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run() after cancel = %v, want context.Canceled", err)
		}
		// Run may be called again once the previous one returned.
		ctx2, cancel2 := context.WithTimeout(t.Context(), time.Second)
		defer cancel2()
		if err := g.Run(ctx2); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Run() after deadline = %v, want DeadlineExceeded", err)
		}
	})
}

func TestRunInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, calls := script(0.1)
		g, err := cpugate.New(s, cpugate.WithInterval(time.Second), cpugate.WithInterval(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second+50*time.Millisecond)
		defer cancel()
		if err := g.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Run() = %v, want DeadlineExceeded", err)
		}
		if calls() != 10 {
			t.Errorf("%d samples in 1.05 s at 100 ms (the last WithInterval wins), want 10", calls())
		}
	})
}

func TestConcurrentReaders(t *testing.T) {
	s, _ := script(0.9, 0.1)
	g, err := cpugate.New(s, cpugate.WithPolicy(cpugate.Adaptive{}))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if sc := g.Scale(); !(sc > 0 && sc <= 1) {
					t.Errorf("Scale() = %v, want within (0, 1]", sc)
					return
				}
				_ = g.State()
				_ = g.Snapshot()
			}
		})
	}
	for i := range 200 {
		_ = g.SampleAt(t0.Add(time.Duration(i) * interval))
	}
	close(stop)
	wg.Wait()
}
