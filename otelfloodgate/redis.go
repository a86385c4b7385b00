package otelfloodgate

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/labels"
	"github.com/floodgate-go/floodgate/remote"
)

// DefaultCallBuckets are the upper bounds, in seconds, of the Redis call
// duration histogram when WithCallBuckets is not given: promfloodgate's,
// from 100 µs (a round trip on loopback) to 1 s.
var DefaultCallBuckets = labels.CallBuckets()

// A RedisOption configures RedisMetrics. NewRedisMetrics applies the
// options in order to a copy of the defaults, skipping nil ones, then
// validates the result (the convention of floodgate.ErrInvalidOption).
type RedisOption func(*redisOptions)

type redisOptions struct {
	buckets []float64
}

// WithCallBuckets sets the upper bounds, in seconds, of the call duration
// histogram's buckets: at least one, finite, positive and increasing. The
// default is DefaultCallBuckets. A repeated call replaces the bounds.
func WithCallBuckets(bounds ...float64) RedisOption {
	return func(o *redisOptions) { o.buckets = slices.Clone(bounds) }
}

// RedisMetrics is a redisstore.Observer recording the Redis store's health
// (round trips, errors, the breaker, fallbacks, starved calls, instances:
// the package doc lists the instruments). Observing allocates nothing. One
// RedisMetrics observes one Store; it is safe for concurrent use, and the
// zero value is not usable.
type RedisMetrics struct {
	calls                           metric.Float64Histogram
	errs, transitions, falls, starv metric.Int64Counter
	ok, failed                      []metric.RecordOption
	kinds                           [labels.NumKinds][]metric.AddOption
	to                              [len(labels.BreakerStates)][]metric.AddOption
	sources                         [len(labels.FallbackSources)][]metric.AddOption
	state                           atomic.Uint32 // remote.BreakerState
	instances                       atomic.Int64
	stateIs                         []metric.MeasurementOption
	stateG, instG                   metric.Int64ObservableGauge
	reg                             metric.Registration
	close                           sync.Once
}

// NewRedisMetrics returns a RedisMetrics whose instruments come from mp's
// meter (nil: otel.GetMeterProvider()), or an error: one wrapping
// floodgate.ErrInvalidOption that names an invalid option, or the meter's.
// The breaker starts closed, as a new Store's does.
func NewRedisMetrics(mp metric.MeterProvider, opts ...RedisOption) (*RedisMetrics, error) {
	o := redisOptions{buckets: slices.Clone(DefaultCallBuckets)}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := labels.CheckBuckets("otelfloodgate", o.buckets); err != nil {
		return nil, err
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	b := &builder{m: mp.Meter(ScopeName)}
	r := &RedisMetrics{}
	var err error
	r.calls, err = b.m.Float64Histogram("floodgate.redis.call.duration", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(o.buckets...),
		metric.WithDescription("Round trips of the Redis store to Redis (a batch is one), by outcome (ok, error)."))
	b.fail(err)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := b.m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		b.fail(err)
		return c
	}
	r.errs = counter("floodgate.redis.call.errors", "{call}", "Failed round trips of the Redis store, by kind (timeout, canceled, connection, cluster, script, other).")
	r.transitions = counter("floodgate.redis.breaker.transitions", "{transition}", "Transitions of the Redis store's circuit breaker, by the state entered.")
	r.falls = counter("floodgate.redis.fallback_decisions", "{call}", "Decisions of the Redis store not made by Redis, by source (cache, lease, fallback, fail_open, fail_closed).")
	r.starv = counter("floodgate.redis.starved_calls", "{call}", "Calls of the Redis store that missed their deadline while the process was starved of CPU; the failure policy decided them.")
	r.stateG = b.gauge("floodgate.redis.breaker.state", "", "1 for the state of the Redis store's circuit breaker (closed, open, half_open), 0 for the others.")
	r.instG = b.gauge("floodgate.redis.instances", "{instance}", "Stores sharing the Redis store's prefix and name, as last counted on Redis (0 before the first count).")
	r.ok = []metric.RecordOption{with("outcome", "ok")}
	r.failed = []metric.RecordOption{with("outcome", "error")}
	for k := range labels.NumKinds {
		r.kinds[k] = []metric.AddOption{with("kind", remote.ErrorKind(k).String())}
	}
	r.stateIs = withEach("state", labels.BreakerStates[:]...)
	for s, name := range labels.BreakerStates {
		r.to[s] = []metric.AddOption{with("to", name)}
	}
	for i, f := range labels.FallbackSources {
		r.sources[i] = []metric.AddOption{with("source", f.Label)}
	}
	if r.reg, err = b.register(r.observe); err != nil {
		return nil, err
	}
	return r, nil
}

// ObserveCall implements redisstore.Observer.
func (r *RedisMetrics) ObserveCall(d time.Duration, kind remote.ErrorKind) {
	ctx := context.Background()
	if kind == remote.KindNone {
		r.calls.Record(ctx, d.Seconds(), r.ok...)
		return
	}
	r.calls.Record(ctx, d.Seconds(), r.failed...)
	r.errs.Add(ctx, 1, r.kinds[labels.Kind(kind)]...)
}

// ObserveBreaker implements redisstore.Observer.
func (r *RedisMetrics) ObserveBreaker(from, to remote.BreakerState) {
	if int(to) >= len(labels.BreakerStates) {
		return
	}
	r.state.Store(uint32(to))
	r.transitions.Add(context.Background(), 1, r.to[to]...)
}

// ObserveFallback implements redisstore.Observer.
func (r *RedisMetrics) ObserveFallback(source floodgate.Source) {
	if i, ok := labels.Fallback(source); ok {
		r.falls.Add(context.Background(), 1, r.sources[i]...)
	}
}

// ObserveStarved implements redisstore.Observer.
func (r *RedisMetrics) ObserveStarved() { r.starv.Add(context.Background(), 1) }

// ObserveInstances implements redisstore.Observer.
func (r *RedisMetrics) ObserveInstances(n int) { r.instances.Store(int64(n)) }

func (r *RedisMetrics) observe(_ context.Context, ob metric.Observer) error {
	state := r.state.Load()
	for s := range labels.BreakerStates {
		ob.ObserveInt64(r.stateG, b2i(uint32(s) == state), r.stateIs[s])
	}
	ob.ObserveInt64(r.instG, r.instances.Load())
	return nil
}

// Close unregisters the callback of the breaker state and instance gauges.
// It is idempotent.
func (r *RedisMetrics) Close() error {
	var err error
	r.close.Do(func() { err = r.reg.Unregister() })
	return err
}
