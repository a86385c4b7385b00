package loadreport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc"
	// The balancer ServiceConfig names: a client that imports this package
	// for ServiceConfig has it registered.
	_ "google.golang.org/grpc/balancer/weightedroundrobin"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/orca"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/overload"
)

// ServiceConfig is the client's service config that balances over the
// reports: grpc-go's weighted_round_robin, with weights used 2 s after a
// replica's first report (10 s by default) and recomputed every 500 ms
// (1 s by default), so that they follow a change of load within seconds.
// Pass it to grpc.WithDefaultServiceConfig; a resolver's config wins. This
// package registers the balancer (google.golang.org/grpc/balancer/
// weightedroundrobin), which grpc-go does not by default.
const ServiceConfig = `{"loadBalancingConfig":[{"weighted_round_robin":` +
	`{"blackoutPeriod":"2s","weightUpdatePeriod":"0.5s"}}]}`

// trailerKey is where grpc-go's ORCA parser (orca/internal) reads a
// per-call report: the binary-encoded OrcaLoadReport.
const trailerKey = "endpoint-load-metrics-bin"

const (
	// defaultInterval is how often the report is rebuilt: a few times per
	// second of the balancer's default weight update period (1 s).
	defaultInterval = 250 * time.Millisecond
	// smoothing is the time constant of the rates' moving average: half a
	// second, so that one interval's burst moves a weight by two fifths of
	// it at most, and a past overload's sheds fade within a couple of
	// seconds (a longer one kept a replica that had shed starved of calls
	// long after).
	smoothing = 500 * time.Millisecond
	// capacitySmoothing is the time constant of the capacity estimate's
	// moving average: long enough to average the limit's probing (it
	// grows by a quarter a step while it binds and is cut when calls
	// queue), short enough that a replica whose capacity halves reports it
	// within a few seconds.
	capacitySmoothing = time.Second
)

// An Option configures a [Reporter]. [New] applies the options in order to
// a copy of the defaults, skipping nil ones, then validates the result (the
// convention of [floodgate.ErrInvalidOption]).
type Option func(*options)

type options struct {
	interval time.Duration
	sampler  cpugate.Sampler
	noCPU    bool
	clock    floodgate.Clock
}

// WithInterval sets how often the report is rebuilt, by the first call to
// end after it is due. Default 250 ms; it must be positive. A repeated call
// replaces it.
func WithInterval(d time.Duration) Option { return func(o *options) { o.interval = d } }

// WithSampler sets what measures the CPU utilization in the report; nil
// reports none. Default: a cpugate.ProcessSampler (this process's CPU
// against the CPUs it can use). Any cpugate sampler works, the container's
// (cpugate.NewCgroupSampler) among them. A repeated call replaces it.
func WithSampler(s cpugate.Sampler) Option {
	return func(o *options) { o.sampler, o.noCPU = s, s == nil }
}

// WithClock sets the clock that times the rates; nil is the real clock.
// Default: the real clock. A repeated call replaces it.
func WithClock(c floodgate.Clock) Option { return func(o *options) { o.clock = c } }

// A Reporter builds ORCA load reports from an overload controller. It is
// safe for concurrent use. Make one with New.
type Reporter struct {
	ctrl     *overload.Controller
	interval time.Duration
	clock    floodgate.Clock

	due  atomic.Int64           // unix nanoseconds of the next rebuild
	cur  atomic.Pointer[report] // the latest report
	mu   sync.Mutex             // held by the rebuild
	last struct {               // under mu
		at             time.Time
		admitted, shed uint64
		qps, eps       float64
		capacity       float64 // calls/s: Limit over Latency, smoothed
		sampler        cpugate.Sampler
		cpu            float64
	}
}

// report is one rebuild's output: the metrics and their trailer, encoded
// once.
type report struct {
	metrics orca.ServerMetrics
	trailer metadata.MD
}

// New returns a Reporter of ctrl's load. It returns an error wrapping
// floodgate.ErrInvalidOption for a nil controller or a bad option, and
// the sampler's error when the default one cannot be made.
func New(ctrl *overload.Controller, opts ...Option) (*Reporter, error) {
	o := options{interval: defaultInterval}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if ctrl == nil {
		return nil, fmt.Errorf("%w: loadreport: a nil controller (middleware.NewOverload or WithOverload makes one)", floodgate.ErrInvalidOption)
	}
	if o.interval <= 0 {
		return nil, fmt.Errorf("%w: loadreport: WithInterval(%v), want > 0", floodgate.ErrInvalidOption, o.interval)
	}
	if o.clock == nil {
		o.clock = floodgate.ClockFunc(time.Now)
	}
	if o.sampler == nil && !o.noCPU {
		s, err := cpugate.NewProcessSampler()
		if err != nil && !errors.Is(err, cpugate.ErrUnsupported) {
			return nil, fmt.Errorf("loadreport: %w", err)
		}
		if err == nil {
			o.sampler = s
		}
	}
	r := &Reporter{ctrl: ctrl, interval: o.interval, clock: o.clock}
	now := r.clock.Now()
	s := ctrl.Snapshot()
	r.last.at, r.last.admitted, r.last.shed = now, s.Admitted, s.ShedTotal()
	r.last.sampler = o.sampler
	r.cur.Store(r.build(s, now))
	r.due.Store(now.Add(r.interval).UnixNano())
	return r, nil
}

// ServerMetrics returns the latest report, rebuilt first if it is due. It
// makes the Reporter an orca.ServerMetricsProvider; the result is shared
// and must not be modified.
func (r *Reporter) ServerMetrics() *orca.ServerMetrics { return &r.current().metrics }

// current returns the latest report, rebuilding it when due. Calls that
// find it due while another rebuilds use the previous one.
func (r *Reporter) current() *report {
	if now := r.clock.Now(); now.UnixNano() >= r.due.Load() && r.mu.TryLock() {
		if now.UnixNano() >= r.due.Load() {
			r.cur.Store(r.build(r.ctrl.Snapshot(), now))
			r.due.Store(now.Add(r.interval).UnixNano())
		}
		r.mu.Unlock()
	}
	return r.cur.Load()
}

// build makes the report of snapshot s taken at now; r.mu is held (or r
// is not yet shared).
func (r *Reporter) build(s overload.Snapshot, now time.Time) *report {
	l := &r.last
	if dt := now.Sub(l.at); dt > 0 {
		shed := s.ShedTotal()
		l.qps = smooth(l.qps, float64(s.Admitted-l.admitted)/dt.Seconds(), dt, smoothing)
		l.eps = smooth(l.eps, float64(shed-l.shed)/dt.Seconds(), dt, smoothing)
		l.at, l.admitted, l.shed = now, s.Admitted, shed
		if s.Latency > 0 {
			c := s.Limit / s.Latency.Seconds()
			if l.capacity > 0 {
				c = smooth(l.capacity, c, dt, capacitySmoothing)
			}
			l.capacity = c
		}
	}
	if l.sampler != nil {
		if rd, err := l.sampler.Sample(); err == nil {
			l.cpu = rd.CPU
		}
	}
	util := 0.0
	if l.capacity > 0 {
		util = l.qps / l.capacity
	}
	m := orca.ServerMetrics{
		CPUUtilization: -1,
		MemUtilization: -1,
		AppUtilization: util,
		QPS:            l.qps,
		EPS:            l.eps,
		Utilization:    map[string]float64{},
		RequestCost:    map[string]float64{},
		NamedMetrics: map[string]float64{
			"floodgate.capacity":         l.capacity,
			"floodgate.limit":            s.Limit,
			"floodgate.inflight":         float64(s.Inflight),
			"floodgate.queued":           float64(s.Queued),
			"floodgate.latency_seconds":  s.Latency.Seconds(),
			"floodgate.baseline_seconds": s.Baseline.Seconds(),
		},
	}
	pb := &v3orcapb.OrcaLoadReport{
		ApplicationUtilization: m.AppUtilization,
		RpsFractional:          m.QPS,
		Eps:                    m.EPS,
		NamedMetrics:           m.NamedMetrics,
	}
	if l.sampler != nil {
		m.CPUUtilization = l.cpu
		pb.CpuUtilization = l.cpu
	}
	rep := &report{metrics: m}
	// Deterministic: the same state encodes to the same bytes. Marshal
	// fails only on invalid UTF-8 in a map key, which these keys are not.
	if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(pb); err == nil {
		rep.trailer = metadata.MD{trailerKey: {string(b)}}
	}
	return rep
}

// smooth moves the moving average avg of time constant tau toward x, seen
// dt after the previous value: over irregular intervals, x weighs what the
// decay over dt leaves out.
func smooth(avg, x float64, dt, tau time.Duration) float64 {
	return avg + (1-math.Exp(-float64(dt)/float64(tau)))*(x-avg)
}

// ServerOptions returns the interceptors, unary and stream, that add the
// report to the trailer of every call they see end. List them after the
// Limiter's (middleware.Limiter.ServerOptions), so that they see the
// admitted calls: those are the ones the balancer learns from.
func (r *Reporter) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(r.unary),
		grpc.ChainStreamInterceptor(r.stream),
	}
}

// Register serves the reports out of band on s, on ORCA's
// StreamCoreMetrics, for clients that enable it (enableOobLoadReport). It
// returns orca.Register's error.
func (r *Reporter) Register(s grpc.ServiceRegistrar) error {
	return orca.Register(s, orca.ServiceOptions{ServerMetricsProvider: r})
}

func (r *Reporter) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	err := h(srv, ss)
	if md := r.current().trailer; md != nil {
		ss.SetTrailer(md)
	}
	return err
}

func (r *Reporter) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if md := r.current().trailer; md != nil {
		// The error is that ctx is no server call's: nothing to report to.
		_ = grpc.SetTrailer(ctx, md)
	}
	return resp, err
}
