package main

// What the server tells its operators: with -metrics, floodgate's series
// (promfloodgate's collector, or otelfloodgate's recorder with -otel), the
// Go runtime's and the most rejected callers, on an HTTP listener of their
// own; and the status lines serve logs.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/floodgate-go/floodgate/examples/multitenant/internal/loadgen"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/otelfloodgate"
	"github.com/floodgate-go/floodgate/promfloodgate"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

const (
	metricsPath   = "/metrics"
	offendersPath = "/debug/floodgate/offenders"
)

// observability is the server's metrics endpoint: floodgate's collector
// (or, with serverConfig.OTel, its OpenTelemetry recorder behind OTel's
// Prometheus exporter), the callers rejected most often, and the HTTP
// server that serves them.
type observability struct {
	metrics   *promfloodgate.Collector // nil with OTel
	otel      *otelfloodgate.Recorder  // nil without
	mp        *sdkmetric.MeterProvider // otel's
	offenders *promfloodgate.Offenders
	lis       net.Listener
	http      *http.Server
}

// observer returns the function the Limiter reports its decisions to:
// the collector's, which feeds the offenders (WithOffenders), or the
// recorder's, beside which the offenders are fed here, as the collector
// would.
func (o *observability) observer() func(middleware.Event) {
	if o.otel == nil {
		return o.metrics.Observer()
	}
	rec := o.otel.Observer()
	return func(e middleware.Event) {
		rec(e)
		if !e.Allowed && !e.DryRun {
			o.offenders.RecordSubject(e.Subject)
		}
	}
}

// newOTel returns a Recorder over the server's gate, controller, store and
// registry, on a meter provider that OTel's Prometheus exporter reads into
// reg: the same series names as the collector's but for two (see the
// otelfloodgate package doc), with the exporter's otel_scope_* labels.
func newOTel(s *server, reg *prometheus.Registry) (*otelfloodgate.Recorder, *sdkmetric.MeterProvider, error) {
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	opts := []otelfloodgate.Option{
		otelfloodgate.WithMethods(otelfloodgate.ServiceMethods(&inventoryv1.Inventory_ServiceDesc)...),
		otelfloodgate.WithGate(s.gate), otelfloodgate.WithRegistry(s.reg),
	}
	if s.ctrl != nil {
		opts = append(opts, otelfloodgate.WithOverload(s.ctrl))
	}
	if st, ok := s.store.(*keyed.Map); ok {
		opts = append(opts, otelfloodgate.WithKeyed(st))
	}
	rec, err := otelfloodgate.New(mp, opts...)
	if err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, nil, err
	}
	return rec, mp, nil
}

// newObservability builds the collector over the server's gate, overload
// controller (if any) and store, and the offenders it feeds, and listens
// on addr. The Limiter is built with the collector's observer, the source
// of every series of its own.
func newObservability(s *server, addr string) (*observability, error) {
	reg := prometheus.NewRegistry()
	// Offenders are named by the subject their calls were charged to, as
	// the Limiter's events give it: a tenant by its ID, an anonymous caller
	// by its address, hashed, however many API keys it makes up; the tap
	// handle's rejections count too.
	offenders, err := promfloodgate.NewOffenders()
	if err != nil {
		return nil, err
	}
	if s.cfg.OTel {
		rec, mp, err := newOTel(s, reg)
		if err != nil {
			return nil, err
		}
		return serveObservability(&observability{otel: rec, mp: mp, offenders: offenders}, reg, s, addr)
	}
	opts := []promfloodgate.Option{
		promfloodgate.WithMethods(promfloodgate.ServiceMethods(&inventoryv1.Inventory_ServiceDesc)...),
		promfloodgate.WithGate(s.gate), promfloodgate.WithOffenders(offenders),
	}
	if s.ctrl != nil {
		opts = append(opts, promfloodgate.WithOverload(s.ctrl))
	}
	if st, ok := s.store.(*keyed.Map); ok {
		opts = append(opts, promfloodgate.WithKeyed(st))
	}
	if s.cfg.Logger != nil {
		opts = append(opts, promfloodgate.WithLogger(s.cfg.Logger, time.Second))
	}
	opts = append(opts, promfloodgate.WithRegistry(s.reg))
	metrics, err := promfloodgate.New(opts...)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(metrics); err != nil {
		return nil, err
	}
	return serveObservability(&observability{metrics: metrics, offenders: offenders}, reg, s, addr)
}

// serveObservability completes o: the runtime's series and the Redis
// store's in reg, and the HTTP server of them and of the offenders on
// addr.
func serveObservability(o *observability, reg *prometheus.Registry, s *server, addr string) (*observability, error) {
	// The Go runtime's and the process's own series, which a dashboard
	// graphs next to floodgate's: goroutines, GC pauses, CPU, memory.
	// The scheduling latency histogram too: how long goroutines wait to
	// run, the delay the overload controller's signal is part of.
	goc := collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.MetricsScheduler, collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/latencies:seconds$`)}))
	if err := reg.Register(goc); err != nil {
		return nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	if s.redisMetrics != nil {
		if err := reg.Register(s.redisMetrics); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle(metricsPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle(offendersPath, o.offenders.Handler())
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	o.lis = lis
	o.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return o, nil
}

// addr returns the address /metrics is served on.
func (o *observability) addr() string { return o.lis.Addr().String() }

// serve serves until shutdown; it returns nil after a shutdown.
func (o *observability) serve() error {
	if err := o.http.Serve(o.lis); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// shutdown stops the HTTP server, waiting up to grace for scrapes in flight.
func (o *observability) shutdown(grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if o.http.Shutdown(ctx) != nil {
		o.http.Close()
	}
	if o.otel != nil {
		_ = o.otel.Close()
		_ = o.mp.Shutdown(ctx)
	}
}

// tally counts the Limiter's decisions from its observer's events, for
// the status lines and the demo's summary (loadgen.ServerCounts).
type tally struct{ admitted, quota, overload, tap, exempt atomic.Uint64 }

func (t *tally) observe(e middleware.Event) {
	switch {
	case e.Reason == middleware.ReasonExempt:
		t.exempt.Add(1)
	case e.Tap:
		t.tap.Add(1)
	case e.Reason == middleware.ReasonAdmitted && e.Allowed: // by the quota and the controller
		t.admitted.Add(1)
	case e.Reason == middleware.ReasonQuota:
		t.quota.Add(1)
	case e.Reason == middleware.ReasonGate, e.Reason == middleware.ReasonOverload:
		t.overload.Add(1)
	}
}

// load returns the counts so far. Each is read atomically; together they
// are not a consistent snapshot.
func (t *tally) load() loadgen.ServerCounts {
	return loadgen.ServerCounts{Admitted: t.admitted.Load(), Quota: t.quota.Load(), Overload: t.overload.Load(),
		Tap: t.tap.Load(), Exempt: t.exempt.Load()}
}

// statusLoop logs the server's admission counters every interval, with the
// overload controller's state, or the gate's.
func statusLoop(ctx context.Context, srv *server, log *slog.Logger, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	prev := srv.counts.load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, g := srv.counts.load(), srv.gate.Snapshot()
		rate := func(a, b uint64) string { return fmt.Sprintf("%.1f/s", float64(a-b)/every.Seconds()) }
		attrs := []any{"admitted", rate(st.Admitted, prev.Admitted), "quota", rate(st.Quota, prev.Quota),
			"overload", rate(st.Overload, prev.Overload), "tap", rate(st.Tap, prev.Tap)}
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
