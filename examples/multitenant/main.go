// Command multitenant shows floodgate shedding load at work, end to end:
// an inventory service (proto/inventory/v1) behind floodgate's middleware,
// with per-tenant quotas from a tenant config and the overload controller
// (package overload), put under load by simulated tenants until it is
// overloaded, and back.
//
// Run without arguments, from anywhere in the repository, it is a
// self-contained demo on loopback (127.0.0.1 only):
//
//	go run ./examples/multitenant
//
// The demo goes through five steps:
//
//  1. It starts the server on a free loopback port, with in-memory buckets
//     (keyed), the tenant config testdata/multitenant/tenants.yaml, the
//     overload controller with the CPU gate as its guard, gRPC health checks
//     and reflection. Each Allocate spends about 2ms of real CPU (a hash
//     loop calibrated at start).
//  2. It measures the capacity, the calls per second the CPUs can carry, on
//     a server of its own that holds tenants to their quotas alone, with
//     callers of an unlimited tenant sending calls back to back; and the
//     CPU one served call costs, client included.
//  3. It runs the callers of testdata/multitenant/profile.yaml: nine steady
//     tenants well within their quotas, one noisy tenant, and anonymous
//     callers, each with open-loop Poisson arrivals, a deadline on every call
//     and a retry policy that honours the server's pushback. The noisy
//     tenant's rate ramps the offered load from 0.5× to 3× the capacity and
//     back over a minute (-duration).
//  4. Every two seconds it prints a table per caller: offered, admitted and
//     shed calls per second by reason (quota, overload), calls that missed
//     their deadline or failed, retries, and the p50 and p99 latency of
//     admitted calls, under a line with the controller's state: its
//     concurrency limit, the calls in flight and waiting for a slot, the
//     calls inside the server (counted from the tap) against its places,
//     the wait for a slot against the target, the latency of its calls
//     against their baseline (the latency of a call that does not queue),
//     what completes per second, and the CPU.
//  5. It ends with a summary, which holds the goodput under overload against
//     the measured capacity, and a chart (PNG) of offered load, goodput,
//     shed rate, what the controller's calls complete, CPU, its concurrency
//     limit and latency over time,
//     multitenant.png in the working directory by default (-out).
//
// What to look for: the steady tenants keep every call and a low latency
// while the noisy tenant is shed; goodput stays near the measured capacity
// while the offered load is far above it. A caller over its quota is
// rejected with RESOURCE_EXHAUSTED ("quota"); a call the server has no room
// for, with UNAVAILABLE ("overload"). The controller admits calls up to a
// concurrency limit that it finds from its calls' latency, lets a few more
// wait briefly for a slot, and sheds the rest from the tenants holding more
// than their fair share first: the noisy tenant, whose waiting calls make
// room for a steady tenant's. CPU-bound calls like Allocate queue for the
// CPU before the controller sees them, so it also measures that queueing
// delay and, past its target, limits the rate of admissions to what the
// server completes, each tenant to its fair share of it. It scales no
// quota: while it admits more than the steady tenants ask, they are not
// shed for the noisy tenant's traffic.
// The retry policy's throttle keeps retries of a mostly rejected caller
// near zero.
//
// -policy adaptive or fixed shows the CPU gate instead, as before the
// controller: it scales every tenant's quota by one factor while the CPU is
// saturated, so that a caller over its scaled quota is rejected with
// UNAVAILABLE ("overload"), and its guard on goroutine scheduling latency
// (-sched-p99) sheds too when the process cannot get the CPU it is entitled
// to.
//
// The parts also run separately, against any address:
//
//	go run ./examples/multitenant serve [-addr 127.0.0.1:50051] [-config file] [-redis 127.0.0.1:6379] [-metrics 127.0.0.1:9090 [-otel]]
//	go run ./examples/multitenant load  [-addr 127.0.0.1:50051] [-profile file] -capacity 800
//
// With -metrics, the server (in the demo too) serves Prometheus metrics on
// /metrics, the controller's signals among them, and its most rejected
// callers, hashed, on /debug/floodgate/offenders. With -otel as well,
// serve records them through OpenTelemetry (otelfloodgate) and serves them
// with OTel's Prometheus exporter.
//
// Both default to loopback: the demo sends thousands of calls per second,
// and is meant for a machine of your own. The simulated API keys are demo
// values; the tenant config holds only their SHA-256 digests.
//
// The demo shares the machine with whatever else runs on it. The controller
// acts only when its own limits bind: it moves its concurrency limit only
// while calls wait for a slot, and sheds only when the server holds all
// the calls it can run and queue. So a busy host does not make it shed an
// idle server. The CPU it shows (the gate's reading, of the
// container's cgroup by default, see -sampler) explains its decisions. The
// gate policies act on that reading alone, so other busy processes make
// them shed sooner. The capacity is measured, not assumed, so on a
// busy machine it is lower and the numbers move with the neighbours' load.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

const (
	defaultConfigPath  = "testdata/multitenant/tenants.yaml"
	defaultProfilePath = "testdata/multitenant/profile.yaml"
	// defaultSchedP99 turns the gate's scheduling-latency guard on: goroutines
	// waiting 50ms to run, 25 times an allocation's work, mean the process
	// is starved even when the CPU counters say otherwise, as they do on a
	// machine whose other tenants take the cores (or under CPU throttling).
	// Lower values catch every short burst of a neighbour's work too and keep
	// the gate at its floor.
	defaultSchedP99 = 50 * time.Millisecond
)

// Help of the flags the demo and serve share.
const (
	policyHelp = "overload protection: overload (the overload controller: an adaptive concurrency limit that sheds the tenants over their fair share first), " +
		"or adaptive or fixed (the CPU gate's policy, which scales every tenant's quota while the CPU is saturated)"
	schedHelp = "with -policy adaptive or fixed, also shed while the p99 of goroutine scheduling latency reaches this; 0 is off. " +
		"With -policy overload it sheds nothing: the controller acts on its calls' latency"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage is printed
		}
		fmt.Fprintln(os.Stderr, "multitenant:", err)
		os.Exit(2)
	}
}

// run dispatches to the subcommand named by args[0], the demo by default.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "demo"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "demo":
		return demoCmd(ctx, args, stdout, stderr)
	case "serve":
		return serveCmd(ctx, args, stderr)
	case "load":
		return loadCmd(ctx, args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "usage: multitenant [demo|serve|load] [flags]\n")
	return fmt.Errorf("unknown command %q", cmd)
}

func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("multitenant", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg demoConfig
	fs.StringVar(&cfg.ConfigPath, "config", defaultConfigPath, "tenant config `file` (YAML, or JSON by extension)")
	fs.StringVar(&cfg.ProfilePath, "profile", defaultProfilePath, "simulated callers `file`")
	fs.DurationVar(&cfg.Duration, "duration", 60*time.Second, "length of the load ramp")
	fs.DurationVar(&cfg.Cost, "cost", defaultCost, "CPU time each Allocate spends")
	fs.Float64Var(&cfg.Capacity, "capacity", 0, "server capacity in calls/s; 0 measures it")
	fs.StringVar(&cfg.Policy, "policy", policyOverload, policyHelp)
	fs.StringVar(&cfg.Sampler, "sampler", "auto", "CPU sampler: auto, cgroup, process or host")
	fs.DurationVar(&cfg.SchedP99, "sched-p99", defaultSchedP99, schedHelp)
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the simulated arrivals")
	fs.DurationVar(&cfg.Every, "every", 2*time.Second, "time between two tables")
	fs.StringVar(&cfg.Out, "out", "multitenant.png", "chart `file` (PNG); empty draws none")
	fs.StringVar(&cfg.Metrics, "metrics", "", "serve Prometheus /metrics and /debug/floodgate/offenders on this `address` (e.g. 127.0.0.1:9090); empty serves none")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: multitenant [flags]    (serve and load run the parts separately)\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.Duration <= 0 || cfg.Every <= 0 || cfg.Capacity < 0 {
		return errors.New("-duration and -every must be positive, -capacity not negative")
	}
	if err := checkPolicy(cfg.Policy); err != nil {
		return err
	}
	var err error
	if cfg.ConfigPath, err = findFile(cfg.ConfigPath, fs, "config"); err != nil {
		return err
	}
	if cfg.ProfilePath, err = findFile(cfg.ProfilePath, fs, "profile"); err != nil {
		return err
	}
	if cfg.Out != "" {
		if cfg.Out, err = filepath.Abs(cfg.Out); err != nil {
			return err
		}
	}
	if cfg.Policy == policyOverload && cfg.SchedP99 > 0 && isSet(fs, "sched-p99") {
		fmt.Fprintln(stderr, "multitenant: -sched-p99 applies to -policy adaptive and fixed only: the overload controller sheds by its calls' latency")
	}
	cfg.Stdout, cfg.Live = stdout, isTerminal(stdout)
	_, err = runDemo(ctx, cfg)
	return err
}

func serveCmd(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("multitenant serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg serverConfig
	var grace, every time.Duration
	fs.StringVar(&cfg.Addr, "addr", defaultAddr, "listen `address`; the server is meant for loopback")
	fs.StringVar(&cfg.ConfigPath, "config", defaultConfigPath, "tenant config `file`, reloaded when it changes")
	fs.DurationVar(&cfg.Cost, "cost", defaultCost, "CPU time each Allocate spends")
	fs.StringVar(&cfg.Redis, "redis", "", "Redis `address` for the buckets, shared by several servers; empty keeps them in memory")
	fs.IntVar(&cfg.SKUs, "skus", defaultSKUs, "SKUs in the catalogue (sku-00000, …)")
	fs.StringVar(&cfg.Policy, "policy", policyOverload, policyHelp)
	fs.StringVar(&cfg.Sampler, "sampler", "auto", "CPU sampler: auto, cgroup, process or host")
	fs.DurationVar(&cfg.SchedP99, "sched-p99", defaultSchedP99, schedHelp)
	fs.DurationVar(&grace, "grace", 10*time.Second, "time calls in flight get to finish on SIGINT or SIGTERM")
	fs.DurationVar(&every, "every", 5*time.Second, "time between two status lines; 0 prints none")
	fs.StringVar(&cfg.Metrics, "metrics", "", "serve Prometheus /metrics and /debug/floodgate/offenders on this `address` (e.g. 127.0.0.1:9090); empty serves none")
	fs.BoolVar(&cfg.OTel, "otel", false, "with -metrics, record floodgate's series through OpenTelemetry and serve them with OTel's Prometheus exporter")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := checkPolicy(cfg.Policy); err != nil {
		return err
	}
	if cfg.OTel && cfg.Metrics == "" {
		return errors.New("-otel needs -metrics, the address to serve them on")
	}
	var err error
	if cfg.ConfigPath, err = findFile(cfg.ConfigPath, fs, "config"); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg.Logger, cfg.Watch = log, true
	srv, err := newServer(cfg)
	if err != nil {
		return err
	}
	buckets := "memory"
	if cfg.Redis != "" {
		buckets = "redis " + cfg.Redis
	}
	log.Info("serving inventory.v1.Inventory", "addr", srv.addr(), "config", cfg.ConfigPath, "buckets", buckets,
		"cost", srv.cfg.Cost, "policy", srv.cfg.Policy, "cpu_source", srv.source, "cpus", srv.budget)
	if srv.ctrl != nil && cfg.SchedP99 > 0 && isSet(fs, "sched-p99") {
		log.Warn("-sched-p99 applies to the gate policies only: the overload controller sheds by its calls' latency", "policy", srv.cfg.Policy)
	}
	if srv.obs != nil {
		log.Info("serving metrics", "url", "http://"+srv.obs.addr()+metricsPath, "offenders", "http://"+srv.obs.addr()+offendersPath)
	}
	if every > 0 {
		go statusLoop(ctx, srv, log, every)
	}
	err = srv.run(ctx, grace)
	st := srv.limiter.Stats()
	// The controller's sheds are calls the quota admitted (Stats).
	log.Info("stopped", "admitted", st.Admitted-st.Shed, "quota", st.Quota, "overload", st.Overload+st.Shed, "tap", st.Tap, "exempt", st.Exempt)
	return err
}

// statusLoop logs the server's admission counters every interval, with the
// overload controller's state, or the gate's.
func statusLoop(ctx context.Context, srv *server, log *slog.Logger, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	prev := srv.limiter.Stats()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, g := srv.limiter.Stats(), srv.gate.Snapshot()
		rate := func(a, b uint64) string { return fmt.Sprintf("%.1f/s", float64(a-b)/every.Seconds()) }
		attrs := []any{"admitted", rate(st.Admitted-st.Shed, prev.Admitted-prev.Shed), "quota", rate(st.Quota, prev.Quota),
			"overload", rate(st.Overload+st.Shed, prev.Overload+prev.Shed), "tap", rate(st.Tap, prev.Tap)}
		if srv.ctrl != nil {
			// The controller's own names for its signals, as in its log
			// lines and metrics.
			c := srv.ctrl.Snapshot()
			attrs = append(attrs, "state", c.State.String(), "limit", fmt.Sprintf("%.1f", c.Limit),
				"inflight", c.Inflight, "queued", c.Queued, "inside", c.Inside, "wait", c.Wait, "target", c.Target,
				"latency", c.Latency, "baseline", c.Baseline, "throughput", fmt.Sprintf("%.0f", c.Throughput))
		} else {
			attrs = append(attrs, "gate", g.State.String(), "scale", fmt.Sprintf("%.2f", g.Scale))
		}
		attrs = append(attrs, "cpu", fmt.Sprintf("%.0f%%", 100*g.Smoothed))
		log.Info("status", attrs...)
		prev = st
	}
}

func loadCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("multitenant load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		addr, profilePath, out string
		capacity               float64
		length, every          time.Duration
		seed                   uint64
		skus                   int
	)
	fs.StringVar(&addr, "addr", defaultAddr, "server `address`; the load is meant for loopback")
	fs.StringVar(&profilePath, "profile", defaultProfilePath, "simulated callers `file`")
	fs.Float64Var(&capacity, "capacity", 0, "the server's capacity in calls/s, which the ramp multiplies; default the profile's")
	fs.DurationVar(&length, "duration", 60*time.Second, "length of the load ramp")
	fs.DurationVar(&every, "every", 2*time.Second, "time between two tables")
	fs.Uint64Var(&seed, "seed", 1, "seed of the simulated arrivals")
	fs.IntVar(&skus, "skus", defaultSKUs, "SKUs in the server's catalogue")
	fs.StringVar(&out, "out", "multitenant-load.png", "chart `file` (PNG); empty draws none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if profilePath, err = findFile(profilePath, fs, "profile"); err != nil {
		return err
	}
	prof, err := loadProfile(profilePath)
	if err != nil {
		return err
	}
	if capacity == 0 {
		capacity = prof.Capacity
	}
	if capacity <= 0 || length <= 0 || every <= 0 || skus < 1 {
		return errors.New("-capacity (or the profile's capacity), -duration, -every and -skus must be positive")
	}
	gen, err := newGenerator(addr, prof, capacity, length, skuNames(skus), seed)
	if err != nil {
		return err
	}
	defer gen.close()
	fmt.Fprintf(stdout, "load on %s: %g× → %g× → %g× of %.0f calls/s over %v, %d callers\n\n",
		addr, prof.Ramp.From, prof.Ramp.To, prof.Ramp.From, capacity, length, len(prof.Callers))
	const tick = time.Second
	mon := newMonitor(gen, nil, nil, stdout, isTerminal(stdout), int(max(every/tick, 1)))
	observe(ctx, gen, mon, tick)
	sum := summarize(gen, mon.points, nil)
	if out != "" {
		title := fmt.Sprintf("floodgate multitenant load on %s: %g×–%g× of %.0f calls/s", addr, prof.Ramp.From, prof.Ramp.To, capacity)
		if err := writeChart(out, title, mon.points); err != nil {
			return err
		}
		sum.ChartPath = out
	}
	sum.write(stdout)
	return nil
}

// isSet reports whether the flag name was set on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// findFile resolves a default data file relative to the working directory
// or, when it is not there, to the nearest parent directory that has it, so
// that go run ./examples/multitenant works from anywhere in the repository.
// A path the user set is taken as given.
func findFile(path string, fs *flag.FlagSet, name string) (string, error) {
	if isSet(fs, name) || filepath.IsAbs(path) {
		return path, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, path)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found in the working directory or its parents; give -%s", path, name)
		}
		dir = parent
	}
}

// isTerminal reports whether w is a terminal, where the table can be
// redrawn in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
