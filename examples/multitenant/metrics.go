package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/promfloodgate"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

const (
	metricsPath   = "/metrics"
	offendersPath = "/debug/floodgate/offenders"
)

// observability is the server's metrics endpoint: floodgate's collector,
// the callers rejected most often, and the HTTP server that serves them.
type observability struct {
	metrics   *promfloodgate.Collector
	offenders *promfloodgate.Offenders
	lis       net.Listener
	http      *http.Server
}

// newObservability builds the collector over the server's gate, overload
// controller (if any) and store and listens on addr. The Limiter is attached later (setLimiter), since it
// is built with the collector's observer.
func newObservability(s *server, addr string) (*observability, error) {
	opts := []promfloodgate.Option{
		promfloodgate.WithMethods(promfloodgate.ServiceMethods(&inventoryv1.Inventory_ServiceDesc)...),
		promfloodgate.WithGate(s.gate),
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
	// Offenders are named by the subject their calls were charged to (the
	// Limiter passes it, WithRejectedSubjects): a tenant by its ID, an
	// anonymous caller by its address, hashed, however many API keys it
	// makes up; the tap handle's rejections count too.
	offenders, err := promfloodgate.NewOffenders()
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(metrics); err != nil {
		return nil, err
	}
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
	mux.Handle(offendersPath, offenders.Handler())
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &observability{
		metrics:   metrics,
		offenders: offenders,
		lis:       lis,
		http:      &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
	}, nil
}

// addr returns the address /metrics is served on.
func (o *observability) addr() string { return o.lis.Addr().String() }

// serve serves until shutdown; it returns nil after a shutdown.
func (o *observability) serve() error {
	if err := o.http.Serve(o.lis); !errors.Is(err, http.ErrServerClosed) {
		return err
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
}
