package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/floodgate-go/floodgate/examples/multitenant/internal/loadgen"
	"github.com/floodgate-go/floodgate/internal/burn"
)

// demoConfig configures a demo run: a server on loopback, the simulated
// callers of a profile, a live table and a chart.
type demoConfig struct {
	// Server is the server's configuration (its tenant config, cost,
	// policy, metrics, and for tests a scripted CPU and a shared
	// calibration); the demo serves on a free loopback port.
	Server      serverConfig
	ProfilePath string        // simulated callers
	Duration    time.Duration // length of the ramp
	Capacity    float64       // calls/s; 0 measures it
	Seed        uint64
	Every       time.Duration // between two prints of the table
	Out         string        // chart path; "" draws none
	Stdout      io.Writer
	Live        bool // redraw the table in place

	// tick is the sampling interval of the statistics and the chart.
	// Default 1s.
	tick time.Duration
	// probe is how long the capacity probe runs. Default 2s.
	probe time.Duration
}

// runDemo runs the whole demo and returns its summary. It stops early, with
// a summary of the part that ran, when ctx is done.
func runDemo(ctx context.Context, cfg demoConfig) (*loadgen.Summary, error) {
	out := cfg.Stdout
	prof, err := loadgen.LoadProfile(cfg.ProfilePath)
	if err != nil {
		return nil, err
	}
	cfg.Server.Addr = "127.0.0.1:0"
	if cfg.Server.burner == nil {
		fmt.Fprintf(out, "calibrating %v of CPU work per allocation…\n", cfg.Server.Cost)
		cfg.Server.burner = burn.Calibrate()
	}
	capacity := cfg.Capacity
	if capacity == 0 {
		if capacity, err = measure(ctx, cfg, prof, out); err != nil {
			return nil, fmt.Errorf("measuring capacity: %w", err)
		}
	}

	srv, stop, err := runInBackground(cfg.Server)
	if err != nil {
		return nil, err
	}
	defer stop()
	protection := "overload controller"
	banner := fmt.Sprintf("overload controller, with CPU readings from %s (%.1f CPUs)", srv.source, srv.budget)
	if srv.ctrl == nil {
		protection = srv.cfg.Policy + " gate"
		banner = fmt.Sprintf("%s gate on %s CPU (%.1f CPUs)", srv.cfg.Policy, srv.source, srv.budget)
	}
	fmt.Fprintf(out, "server on %s: tenant config %s, %s\n", srv.addr(), cfg.Server.ConfigPath, banner)
	if srv.obs != nil {
		fmt.Fprintf(out, "metrics on http://%s%s, top offenders on http://%s%s\n",
			srv.obs.addr(), metricsPath, srv.obs.addr(), offendersPath)
	}
	// tenants.yaml and profile.yaml are sized for a server of about 500 to
	// 1,000 calls per second. Far outside that range the demo still runs,
	// but shows something else; say so rather than let the numbers mislead.
	switch steady := prof.SteadyRate(); {
	case steady > prof.Ramp.From*capacity:
		fmt.Fprintf(out, "note: the steady callers alone offer %.0f calls/s, more than %g× the capacity: the machine looks busy,\n"+
			"      and other processes' load will dominate the results (run it again when the machine is quieter)\n", steady, prof.Ramp.From)
	case capacity > 1500:
		fmt.Fprintf(out, "note: the tenant quotas are sized for about 500–1,000 calls/s; at %.0f calls/s the noisy tenant's quota\n"+
			"      binds before the server is overloaded: raise -cost (e.g. -cost %v) to see the overload protection at work\n", capacity, cfg.Server.Cost*time.Duration(math.Round(capacity/800)))
	}
	fmt.Fprintf(out, "ramping offered load %g× → %g× → %g× of capacity over %v; %d callers, %v deadline per call\n\n",
		prof.Ramp.From, prof.Ramp.To, prof.Ramp.From, cfg.Duration, len(prof.Callers), time.Duration(prof.Deadline))

	gen, err := loadgen.New(srv.addr(), prof, capacity, cfg.Duration, srv.skus, cfg.Seed)
	if err != nil {
		return nil, err
	}
	defer gen.Close()
	sum := gen.Run(ctx, loadgen.RunOptions{Gate: srv.gate, Ctrl: srv.ctrl, Counts: srv.counts.load,
		Out: out, Live: cfg.Live, Tick: cfg.tick, Every: cfg.Every})
	sum.Measured = cfg.Capacity == 0
	title := fmt.Sprintf("floodgate multitenant demo: %g×–%g× of %.0f calls/s, %v CPU per call, %s",
		prof.Ramp.From, prof.Ramp.To, capacity, cfg.Server.Cost, protection)
	return sum, sum.Report(out, cfg.Out, title)
}

// runInBackground starts a server of cfg; stop stops it and returns what
// its run returned.
func runInBackground(cfg serverConfig) (srv *server, stop func() error, err error) {
	if srv, err = newServer(cfg); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.run(ctx, 5*time.Second) }()
	return srv, func() error {
		cancel()
		return <-served
	}, nil
}

// measure finds the capacity with a server of its own, so that the run's
// server starts with a gate and a controller that have never seen the
// probe's full load. That server holds tenants to their quotas alone: the
// capacity is what the CPUs carry, the yardstick of the run's goodput, not
// what an overload protection admits.
func measure(ctx context.Context, cfg demoConfig, prof *loadgen.Profile, out io.Writer) (float64, error) {
	if prof.ProbeKey == "" {
		return 0, errors.New("the profile has no probe_key; give -capacity")
	}
	probeCfg := cfg.Server
	probeCfg.Addr = "127.0.0.1:0"
	probeCfg.Metrics = "" // the run's server serves them
	probeCfg.bare = true
	srv, stop, err := runInBackground(probeCfg)
	if err != nil {
		return 0, err
	}
	callers := 4 * max(int(math.Ceil(srv.budget)), 1)
	p, err := loadgen.ProbeCapacity(ctx, srv.addr(), prof.ProbeKey, srv.skus[0], callers, cmp.Or(cfg.probe, 2*time.Second))
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "capacity: %.0f calls/s served by %d callers back to back for %.1fs", p.Capacity, p.Callers, p.Length.Seconds())
	if p.CPU > 0 {
		fmt.Fprintf(out, " (%.2fms of CPU per call, client included: %.1f of %.1f CPUs busy)",
			float64(p.CPU)/float64(time.Millisecond), p.Capacity*p.CPU.Seconds(), srv.budget)
	}
	fmt.Fprintln(out)
	return p.Capacity, nil
}
