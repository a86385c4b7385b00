// Command multitenant shows floodgate shedding load at work, end to end: an
// inventory service (proto/inventory/v1) behind floodgate's middleware, with
// per-tenant quotas and the overload controller, put under load by
// simulated tenants until it is overloaded, and back.
//
// Run without arguments, from anywhere in the repository, it is a
// self-contained demo on loopback (127.0.0.1 only), its buckets in memory:
//
//	go run ./examples/multitenant
//
// It starts the server (server.go) with the tenant config
// testdata/multitenant/tenants.yaml, each Allocate spending about 2ms of
// real CPU (-cost); measures the capacity, the calls per second the CPUs
// carry, on a server that holds tenants to their quotas alone; then runs
// the callers of testdata/multitenant/profile.yaml (package loadgen): nine
// steady tenants within their quotas, anonymous callers, and one noisy
// tenant whose rate ramps the offered load from 0.5× to 3× the capacity and
// back over a minute (-duration). Every two seconds it prints a table per
// caller under a line with the controller's state, and it ends with a
// summary, which holds the goodput under overload against the measured
// capacity, and a chart, multitenant.png in the working directory (-out).
//
// What to look for: the steady tenants keep every call and a low latency
// while the noisy tenant is shed; goodput stays near the capacity while the
// offered load is far above it. A caller over its quota is rejected with
// RESOURCE_EXHAUSTED ("quota"), a call the server has no room for with
// UNAVAILABLE ("overload"). -policy adaptive or fixed sheds with the CPU
// gate instead, which scales every tenant's quota while the CPU is
// saturated (and, with -sched-p99, while goroutines wait to run). With the
// overload controller the gate only reads the CPU, for the tables.
//
// The parts also run separately, against any address:
//
//	go run ./examples/multitenant serve [-addr 127.0.0.1:50051] [-config file] [-redis 127.0.0.1:6379] [-metrics 127.0.0.1:9090 [-otel]]
//	go run ./examples/multitenant load  [-addr 127.0.0.1:50051] [-profile file] -capacity 800
//
// With -metrics, the server (in the demo too) serves Prometheus metrics on
// /metrics and its most rejected callers, hashed, on
// /debug/floodgate/offenders; with -otel as well, serve records them
// through OpenTelemetry (otelfloodgate). Both default to loopback: the
// demo sends thousands of calls per second, and is meant for a machine of
// your own. The simulated API keys are demo values; the tenant config
// holds only their SHA-256 digests. docs/demo.md walks through a run.
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

	"github.com/floodgate-go/floodgate/examples/multitenant/internal/loadgen"
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

// serverFlags defines the flags of cfg that the demo and serve share.
func serverFlags(fs *flag.FlagSet, cfg *serverConfig) {
	fs.StringVar(&cfg.ConfigPath, "config", defaultConfigPath, "tenant config `file` (YAML, or JSON by extension)")
	fs.DurationVar(&cfg.Cost, "cost", defaultCost, "CPU time each Allocate spends")
	fs.StringVar(&cfg.Policy, "policy", policyOverload, "overload protection: overload (the overload controller: an adaptive concurrency limit "+
		"that sheds the tenants over their fair share first), or adaptive or fixed (the CPU gate's policy, which scales every tenant's quota while the CPU is saturated)")
	fs.StringVar(&cfg.Sampler, "sampler", "auto", "CPU sampler: auto, cgroup, process or host")
	fs.DurationVar(&cfg.SchedP99, "sched-p99", defaultSchedP99, "with -policy adaptive or fixed, also shed while the p99 of goroutine scheduling latency "+
		"reaches this; 0 is off. With -policy overload it sheds nothing: the controller acts on its calls' latency")
	fs.StringVar(&cfg.Metrics, "metrics", "", "serve Prometheus /metrics and /debug/floodgate/offenders on this `address` (e.g. 127.0.0.1:9090); empty serves none")
}

// parse parses args into fs's flags, and checks what serverFlags defined
// and that no argument is left.
func parse(fs *flag.FlagSet, args []string, cfg *serverConfig) (err error) {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := checkPolicy(cfg.Policy); err != nil {
		return err
	}
	cfg.ConfigPath, err = findFile(cfg.ConfigPath, fs, "config")
	return err
}

func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("multitenant", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg demoConfig
	serverFlags(fs, &cfg.Server)
	fs.StringVar(&cfg.ProfilePath, "profile", defaultProfilePath, "simulated callers `file`")
	fs.DurationVar(&cfg.Duration, "duration", 60*time.Second, "length of the load ramp")
	fs.Float64Var(&cfg.Capacity, "capacity", 0, "server capacity in calls/s; 0 measures it")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the simulated arrivals")
	fs.DurationVar(&cfg.Every, "every", 2*time.Second, "time between two tables")
	fs.StringVar(&cfg.Out, "out", "multitenant.png", "chart `file` (PNG); empty draws none")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: multitenant [flags]    (serve and load run the parts separately)\n\n")
		fs.PrintDefaults()
	}
	if err := parse(fs, args, &cfg.Server); err != nil {
		return err
	}
	if cfg.Duration <= 0 || cfg.Every <= 0 || cfg.Capacity < 0 {
		return errors.New("-duration and -every must be positive, -capacity not negative")
	}
	var err error
	if cfg.ProfilePath, err = findFile(cfg.ProfilePath, fs, "profile"); err != nil {
		return err
	}
	if cfg.Out != "" {
		if cfg.Out, err = filepath.Abs(cfg.Out); err != nil {
			return err
		}
	}
	if cfg.Server.Policy == policyOverload && cfg.Server.SchedP99 > 0 && isSet(fs, "sched-p99") {
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
	serverFlags(fs, &cfg)
	fs.StringVar(&cfg.Addr, "addr", defaultAddr, "listen `address`; the server is meant for loopback")
	fs.StringVar(&cfg.Redis, "redis", "", "Redis `address` for the buckets, shared by several servers; empty keeps them in memory")
	fs.IntVar(&cfg.SKUs, "skus", defaultSKUs, "SKUs in the catalogue (sku-00000, …)")
	fs.BoolVar(&cfg.OTel, "otel", false, "with -metrics, record floodgate's series through OpenTelemetry and serve them with OTel's Prometheus exporter")
	fs.DurationVar(&grace, "grace", 10*time.Second, "time calls in flight get to finish on SIGINT or SIGTERM")
	fs.DurationVar(&every, "every", 5*time.Second, "time between two status lines; 0 prints none")
	if err := parse(fs, args, &cfg); err != nil {
		return err
	}
	if cfg.OTel && cfg.Metrics == "" {
		return errors.New("-otel needs -metrics, the address to serve them on")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg.Logger, cfg.Watch = log, true // the tenant config is reloaded when it changes
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
	st := srv.counts.load()
	log.Info("stopped", "admitted", st.Admitted, "quota", st.Quota, "overload", st.Overload, "tap", st.Tap, "exempt", st.Exempt)
	return err
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
	prof, err := loadgen.LoadProfile(profilePath)
	if err != nil {
		return err
	}
	if capacity == 0 {
		capacity = prof.Capacity
	}
	if capacity <= 0 || length <= 0 || every <= 0 || skus < 1 {
		return errors.New("-capacity (or the profile's capacity), -duration, -every and -skus must be positive")
	}
	gen, err := loadgen.New(addr, prof, capacity, length, skuNames(skus), seed)
	if err != nil {
		return err
	}
	defer gen.Close()
	fmt.Fprintf(stdout, "load on %s: %g× → %g× → %g× of %.0f calls/s over %v, %d callers\n\n",
		addr, prof.Ramp.From, prof.Ramp.To, prof.Ramp.From, capacity, length, len(prof.Callers))
	sum := gen.Run(ctx, loadgen.RunOptions{Out: stdout, Live: isTerminal(stdout), Every: every})
	title := fmt.Sprintf("floodgate multitenant load on %s: %g×–%g× of %.0f calls/s", addr, prof.Ramp.From, prof.Ramp.To, capacity)
	return sum.Report(stdout, out, title)
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
