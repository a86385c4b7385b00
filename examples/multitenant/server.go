package main

// The inventory server behind floodgate, the part of this example to copy:
// tenants and their quotas, a bucket store, the overload controller, and the
// Limiter that joins them in front of every call through the tap handle and
// the interceptors. options.go and metrics.go hold the demo's options;
// inventory.go, the service, is floodgate's no more than yours would be.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/promfloodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

const (
	apiKeyHeader    = "x-api-key"                  // the metadata key of a caller's API key
	rejectionDomain = "inventory.v1.floodgate.dev" // the ErrorInfo domain of the rejections
	defaultAddr     = "127.0.0.1:50051"
	defaultCost     = 2 * time.Millisecond // the CPU time each Allocate spends
	defaultSKUs     = 1000
)

// serverConfig configures the server; a zero field takes its default.
type serverConfig struct {
	Addr       string        // listen address; default defaultAddr, port 0 picks one
	ConfigPath string        // the tenant config (YAML, or JSON by extension); required
	Watch      bool          // reload the tenant config when the file changes
	Redis      string        // Redis address for buckets several servers share; empty: in memory
	Cost       time.Duration // CPU time one Allocate spends; 0 spends none
	SKUs       int           // the catalogue's size; default 1000
	Units      int64         // each SKU's initial stock; default 1e12, never running out
	Policy     string        // overload (default), adaptive or fixed: see options.go
	Sampler    string        // the CPU sampler: auto (default), cgroup, process or host
	SchedP99   time.Duration // with a gate policy, also shed at this scheduling p99; 0 is off
	Logger     *slog.Logger  // transitions, config reloads, Redis breaker, rejections; nil: none
	Metrics    string        // serve /metrics and the offenders here (metrics.go); empty: none
	OTel       bool          // with Metrics, record through OpenTelemetry (otelfloodgate)

	// For tests and the capacity probe: a scripted CPU, the gate's interval
	// (default cpugate.DefaultInterval), a shared calibration, options of
	// the controller, and bare, which holds tenants to their quotas alone.
	sampler      cpugate.Sampler
	gateInterval time.Duration
	burner       *burner
	ctrlOpts     []overload.Option
	bare         bool
}

// server is the inventory service behind floodgate's admission control,
// with health checks and reflection.
type server struct {
	cfg     serverConfig
	reg     *tenant.Registry
	store   floodgate.Store
	gate    *cpugate.Gate        // runs in every policy: its readings go into the tables
	ctrl    *overload.Controller // nil unless the policy is overload
	limiter *middleware.Limiter
	grpc    *grpc.Server
	health  *health.Server
	inv     *inventory
	lis     net.Listener
	source  string  // the CPU sampler's label
	budget  float64 // the CPUs it measures use against
	skus    []string

	redis        *redis.Client               // nil with buckets in memory
	redisMetrics *promfloodgate.RedisMetrics // nil without Redis or Metrics
	obs          *observability              // nil without Metrics
	counts       tally                       // the Limiter's decisions, for the status lines
}

// newServer builds the server and listens on cfg.Addr; it serves from run.
func newServer(cfg serverConfig) (*server, error) {
	cfg.Addr = cmp.Or(cfg.Addr, defaultAddr)
	cfg.SKUs, cfg.Units = cmp.Or(cfg.SKUs, defaultSKUs), cmp.Or(cfg.Units, 1_000_000_000_000)
	cfg.Policy = cmp.Or(cfg.Policy, policyOverload)
	if cfg.ConfigPath == "" || cfg.SKUs < 1 || cfg.Units < 1 {
		return nil, errors.New("a server needs a tenant config, and a catalogue of at least one SKU and one unit")
	}
	s := &server{cfg: cfg, skus: skuNames(cfg.SKUs)}
	var err error
	// The tenants: who a caller is (by API key), and each method's quota.
	if s.reg, err = tenant.New(tenant.WithLogger(cfg.Logger)); err != nil {
		return nil, err
	}
	if err := s.reg.Load(cfg.ConfigPath); err != nil {
		return nil, err
	}
	// The gate reads the CPU; with the controller, that is all it does.
	if s.gate, s.source, s.budget, err = newGate(cfg); err != nil {
		return nil, err
	}
	// The buckets: in memory, or on Redis, shared by several servers.
	if cfg.Redis == "" {
		s.store, err = keyed.New()
	} else {
		s.store, s.redis, s.redisMetrics, err = newRedisStore(cfg)
	}
	if err != nil {
		return nil, err
	}
	var protect middleware.Option
	switch {
	case cfg.bare:
	case cfg.Policy == policyOverload:
		// The controller finds the server's capacity from its calls' service
		// times and sheds the tenants over their fair share first.
		opts := append([]overload.Option{overload.WithGuard(s.gate), overload.WithLogger(cfg.Logger)}, cfg.ctrlOpts...)
		if s.ctrl, err = overload.New(opts...); err != nil {
			return nil, s.fail(err)
		}
		protect = middleware.WithOverload(s.ctrl)
	default:
		protect = middleware.WithGate(s.gate) // scales every quota while the CPU is saturated
	}
	// The Limiter reports each decision to its observer: the status
	// lines' counts, and with Metrics the series and the offenders.
	observe := s.counts.observe
	if cfg.Metrics != "" {
		if s.obs, err = newObservability(s, cfg.Metrics); err != nil {
			return nil, s.fail(fmt.Errorf("metrics: %w", err))
		}
		metrics := s.obs.observer()
		observe = func(e middleware.Event) {
			s.counts.observe(e)
			metrics(e)
		}
	}
	opts := []middleware.Option{protect, middleware.WithAPIKeyHeaders(apiKeyHeader), middleware.WithDomain(rejectionDomain),
		middleware.WithObserver(observe)}
	// The Limiter: identity, the tenant's quota in the store, then the
	// controller. Health checks and reflection are exempt by default, so an
	// overloaded server still answers its load balancer and its operators.
	if s.limiter, err = middleware.New(s.store, s.reg, opts...); err != nil {
		return nil, s.fail(err)
	}
	s.inv = newInventory(s.skus, cfg.Units, cfg.Cost, cfg.burner)
	// The tap handle first, then the interceptors, first in their chains:
	// a rejection leaves before anything sets header metadata, so grpc-go
	// clients honour its retry pushback. lim.ServerOptions() is the same.
	s.grpc = grpc.NewServer(
		grpc.InTapHandle(s.limiter.TapHandle),
		grpc.ChainUnaryInterceptor(s.limiter.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(s.limiter.StreamServerInterceptor()),
	)
	s.health = register(s.grpc, s.inv)
	if s.lis, err = net.Listen("tcp", cfg.Addr); err != nil {
		return nil, s.fail(err)
	}
	return s, nil
}

// fail releases what newServer opened before err, and returns err.
func (s *server) fail(err error) error {
	if s.obs != nil {
		s.obs.lis.Close()
	}
	if s.redis != nil {
		s.redis.Close()
	}
	return err
}

// addr returns the address the server listens on.
func (s *server) addr() string { return s.lis.Addr().String() }

// run serves until ctx is done, then stops: health checks turn NOT_SERVING,
// watch streams end, calls in flight get up to grace to finish, and the
// gate's and the config watcher's loops end. It returns the error that
// stopped serving early, or nil after a stop through ctx.
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
		wg.Go(func() { served <- s.obs.serve() }) // nil once shut down
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		err = fmt.Errorf("serve: %w", err)
	}
	s.health.Shutdown()
	s.inv.stop()
	timer := time.AfterFunc(grace, s.grpc.Stop) // cuts off what GracefulStop waits for
	s.grpc.GracefulStop()
	timer.Stop()
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
