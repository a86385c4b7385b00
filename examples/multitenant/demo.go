package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/overload"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// demoConfig configures a demo run: a server on loopback, the simulated
// callers of a profile, a live table and a chart.
type demoConfig struct {
	ConfigPath  string        // tenant config
	ProfilePath string        // simulated callers
	Duration    time.Duration // length of the ramp
	Cost        time.Duration // CPU time per allocation
	Capacity    float64       // calls/s; 0 measures it
	Policy      string        // overload protection: overload, adaptive or fixed
	Sampler     string        // CPU sampler
	SchedP99    time.Duration // scheduling-latency guard; 0 is off
	Seed        uint64
	Every       time.Duration // between two prints of the table
	Out         string        // chart path; "" draws none
	Metrics     string        // metrics listen address; "" serves none
	Stdout      io.Writer
	Live        bool // redraw the table in place

	// tick is the sampling interval of the statistics and the chart.
	// Default 1s.
	tick time.Duration
	// probe is how long the capacity probe runs. Default 2s.
	probe time.Duration
	// sampler and burner, when set, replace the real ones (tests).
	sampler cpugate.Sampler
	burner  *burner
	// ctrlOpts are options for the overload controller (tests).
	ctrlOpts []overload.Option
}

// runDemo runs the whole demo and returns its summary. It stops early, with
// a summary of the part that ran, when ctx is done.
func runDemo(ctx context.Context, cfg demoConfig) (*summary, error) {
	if cfg.tick == 0 {
		cfg.tick = time.Second
	}
	out := cfg.Stdout
	prof, err := loadProfile(cfg.ProfilePath)
	if err != nil {
		return nil, err
	}
	if cfg.burner == nil {
		fmt.Fprintf(out, "calibrating %v of CPU work per allocation…\n", cfg.Cost)
		cfg.burner = calibrate()
	}
	capacity := cfg.Capacity
	if capacity == 0 {
		if capacity, err = measure(ctx, cfg, prof, out); err != nil {
			return nil, fmt.Errorf("measuring capacity: %w", err)
		}
	}

	srv, err := newServer(cfg.serverConfig())
	if err != nil {
		return nil, err
	}
	srvCtx, stopServer := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.run(srvCtx, 5*time.Second) }()
	defer func() {
		stopServer()
		<-served
	}()
	fmt.Fprintf(out, "server on %s: tenant config %s, %s\n", srv.addr(), cfg.ConfigPath, srv.protection())
	if srv.obs != nil {
		fmt.Fprintf(out, "metrics on http://%s%s, top offenders on http://%s%s\n",
			srv.obs.addr(), metricsPath, srv.obs.addr(), offendersPath)
	}
	// tenants.yaml and profile.yaml are sized for a server of about 500 to
	// 1,000 calls per second. Far outside that range the demo still runs,
	// but shows something else; say so rather than let the numbers mislead.
	switch steady := prof.steadyRate(); {
	case steady > prof.Ramp.From*capacity:
		fmt.Fprintf(out, "note: the steady callers alone offer %.0f calls/s, more than %g× the capacity: the machine looks busy,\n"+
			"      and other processes' load will dominate the results (run it again when the machine is quieter)\n", steady, prof.Ramp.From)
	case capacity > 1500:
		fmt.Fprintf(out, "note: the tenant quotas are sized for about 500–1,000 calls/s; at %.0f calls/s the noisy tenant's quota\n"+
			"      binds before the server is overloaded: raise -cost (e.g. -cost %v) to see the overload protection at work\n", capacity, cfg.Cost*time.Duration(math.Round(capacity/800)))
	}
	fmt.Fprintf(out, "ramping offered load %g× → %g× → %g× of capacity over %v; %d callers, %v deadline per call\n\n",
		prof.Ramp.From, prof.Ramp.To, prof.Ramp.From, cfg.Duration, len(prof.Callers), time.Duration(prof.Deadline))

	gen, err := newGenerator(srv.addr(), prof, capacity, cfg.Duration, srv.skus, cfg.Seed)
	if err != nil {
		return nil, err
	}
	defer gen.close()
	mon := newMonitor(gen, srv.gate, srv.ctrl, out, cfg.Live, int(max(cfg.Every/cfg.tick, 1)))
	observe(ctx, gen, mon, cfg.tick)

	sum := summarize(gen, mon.points, srv.limiter)
	sum.Measured = cfg.Capacity == 0
	if cfg.Out != "" {
		protection := "overload controller"
		if srv.ctrl == nil {
			protection = srv.cfg.Policy + " gate"
		}
		title := fmt.Sprintf("floodgate multitenant demo: %g×–%g× of %.0f calls/s, %v CPU per call, %s",
			prof.Ramp.From, prof.Ramp.To, capacity, cfg.Cost, protection)
		if err := writeChart(cfg.Out, title, mon.points); err != nil {
			return sum, err
		}
		sum.ChartPath = cfg.Out
	}
	sum.write(out)
	return sum, nil
}

// observe runs the generator and samples it every tick until it is done.
func observe(ctx context.Context, gen *generator, mon *monitor, tick time.Duration) {
	start := time.Now()
	done := make(chan struct{})
	go func() {
		gen.run(ctx, start)
		close(done)
	}()
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	last := start
	for {
		select {
		case <-done:
			// The calls still in flight when the schedule ended finished
			// after the last tick: count them in a last, shorter interval.
			if now := time.Now(); now.Sub(last) > tick/10 {
				mon.sample(now.Sub(start), now.Sub(last))
			}
			return
		case now := <-ticker.C:
			mon.sample(now.Sub(start), now.Sub(last))
			last = now
		}
	}
}

// serverConfig is the demo's server: on a free loopback port.
func (cfg *demoConfig) serverConfig() serverConfig {
	return serverConfig{
		Addr:       "127.0.0.1:0",
		ConfigPath: cfg.ConfigPath,
		Cost:       cfg.Cost,
		Policy:     cfg.Policy,
		Sampler:    cfg.Sampler,
		SchedP99:   cfg.SchedP99,
		Metrics:    cfg.Metrics,
		sampler:    cfg.sampler,
		burner:     cfg.burner,
		ctrlOpts:   cfg.ctrlOpts,
	}
}

// measure finds the capacity with a server of its own, so that the run's
// server starts with a gate and a controller that have never seen the
// probe's full load. That server holds tenants to their quotas alone: the
// capacity is what the CPUs carry, the yardstick of the run's goodput, not
// what an overload protection admits.
func measure(ctx context.Context, cfg demoConfig, prof *profile, out io.Writer) (float64, error) {
	if prof.ProbeKey == "" {
		return 0, errors.New("the profile has no probe_key; give -capacity")
	}
	probeCfg := cfg.serverConfig()
	probeCfg.Metrics = "" // the run's server serves them
	probeCfg.bare = true
	srv, err := newServer(probeCfg)
	if err != nil {
		return 0, err
	}
	srvCtx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.run(srvCtx, 5*time.Second) }()
	callers := 4 * max(int(math.Ceil(srv.budget)), 1)
	length := cfg.probe
	if length == 0 {
		length = 2 * time.Second
	}
	p, err := probeCapacity(ctx, srv.addr(), prof.ProbeKey, srv.skus[0], callers, length)
	stop()
	if serr := <-served; err == nil {
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

// A probe is the outcome of a capacity measurement.
type probe struct {
	Capacity float64       // calls per second served
	CPU      time.Duration // process CPU time per served call, client included; 0 when unknown
	Callers  int
	Length   time.Duration
}

// probeCapacity measures the server's capacity: callers closed-loop callers
// of an unlimited tenant send Allocate calls back to back for about length,
// enough to keep every CPU busy, and the calls served per second are the
// capacity. On a machine shared with other work this is the capacity the
// server really gets, which the CPU budget alone would overstate.
func probeCapacity(ctx context.Context, addr, key, sku string, callers int, length time.Duration) (probe, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return probe{}, err
	}
	defer conn.Close()
	client := inventoryv1.NewInventoryClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, apiKeyHeader, key)
	call := func() error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{Sku: sku, Quantity: 1})
		return err
	}
	for range 10 { // connect and warm up
		if err := call(); err != nil {
			return probe{}, err
		}
	}
	cpu0, cpuOK := processCPU()
	start := time.Now()
	var (
		served atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	for range callers {
		wg.Go(func() {
			for time.Since(start) < length && failed.Load() == nil {
				if err := call(); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := failed.Load(); err != nil {
		return probe{}, *err
	}
	n := served.Load()
	if n == 0 {
		return probe{}, errors.New("no call served")
	}
	p := probe{Capacity: float64(n) / elapsed.Seconds(), Callers: callers, Length: elapsed}
	if cpu1, ok := processCPU(); cpuOK && ok && cpu1 > cpu0 {
		p.CPU = (cpu1 - cpu0) / time.Duration(n)
	}
	return p, nil
}
