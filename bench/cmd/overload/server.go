package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	aegisrl "github.com/go-kratos/aegis/ratelimit"
	"github.com/go-kratos/aegis/ratelimit/bbr"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"github.com/zeromicro/go-zero/core/load"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/stat"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/internal/burn"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// serverReady is the line the server prints on stdout once it serves: the
// parent reads it to learn the addresses and what the gate detected.
type serverReady struct {
	GRPC       string  `json:"grpc"`
	Stats      string  `json:"stats"`
	Source     string  `json:"source"`      // the CPU sampler's source label
	Budget     float64 `json:"budget"`      // CPUs the sampler measures against: the detected limit
	GOMAXPROCS int     `json:"gomaxprocs"`  // the server's
	Affinity   int     `json:"affinity"`    // CPUs the server may run on
	PerIterNs  int64   `json:"per_iter_ns"` // the burn loop's calibration
}

// serverStats is what the stats endpoint returns.
type serverStats struct {
	CPUNs   int64   `json:"cpu_ns"`  // the process's user+system CPU time
	Scale   float64 `json:"scale"`   // the gate's scale (1 when the variant has no gate)
	State   string  `json:"state"`   // the gate's state, "" without a gate
	Reading float64 `json:"reading"` // the latest CPU reading of the sampler
	Handled uint64  `json:"handled"` // Allocate calls whose handler ran
	Served  uint64  `json:"served"`  // Allocate calls the handler completed
	CostNs  int64   `json:"cost_ns"` // the handler's CPU cost in force
	// Limit, Inflight and Queued are a concurrency limiter's: its limit,
	// the calls holding a slot, and the calls waiting for one (E's
	// controller; P3 reports its in-flight count).
	Limit    float64 `json:"limit,omitempty"`
	Inflight int     `json:"inflight,omitempty"`
	Queued   int     `json:"queued,omitempty"`
	// Inside is E's calls counted from the tap handle to their end, and
	// Places how many it holds at most.
	Inside int `json:"inside,omitempty"`
	Places int `json:"places,omitempty"`
	// Rate and DelayMs are E's admission rate (0 while admissions are not
	// rate-limited) and the queueing delay before its controller.
	Rate    float64 `json:"rate,omitempty"`
	DelayMs float64 `json:"delay_ms,omitempty"`
	// TargetMs, RTTMs and BaseMs are E's queueing delay target, the
	// latency of its last interval's calls and its baseline latency.
	TargetMs float64 `json:"target_ms,omitempty"`
	RTTMs    float64 `json:"rtt_ms,omitempty"`
	BaseMs   float64 `json:"base_ms,omitempty"`
	// CapacityPS is E's estimate of the server's capacity, calls/s.
	CapacityPS float64 `json:"capacity,omitempty"`
	// Shed is E's count of shed calls by cause (overload.ShedCause),
	// since the server started.
	Shed []uint64 `json:"shed,omitempty"`
	// Admitted is E's count of admitted calls since the server started.
	Admitted uint64 `json:"admitted,omitempty"`
}

// inventory is the example inventory service reduced to what the experiment
// calls: Allocate burns the configured CPU cost (stopping once the caller's
// deadline has passed, as examples/multitenant's does), then, when the
// service has a pool, holds one of its connections for hold while asleep,
// and answers.
type inventory struct {
	inventoryv1.UnimplementedInventoryServer
	burner          *burn.Burner
	cost            atomic.Int64
	handled, served atomic.Uint64
	version         atomic.Uint64
	// pool, when not nil, is a database's connection pool: a call waits
	// for one of its slots and holds it for hold, using no CPU, so that
	// the server's capacity is cap(pool)/hold whatever its CPU.
	pool chan struct{}
	hold time.Duration
}

func (inv *inventory) Allocate(ctx context.Context, req *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	inv.handled.Add(1)
	if req.GetQuantity() < 1 {
		return nil, status.Error(codes.InvalidArgument, "quantity must be at least 1")
	}
	if err := inv.burner.Burn(ctx, time.Duration(inv.cost.Load())); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if err := inv.block(ctx); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	inv.served.Add(1)
	v := inv.version.Add(1)
	return &inventoryv1.AllocateResponse{
		AllocationId: fmt.Sprintf("%s-%d", req.GetSku(), v),
		Level:        &inventoryv1.StockLevel{Sku: req.GetSku(), Allocated: int64(v), Version: v},
	}, nil
}

// block waits for a slot of the pool and holds it for hold, as a call to
// a database through its connection pool would; like that call, it gives
// up once the caller's deadline has passed. Without a pool it returns at
// once.
func (inv *inventory) block(ctx context.Context) error {
	if inv.pool == nil {
		return nil
	}
	select {
	case inv.pool <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-inv.pool }()
	t := time.NewTimer(inv.hold)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// apiKeyHeader carries each tenant's API key, as in examples/multitenant.
const apiKeyHeader = "x-api-key"

// healthService is exempt from every variant's admission control: limiting
// it would make an overloaded server look dead to its load balancer.
const healthService = "grpc.health.v1.Health"

func serverMain(args []string) error {
	fs := flag.NewFlagSet("overload server", flag.ContinueOnError)
	variant := fs.String("variant", "A", "admission control: "+strings.Join(allVariants, ", "))
	cost := fs.Duration("cost", 2*time.Millisecond, "CPU time of one Allocate")
	capacity := fs.Float64("capacity", 0, "measured capacity in calls/s, for the quotas (B, C, D) and P1's limit")
	perIter := fs.Duration("per-iter", 0, "the burn loop's cost per iteration, from the load generator's calibration (0: calibrate here)")
	samplerName := fs.String("sampler", "auto", "CPU sampler: auto (cgroup when in one), cgroup or process")
	poolSize := fs.Int("block-pool", 0, "connections of the blocking handler's pool (0: no pool, the handler only burns -cost)")
	hold := fs.Duration("block", 10*time.Millisecond, "how long a call holds a connection of the pool, asleep")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logx.Disable() // go-zero's stat logger prints every minute otherwise
	load.DisableLog()

	var sampler cpugate.Sampler
	var source string
	var budget float64
	switch *samplerName {
	case "cgroup", "auto":
		c, err := cpugate.NewCgroupSampler()
		if err == nil {
			sampler, source, budget = c, c.Source(), c.Budget()
			break
		}
		if *samplerName == "cgroup" {
			return err
		}
		fallthrough
	case "process":
		p, err := cpugate.NewProcessSampler()
		if err != nil {
			return err
		}
		sampler, source, budget = p, cpugate.SourceProcess, float64(p.CPUs())
	default:
		return fmt.Errorf("unknown sampler %q", *samplerName)
	}
	// Every variant runs a gate, so that the CPU reading is on record; only
	// C and D put it in front of calls, and E gives it to its controller
	// as a guard, with the gate's defaults, as a user would.
	gopts := []cpugate.Option{cpugate.WithPolicy(cpugate.Fixed{})}
	switch *variant {
	case "D":
		gopts = []cpugate.Option{cpugate.WithPolicy(cpugate.Adaptive{})}
	case "E":
		gopts = nil // the gate's defaults: its scale goes nowhere
	}
	gate, err := cpugate.New(sampler, gopts...)
	if err != nil {
		return err
	}
	// One calibration for every server of a run, so that all variants burn
	// the same work per call.
	burner := burn.WithPerIteration(*perIter)
	if *perIter <= 0 {
		burner = burn.Calibrate()
	}
	inv := &inventory{burner: burner, hold: *hold}
	inv.cost.Store(int64(*cost))
	if *poolSize > 0 {
		inv.pool = make(chan struct{}, *poolSize)
	}

	vs, err := variantServer(*variant, *capacity, gate)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(vs.opts...)
	inventoryv1.RegisterInventoryServer(srv, inv)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	statsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		snap := gate.Snapshot()
		st := serverStats{
			CPUNs:   processCPU(),
			Scale:   1,
			Reading: snap.CPU,
			Handled: inv.handled.Load(),
			Served:  inv.served.Load(),
			CostNs:  inv.cost.Load(),
		}
		if vs.stats != nil {
			vs.stats(&st, snap)
		}
		_ = json.NewEncoder(w).Encode(st)
	})
	hsrv := &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}

	if dir := os.Getenv("FLOODGATE_SERVER_CPUPROFILE"); dir != "" {
		// A CPU profile of this server, written when it stops: where a
		// variant's CPU per call goes.
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("cpu-%s-%d.prof", *variant, os.Getpid())))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = gate.Run(ctx) }()
	go func() { _ = hsrv.Serve(statsLis) }()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)

	ready := serverReady{
		GRPC: lis.Addr().String(), Stats: statsLis.Addr().String(),
		Source: source, Budget: budget, GOMAXPROCS: runtime.GOMAXPROCS(0),
		Affinity: affinityCPUs(), PerIterNs: int64(inv.burner.PerIteration()),
	}
	line, _ := json.Marshal(ready)
	fmt.Printf("READY %s\n", line)

	for {
		select {
		case err := <-served:
			return err
		case s := <-sigs:
			switch s {
			case syscall.SIGUSR1: // the capacity-change scenario: requests cost twice as much
				inv.cost.Store(2 * int64(*cost))
			case syscall.SIGUSR2:
				inv.cost.Store(int64(*cost))
			default:
				hs.Shutdown()
				cancel()
				srv.Stop()
				_ = hsrv.Close()
				return nil
			}
		}
	}
}

// A variant is a variant's server options and what it adds to the stats.
type variant struct {
	opts []grpc.ServerOption
	// stats, when set, fills in the variant's own fields of the stats,
	// given the gate's snapshot.
	stats func(*serverStats, cpugate.Snapshot)
}

// variantServer returns a variant's server options and stats.
func variantServer(name string, capacity float64, gate *cpugate.Gate) (variant, error) {
	notHealth := selector.MatchFunc(func(_ context.Context, cm interceptors.CallMeta) bool {
		return cm.Service != healthService
	})
	gated := func(st *serverStats, snap cpugate.Snapshot) {
		st.Scale, st.State = snap.Scale, snap.State.String()
	}
	switch name {
	case "A":
		return variant{}, nil
	case "B", "C", "D", "E":
		table, err := tenantTable(capacity)
		if err != nil {
			return variant{}, err
		}
		store, err := keyed.New()
		if err != nil {
			return variant{}, err
		}
		opts := []middleware.Option{middleware.WithAPIKeyHeaders(apiKeyHeader)}
		v := variant{}
		switch name {
		case "C", "D":
			// As examples/multitenant does: the gate scales every quota, and
			// while it sheds the tap handle turns callers still inside their
			// retry delay away (the default).
			opts = append(opts, middleware.WithGate(gate))
			v.stats = gated
		case "E":
			// The overload controller after the quotas, with the gate as
			// its guard: its CPU readings go into the controller's
			// snapshots, and its scale is not used.
			ctrlOpts := []overload.Option{overload.WithGuard(gate)}
			if os.Getenv("FLOODGATE_OVERLOAD_LOG") != "" {
				// Every change of the controller, on the server's stderr.
				ctrlOpts = append(ctrlOpts, overload.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))))
			}
			ctrl, err := overload.New(ctrlOpts...)
			if err != nil {
				return variant{}, err
			}
			opts = append(opts, middleware.WithOverload(ctrl))
			v.stats = func(st *serverStats, _ cpugate.Snapshot) { controllerStats(st, ctrl) }
		}
		l, err := middleware.New(store, middleware.Static(table), opts...)
		if err != nil {
			return variant{}, err
		}
		v.opts = []grpc.ServerOption{
			grpc.InTapHandle(l.TapHandle),
			grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor()),
		}
		return v, nil
	case "P1":
		if capacity <= 0 {
			return variant{}, errors.New("P1 needs -capacity")
		}
		// One global limiter at the measured capacity, with 100 ms of burst.
		lim := rate.NewLimiter(rate.Limit(capacity), max(int(capacity/10), 1))
		return variant{opts: []grpc.ServerOption{grpc.ChainUnaryInterceptor(
			selector.UnaryServerInterceptor(ratelimit.UnaryServerInterceptor(xrateLimiter{lim}), notHealth),
		)}}, nil
	case "P2":
		shedder := load.NewAdaptiveShedder() // go-zero's defaults: CPU threshold 90%, 5 s window
		return variant{
			opts: []grpc.ServerOption{grpc.ChainUnaryInterceptor(
				selector.UnaryServerInterceptor(sheddingInterceptor(shedder), notHealth),
			)},
			stats: func(st *serverStats, _ cpugate.Snapshot) {
				// What go-zero's shedder compares with its threshold (‰).
				st.Reading = float64(stat.CpuUsage()) / 1000
			},
		}, nil
	case "P3":
		// aegis' defaults, as kratos' ratelimit.Server builds it: a 10 s
		// window of 100 buckets, CPU threshold 800‰.
		lim := bbr.NewLimiter()
		return variant{
			opts: []grpc.ServerOption{grpc.ChainUnaryInterceptor(
				selector.UnaryServerInterceptor(kratosRateLimit(lim), notHealth),
			)},
			stats: func(st *serverStats, _ cpugate.Snapshot) {
				// What BBR compares with its threshold (‰), and its
				// in-flight count.
				bs := lim.Stat()
				st.Reading = float64(bs.CPU) / 1000
				st.Inflight = int(bs.InFlight)
			},
		}, nil
	}
	if build, ok := outOfTree[name]; ok {
		return build(capacity)
	}
	return variant{}, fmt.Errorf("unknown variant %q", name)
}

// controllerStats fills in E's fields of the stats from a snapshot of its
// controller. Admitted and ShedBy are the snapshot's lasting API; the other
// fields are its law's, which changes with the controller: this is the
// only place the bench reads them.
func controllerStats(st *serverStats, ctrl *overload.Controller) {
	snap := ctrl.Snapshot()
	st.Shed, st.Admitted = nil, snap.Admitted
	for _, cause := range overload.ShedCauses() {
		st.Shed = append(st.Shed, snap.ShedBy(cause))
	}
	st.State = snap.State.String()
	st.Limit, st.Inflight, st.Queued = snap.Limit, snap.Inflight, snap.Queued
	st.Inside, st.Places = snap.Inside, int(snap.Limit)+snap.QueueCap
	st.DelayMs = millis(snap.Wait)
	st.TargetMs, st.RTTMs, st.BaseMs = millis(snap.Target), millis(snap.Latency), millis(snap.Baseline)
	st.CapacityPS = snap.Throughput
}

// xrateLimiter adapts a rate.Limiter to ratelimit.Limiter.
type xrateLimiter struct{ l *rate.Limiter }

func (x xrateLimiter) Limit(context.Context) error {
	if x.l.Allow() {
		return nil
	}
	return errors.New("rate limit exceeded")
}

// sheddingInterceptor is go-zero's zrpc UnarySheddingInterceptor (which
// lives in an internal package) without its metrics: RESOURCE_EXHAUSTED
// when the shedder drops, and the promise failed on a deadline.
func sheddingInterceptor(shedder load.Shedder) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		promise, err := shedder.Allow()
		if err != nil {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		defer func() {
			if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
				promise.Fail()
			} else {
				promise.Pass()
			}
		}()
		return handler(ctx, req)
	}
}

// kratosRateLimit is kratos' ratelimit.Server middleware (kratos v2, over
// aegis) as a unary interceptor: Allow, the handler, then done with the
// handler's error. kratos rejects with its ErrLimitExceed, an HTTP 429 with
// reason RATELIMIT, which kratos' errors turn into RESOURCE_EXHAUSTED with
// an ErrorInfo detail when the gRPC transport sends it.
func kratosRateLimit(l aegisrl.Limiter) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		done, e := l.Allow()
		if e != nil {
			return nil, kratosLimitExceeded()
		}
		resp, err = handler(ctx, req)
		done(aegisrl.DoneInfo{Err: err})
		return resp, err
	}
}

// kratosLimitExceeded is the status kratos' ErrLimitExceed becomes on the
// wire, built per rejection as kratos builds it.
func kratosLimitExceeded() error {
	st, err := status.New(codes.ResourceExhausted, "service unavailable due to rate limit exceeded").
		WithDetails(&errdetails.ErrorInfo{Reason: "RATELIMIT"})
	if err != nil {
		return status.Error(codes.ResourceExhausted, "service unavailable due to rate limit exceeded")
	}
	return st.Err()
}

// processCPU returns the process's user and system CPU time.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// affinityCPUs counts the CPUs this process may run on.
func affinityCPUs() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return runtime.NumCPU()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return countCPUList(strings.TrimSpace(v))
		}
	}
	return runtime.NumCPU()
}

// countCPUList counts the CPUs of a list such as "0-3,6".
func countCPUList(s string) int {
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, ok := strings.Cut(part, "-")
		var a, b int
		if _, err := fmt.Sscan(lo, &a); err != nil {
			continue
		}
		b = a
		if ok {
			if _, err := fmt.Sscan(hi, &b); err != nil {
				continue
			}
		}
		n += b - a + 1
	}
	return n
}

// millis returns d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
