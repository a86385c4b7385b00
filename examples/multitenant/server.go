package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/promfloodgate"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/tenant"
)

// serverConfig configures the example server. The zero value of a field
// takes the default in its comment.
type serverConfig struct {
	// Addr is the address to listen on. Default 127.0.0.1:50051; port 0
	// picks a free port.
	Addr string
	// ConfigPath is the tenant config (YAML, or JSON by extension).
	// Required.
	ConfigPath string
	// Watch reloads the tenant config when the file changes.
	Watch bool
	// Redis, when set, is the address of a Redis server holding the
	// buckets, so that several servers share every tenant's quota. Empty
	// keeps them in memory (keyed).
	Redis string
	// Cost is the CPU time one Allocate spends; 0 spends none (the
	// commands' -cost flag defaults to defaultCost).
	Cost time.Duration
	// SKUs is the catalogue's size. Default 1000.
	SKUs int
	// Units is each SKU's initial stock. Default 1e12: a demo never runs
	// out.
	Units int64
	// Policy is the overload protection: "overload" (default), the overload
	// controller, with the CPU gate as its guard, whose readings explain its
	// decisions but scale nothing; or "adaptive" or "fixed", the CPU gate's
	// policy, which scales every tenant's quota while the CPU is saturated.
	Policy string
	// Sampler chooses the CPU sampler: "auto" (default: the best available,
	// cpugate.NewSampler), "cgroup", "process" or "host".
	Sampler string
	// SchedP99, when positive, also counts a reading hot when the 99th
	// percentile of goroutine scheduling latency reaches it: the guard that
	// sees saturation CPU use misses, such as busy neighbours on the host.
	// Only the gate policies act on it: the overload controller sheds by
	// its calls' latency, which a starved process shows by itself.
	SchedP99 time.Duration
	// Logger receives the transitions of whichever sheds, the overload
	// controller (with the CPU readings behind them) or the gate, the Redis
	// store's breaker transitions, config reloads and, with Metrics,
	// rejections (at most one line a second). Nil logs nothing.
	Logger *slog.Logger
	// Metrics, when set, is the address of an HTTP listener serving
	// Prometheus metrics on /metrics and the callers rejected most often
	// as JSON on /debug/floodgate/offenders; port 0 picks a free port.
	// Empty serves none.
	Metrics string
	// OTel, with Metrics, records floodgate's series through OpenTelemetry
	// (otelfloodgate) and serves them with OTel's Prometheus exporter,
	// instead of promfloodgate's collector. The Redis store's stay its.
	OTel bool

	// sampler, when set, replaces Sampler: tests script the CPU with it.
	sampler cpugate.Sampler
	// gateInterval is the gate's sampling interval. Default
	// cpugate.DefaultInterval.
	gateInterval time.Duration
	// burner, when set, skips the calibration (tests share one).
	burner *burner
	// ctrlOpts are options for the overload controller (tests).
	ctrlOpts []overload.Option
	// bare leaves both the controller and the gate's scale out: tenants
	// are held to their quotas alone. The capacity probe runs on such a
	// server, so that the capacity is what the CPUs carry, not what a
	// protection admits, and an unlimited tenant's closed loop is never
	// shed.
	bare bool
}

const (
	defaultAddr  = "127.0.0.1:50051"
	defaultCost  = 2 * time.Millisecond
	defaultSKUs  = 1000
	defaultUnits = 1_000_000_000_000
)

func (c *serverConfig) setDefaults() {
	if c.Addr == "" {
		c.Addr = defaultAddr
	}
	c.Cost = max(c.Cost, 0)
	if c.SKUs == 0 {
		c.SKUs = defaultSKUs
	}
	if c.Units == 0 {
		c.Units = defaultUnits
	}
	if c.Policy == "" {
		c.Policy = policyOverload
	}
	if c.Sampler == "" {
		c.Sampler = "auto"
	}
	if c.gateInterval == 0 {
		c.gateInterval = cpugate.DefaultInterval
	}
}

// Policies of serverConfig.Policy.
const (
	policyOverload = "overload"
	policyAdaptive = "adaptive"
	policyFixed    = "fixed"
)

// checkPolicy returns an error for a policy name serverConfig does not know.
func checkPolicy(name string) error {
	switch name {
	case policyOverload, policyAdaptive, policyFixed:
		return nil
	}
	return fmt.Errorf("unknown policy %q: want overload, adaptive or fixed", name)
}

// server is the example inventory server: the service behind floodgate's
// admission control, with the overload controller or the CPU gate, health
// checks and reflection.
type server struct {
	cfg     serverConfig
	lis     net.Listener
	grpc    *grpc.Server
	health  *health.Server
	inv     *inventory
	gate    *cpugate.Gate        // runs in every policy: its readings feed the tables
	ctrl    *overload.Controller // nil unless the policy is "overload"
	reg     *tenant.Registry
	limiter *middleware.Limiter
	store   floodgate.Store
	redis   *redis.Client  // nil with in-memory buckets
	obs     *observability // nil without cfg.Metrics
	source  string         // the CPU sampler's label
	budget  float64        // CPUs the sampler measures use against
	skus    []string

	// redisMetrics observes the Redis store; nil without Redis or
	// cfg.Metrics.
	redisMetrics *promfloodgate.RedisMetrics
}

// newServer builds the server and listens on cfg.Addr. It serves nothing
// until run.
func newServer(cfg serverConfig) (*server, error) {
	cfg.setDefaults()
	if cfg.ConfigPath == "" {
		return nil, errors.New("no tenant config")
	}
	if cfg.SKUs < 1 || cfg.Units < 1 {
		return nil, errors.New("the catalogue needs at least one SKU and one unit")
	}
	if err := checkPolicy(cfg.Policy); err != nil {
		return nil, err
	}
	s := &server{cfg: cfg, skus: skuNames(cfg.SKUs)}

	var err error
	s.reg, err = tenant.New(tenant.WithLogger(cfg.Logger))
	if err != nil {
		return nil, err
	}
	if err := s.reg.Load(cfg.ConfigPath); err != nil {
		return nil, err
	}
	if s.store, s.redis, s.redisMetrics, err = newStore(cfg); err != nil {
		return nil, err
	}

	sampler := cfg.sampler
	if sampler == nil {
		if sampler, s.source, s.budget, err = newSampler(cfg.Sampler); err != nil {
			return nil, err
		}
		// The guard adds the scheduling latency to every reading, so the
		// table shows it whether or not the policy acts on it.
		sampler = cpugate.NewSchedGuard(sampler)
	} else {
		s.source, s.budget = "scripted", float64(runtime.NumCPU())
	}
	useCtrl := cfg.Policy == policyOverload
	// With the controller the gate only reads the CPU: its policy is the
	// default one without the scheduling guard, and its state changes go
	// unlogged, since nothing acts on them.
	gatePolicy, sched, gateLog := cfg.Policy, cfg.SchedP99, cfg.Logger
	if useCtrl {
		gatePolicy, sched, gateLog = policyAdaptive, 0, nil
	}
	policy, err := newPolicy(gatePolicy, sched)
	if err != nil {
		return nil, err
	}
	if s.gate, err = cpugate.New(sampler,
		cpugate.WithPolicy(policy),
		cpugate.WithInterval(cfg.gateInterval),
		cpugate.WithLogger(gateLog),
	); err != nil {
		return nil, err
	}
	var protect middleware.Option
	switch {
	case cfg.bare:
	case useCtrl:
		opts := append([]overload.Option{overload.WithGuard(s.gate), overload.WithLogger(cfg.Logger)}, cfg.ctrlOpts...)
		if s.ctrl, err = overload.New(opts...); err != nil {
			s.closeStore()
			return nil, err
		}
		protect = middleware.WithOverload(s.ctrl)
	default:
		// While the gate sheds, the tap handle turns callers still inside
		// their retry delay away before their request is read.
		protect = middleware.WithGate(s.gate)
	}
	var extra []middleware.Option
	if cfg.Metrics != "" {
		if s.obs, err = newObservability(s, cfg.Metrics); err != nil {
			s.closeStore()
			return nil, fmt.Errorf("metrics: %w", err)
		}
		extra = append(extra, middleware.WithObserver(s.obs.observer()),
			middleware.WithRejectedSubjects(s.obs.offenders.RecordSubject))
	}
	if s.limiter, err = newLimiter(s.store, s.reg, protect, extra...); err != nil {
		s.closeListeners()
		return nil, err
	}
	if s.obs != nil {
		s.obs.setLimiter(s.limiter)
	}

	b := cfg.burner
	if b == nil {
		b = calibrate()
	}
	s.inv = newInventory(s.skus, cfg.Units, cfg.Cost, b)
	s.grpc = grpc.NewServer(admission(s.limiter)...)
	inventoryv1.RegisterInventoryServer(s.grpc, s.inv)
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(inventoryv1.Inventory_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	if s.lis, err = net.Listen("tcp", cfg.Addr); err != nil {
		s.closeListeners()
		return nil, err
	}
	return s, nil
}

// closeListeners releases what newServer opened before failing.
func (s *server) closeListeners() {
	if s.obs != nil {
		s.obs.lis.Close()
	}
	s.closeStore()
}

// closeStore closes the Redis client, if any.
func (s *server) closeStore() {
	if s.redis != nil {
		s.redis.Close()
	}
}

// protection describes the server's overload protection for its banner.
func (s *server) protection() string {
	if s.ctrl != nil {
		return fmt.Sprintf("overload controller, with CPU readings from %s (%.1f CPUs)", s.source, s.budget)
	}
	return fmt.Sprintf("%s gate on %s CPU (%.1f CPUs)", s.cfg.Policy, s.source, s.budget)
}

// addr returns the address the server listens on.
func (s *server) addr() string { return s.lis.Addr().String() }

// run serves until ctx is done, then stops gracefully: health checks turn
// NOT_SERVING, watch streams end, calls in flight get up to grace to finish,
// and the gate's and the config watcher's loops end. It returns the error
// that stopped serving early, or nil after a stop through ctx.
func (s *server) run(ctx context.Context, grace time.Duration) error {
	loops, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.gate.Run(loops) })
	if s.cfg.Watch {
		wg.Go(func() { _ = s.reg.Watch(loops, s.cfg.ConfigPath) })
	}
	served := make(chan error, 2)
	wg.Go(func() { served <- s.grpc.Serve(s.lis) })
	if s.obs != nil {
		wg.Go(func() {
			if err := s.obs.serve(); err != nil {
				served <- fmt.Errorf("metrics: %w", err)
			}
		})
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		err = fmt.Errorf("serve: %w", err)
	}
	s.stop(grace)
	if s.obs != nil {
		s.obs.shutdown(grace)
	}
	cancel()
	wg.Wait()
	if s.redis != nil {
		s.redis.Close()
	}
	return err
}

// stop drains the server: GracefulStop waits for calls in flight, and Stop
// cuts them off once grace has passed.
func (s *server) stop(grace time.Duration) {
	s.health.Shutdown()
	s.inv.stop()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		s.grpc.Stop()
		<-done
	}
}

// promfloodgate names only the core module's types (package remote), so that its module
// needs no go-redis: this is where its RedisMetrics is checked against the
// store's Observer.
var _ redisstore.Observer = (*promfloodgate.RedisMetrics)(nil)

// newStore returns the bucket store: in memory, or on the Redis at
// cfg.Redis, whose breaker transitions go to cfg.Logger and, with
// cfg.Metrics, whose calls are observed by the returned RedisMetrics.
func newStore(cfg serverConfig) (floodgate.Store, *redis.Client, *promfloodgate.RedisMetrics, error) {
	if cfg.Redis == "" {
		m, err := keyed.New()
		return m, nil, nil, err
	}
	opts := []redisstore.Option{redisstore.WithLogger(cfg.Logger)}
	var metrics *promfloodgate.RedisMetrics
	if cfg.Metrics != "" {
		var err error
		if metrics, err = promfloodgate.NewRedisMetrics(); err != nil {
			return nil, nil, nil, err
		}
		opts = append(opts, redisstore.WithObserver(metrics))
	}
	// The store's per-decision deadline reaches Redis only with context
	// timeouts on, and a failed call should fall back at once, not retry.
	client := redis.NewClient(&redis.Options{Addr: cfg.Redis, ContextTimeoutEnabled: true, MaxRetries: -1})
	store, err := redisstore.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, nil, nil, err
	}
	return store, client, metrics, nil
}

// newSampler returns the named CPU sampler, its source label and the CPUs it
// measures use against.
func newSampler(name string) (cpugate.Sampler, string, float64, error) {
	switch name {
	case "auto":
		s, source, err := cpugate.NewSampler()
		if err != nil {
			return nil, "", 0, err
		}
		return s, source, samplerBudget(s), nil
	case "cgroup":
		s, err := cpugate.NewCgroupSampler()
		if err != nil {
			return nil, "", 0, err
		}
		return s, s.Source(), s.Budget(), nil
	case "process":
		s, err := cpugate.NewProcessSampler()
		if err != nil {
			return nil, "", 0, err
		}
		return s, cpugate.SourceProcess, float64(s.CPUs()), nil
	case "host":
		s, err := cpugate.NewHostSampler()
		if err != nil {
			return nil, "", 0, err
		}
		return s, cpugate.SourceHost, float64(runtime.NumCPU()), nil
	}
	return nil, "", 0, fmt.Errorf("unknown sampler %q: want auto, cgroup, process or host", name)
}

// samplerBudget is the CPU budget a sampler measures against.
func samplerBudget(s cpugate.Sampler) float64 {
	switch s := s.(type) {
	case *cpugate.CgroupSampler:
		return s.Budget()
	case *cpugate.ProcessSampler:
		return float64(s.CPUs())
	}
	return float64(runtime.NumCPU())
}

// newPolicy returns the named gate policy, with the scheduling-latency guard
// at sched (0: off).
func newPolicy(name string, sched time.Duration) (cpugate.Policy, error) {
	switch name {
	case policyAdaptive:
		return cpugate.Adaptive{SchedP99: sched}, nil
	case policyFixed:
		return cpugate.Fixed{SchedP99: sched}, nil
	}
	return nil, fmt.Errorf("unknown gate policy %q: want adaptive or fixed", name)
}
