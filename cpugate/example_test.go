package cpugate_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
)

// The classic scenario, driven by a scripted sampler and explicit times: CPU
// spikes to 90% and at once drops to 30%. The limits stay scaled down for
// the whole 5 s cooldown, counted from the hot sample, and return right
// after.
func Example() {
	cpu := []float64{0.3, 0.9, 0.3} // then 30% for ever
	sampler := cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		r := cpugate.Reading{CPU: cpu[0], Source: "script"}
		if len(cpu) > 1 {
			cpu = cpu[1:]
		}
		return r, nil
	})
	gate, err := cpugate.New(sampler, cpugate.WithPolicy(cpugate.Fixed{})) // 80%, ×0.2, 5 s
	if err != nil {
		log.Fatal(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lim := floodgate.PerSecond(100, 20)
	for at := time.Duration(0); at <= 6*time.Second; at += 250 * time.Millisecond {
		if err := gate.SampleAt(start.Add(at)); err != nil {
			log.Fatal(err)
		}
		switch at {
		case 0, 250 * time.Millisecond, 5 * time.Second, 5250 * time.Millisecond:
			s := gate.Snapshot()
			fmt.Printf("%-6v cpu %.0f%%  %-8v scale %.1f  limit %v\n", at, 100*s.CPU, s.State, s.Scale, gate.Apply(lim))
		}
	}
	// Output:
	// 0s     cpu 30%  open     scale 1.0  limit 100/s burst 20
	// 250ms  cpu 90%  shedding scale 0.2  limit 20/s burst 4
	// 5s     cpu 30%  shedding scale 0.2  limit 20/s burst 4
	// 5.25s  cpu 30%  open     scale 1.0  limit 100/s burst 20
}

// A production setup: the best sampler for this machine, the Adaptive
// policy, transitions logged, and the sampling loop owned by the caller.
func ExampleNew() {
	sampler, source, err := cpugate.NewSampler()
	if err != nil {
		log.Fatal(err)
	}
	gate, err := cpugate.New(sampler,
		cpugate.WithPolicy(cpugate.Adaptive{}),
		cpugate.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go gate.Run(ctx) // returns ctx.Err() once cancelled

	slog.Info("cpu gate running", "source", source)
	// On the request path: lim = gate.Apply(lim)
}

// Adaptive under sustained saturation: cut by half on entry, then by a
// quarter at most every half second, down to the floor. (A reading between
// Enter and saturation cuts less: only what would bring it to the middle
// of the warm band.)
func ExampleAdaptive() {
	var c cpugate.Control
	policy := cpugate.Adaptive{Floor: 0.2}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for at := time.Duration(0); at <= 4*time.Second; at += 250 * time.Millisecond {
		prev := c.Scale()
		c = policy.Step(c, cpugate.Reading{CPU: 1}, start.Add(at))
		if c.Scale() != prev {
			fmt.Printf("%v: %v, scale %.4g\n", at, c.State, c.Scale())
		}
	}
	// Output:
	// 0s: shedding, scale 0.5
	// 500ms: shedding, scale 0.375
	// 1s: shedding, scale 0.2812
	// 1.5s: shedding, scale 0.2109
	// 2s: shedding, scale 0.2
}

// The controller is a pure function: a policy maps the previous Control, a
// reading and the time to the next Control, so decisions can be replayed
// from a trace.
func ExampleFixed_Step() {
	policy := cpugate.Fixed{Threshold: 0.7, Factor: 0.5, Cooldown: 2 * time.Second}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var c cpugate.Control
	for _, r := range []struct {
		at  time.Duration
		cpu float64
	}{{0, 0.75}, {time.Second, 0.2}, {2 * time.Second, 0.2}} {
		c = policy.Step(c, cpugate.Reading{CPU: r.cpu}, start.Add(r.at))
		fmt.Printf("%v cpu %.2f: %v, scale %v\n", r.at, r.cpu, c.State, c.Scale())
	}
	// Output:
	// 0s cpu 0.75: shedding, scale 0.5
	// 1s cpu 0.20: shedding, scale 0.5
	// 2s cpu 0.20: open, scale 1
}

// A nil gate scales nothing, so a server can make the gate optional.
func ExampleGate_Apply() {
	var gate *cpugate.Gate // no gate configured
	fmt.Println(gate.Apply(floodgate.PerSecond(50, 5)))
	// Output:
	// 50/s burst 5
}

// Reading the guard signal: wrap any sampler to add the 99th percentile of
// goroutine scheduling latency, and let the policy treat a slow scheduler
// as hot.
func ExampleSchedGuard() {
	sampler, _, err := cpugate.NewSampler()
	if err != nil {
		log.Fatal(err)
	}
	gate, err := cpugate.New(cpugate.NewSchedGuard(sampler),
		cpugate.WithPolicy(cpugate.Adaptive{SchedP99: 20 * time.Millisecond}))
	if err != nil {
		log.Fatal(err)
	}
	_ = gate
}
