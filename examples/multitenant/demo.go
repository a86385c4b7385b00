package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-go/floodgate/cpugate"
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
	Policy      string        // gate policy
	Sampler     string        // CPU sampler
	SchedP99    time.Duration // scheduling-latency guard; 0 is off
	Seed        uint64
	Every       time.Duration // between two prints of the table
	Out         string        // chart path; "" draws none
	Stdout      io.Writer
	Live        bool // redraw the table in place

	// tick is the sampling interval of the statistics and the chart.
	// Default 1s.
	tick time.Duration
	// sampler and burner, when set, replace the real ones (tests).
	sampler cpugate.Sampler
	burner  *burner
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
	fmt.Fprintf(out, "calibrating %v of CPU work per allocation…\n", cfg.Cost)
	srv, err := newServer(serverConfig{
		Addr:       "127.0.0.1:0",
		ConfigPath: cfg.ConfigPath,
		Cost:       cfg.Cost,
		Policy:     cfg.Policy,
		Sampler:    cfg.Sampler,
		SchedP99:   cfg.SchedP99,
		sampler:    cfg.sampler,
		burner:     cfg.burner,
	})
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
	fmt.Fprintf(out, "server on %s: tenant config %s, %s gate on %s CPU (%.1f CPUs)\n",
		srv.addr(), cfg.ConfigPath, srv.cfg.Policy, srv.source, srv.budget)

	capacity := cfg.Capacity
	if capacity == 0 {
		if prof.ProbeKey == "" {
			return nil, errors.New("the profile has no probe_key to measure capacity with; give -capacity")
		}
		perCall, err := probeCost(ctx, srv.addr(), prof.ProbeKey, srv.skus[0])
		if err != nil {
			return nil, fmt.Errorf("measuring capacity: %w", err)
		}
		capacity = srv.budget / perCall.Seconds()
		fmt.Fprintf(out, "capacity: %.2fms of CPU per served call, client included → about %.0f calls/s on %.1f CPUs\n",
			float64(perCall)/float64(time.Millisecond), capacity, srv.budget)
	}
	fmt.Fprintf(out, "ramping offered load %g× → %g× → %g× of capacity over %v; %d callers, %v deadline per call\n\n",
		prof.Ramp.From, prof.Ramp.To, prof.Ramp.From, cfg.Duration, len(prof.Callers), time.Duration(prof.Deadline))

	gen, err := newGenerator(srv.addr(), prof, capacity, cfg.Duration, srv.skus, cfg.Seed)
	if err != nil {
		return nil, err
	}
	defer gen.close()
	mon := newMonitor(gen, srv.gate, out, cfg.Live, int(max(cfg.Every/cfg.tick, 1)))
	observe(ctx, gen, mon, cfg.tick)

	sum := summarize(gen, mon.points, srv.limiter)
	if cfg.Out != "" {
		title := fmt.Sprintf("floodgate multitenant demo: %g×–%g× of %.0f calls/s, %v CPU per call, %s gate",
			prof.Ramp.From, prof.Ramp.To, capacity, cfg.Cost, srv.cfg.Policy)
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

// probeCost measures the CPU time this process spends per served Allocate,
// client and server together, with sequential calls from an unlimited
// tenant. Sequential calls keep the CPU mostly idle, so the gate stays open
// and the measure holds only the call's own cost.
func probeCost(ctx context.Context, addr, key, sku string) (time.Duration, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
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
	for range 20 { // connect and warm up
		if err := call(); err != nil {
			return 0, err
		}
	}
	const minCalls, maxCalls, minTime = 100, 5000, 500 * time.Millisecond
	cpu0, ok := processCPU()
	start := time.Now()
	n := 0
	for n < minCalls || (time.Since(start) < minTime && n < maxCalls) {
		if err := call(); err != nil {
			return 0, err
		}
		n++
	}
	elapsed := time.Since(start)
	if cpu1, ok1 := processCPU(); ok && ok1 && cpu1 > cpu0 {
		elapsed = cpu1 - cpu0
	}
	return elapsed / time.Duration(n), nil
}
