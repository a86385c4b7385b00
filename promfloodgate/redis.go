package promfloodgate

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/labels"
	"github.com/floodgate-go/floodgate/remote"
)

// DefaultCallBuckets are the upper bounds, in seconds, of the Redis call
// latency histogram when WithCallBuckets is not given: from 100 µs (a round
// trip on loopback) to 1 s (well past any decision's deadline).
var DefaultCallBuckets = labels.CallBuckets()

// A RedisOption configures RedisMetrics. NewRedisMetrics applies the
// options in order to a copy of the defaults, skipping nil ones, then
// validates the result (the convention of floodgate.ErrInvalidOption).
type RedisOption func(*redisOptions)

type redisOptions struct {
	buckets []float64
}

// WithCallBuckets sets the upper bounds, in seconds, of the call latency
// histogram's buckets: at least one, finite, positive and increasing. The
// default is DefaultCallBuckets. A repeated call replaces the bounds.
func WithCallBuckets(bounds ...float64) RedisOption {
	return func(o *redisOptions) { o.buckets = slices.Clone(bounds) }
}

func (o *redisOptions) validate() error { return labels.CheckBuckets("promfloodgate", o.buckets) }

// A RedisMetrics observes one Store: the breaker gauge follows one breaker.
// For several stores, give each its own RedisMetrics and register each with
// a label telling them apart, through prometheus.WrapRegistererWith.
// RedisMetrics is safe for concurrent use; the zero value is not usable.
type RedisMetrics struct {
	calls                 *prometheus.HistogramVec
	ok, failed            prometheus.Observer
	errs                  [labels.NumKinds]atomic.Uint64
	state                 atomic.Uint32 // remote.BreakerState
	transitions           [len(labels.BreakerStates)]atomic.Uint64
	fallbacks             [len(labels.FallbackSources)]atomic.Uint64
	starved               atomic.Uint64
	instances             atomic.Int64
	errDesc, stateDesc    *prometheus.Desc
	transDesc, fallsDesc  *prometheus.Desc
	starvedDesc, instDesc *prometheus.Desc
}

// RedisMetrics names only the core module's types (package remote), so this module needs
// neither redisstore nor go-redis; the examples module checks that it is a
// redisstore.Observer.
var _ prometheus.Collector = (*RedisMetrics)(nil)

// NewRedisMetrics returns a RedisMetrics configured by opts, or an error
// wrapping floodgate.ErrInvalidOption that names the option. The breaker
// gauge starts closed, as a new Store's breaker does.
func NewRedisMetrics(opts ...RedisOption) (*RedisMetrics, error) {
	// A copy: the histogram keeps its bounds, and DefaultCallBuckets is a
	// variable anyone can change.
	o := redisOptions{buckets: slices.Clone(DefaultCallBuckets)}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	m := &RedisMetrics{
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "floodgate_redis_call_duration_seconds",
			Help:    "Round trips of the Redis store to Redis (a batch is one), by outcome (ok, error).",
			Buckets: o.buckets,
		}, []string{"outcome"}),
		errDesc: prometheus.NewDesc("floodgate_redis_call_errors_total",
			"Failed round trips of the Redis store, by kind (timeout, canceled, connection, cluster, script, other).", []string{"kind"}, nil),
		stateDesc: prometheus.NewDesc("floodgate_redis_breaker_state",
			"1 for the state of the Redis store's circuit breaker (closed, open, half_open), 0 for the others.", []string{"state"}, nil),
		transDesc: prometheus.NewDesc("floodgate_redis_breaker_transitions_total",
			"Transitions of the Redis store's circuit breaker, by the state entered.", []string{"to"}, nil),
		fallsDesc: prometheus.NewDesc("floodgate_redis_fallback_decisions_total",
			"Decisions of the Redis store not made by Redis, by source (cache, lease, fallback, fail_open, fail_closed).", []string{"source"}, nil),
		starvedDesc: prometheus.NewDesc("floodgate_redis_starved_calls_total",
			"Calls of the Redis store that missed their deadline while the process was starved of CPU; the failure policy decided them.", nil, nil),
		instDesc: prometheus.NewDesc("floodgate_redis_instances",
			"Stores sharing the Redis store's prefix and name, as last counted on Redis (0 before the first count).", nil, nil),
	}
	m.ok = m.calls.WithLabelValues("ok")
	m.failed = m.calls.WithLabelValues("error")
	return m, nil
}

// ObserveCall implements redisstore.Observer.
func (m *RedisMetrics) ObserveCall(d time.Duration, kind remote.ErrorKind) {
	if kind == remote.KindNone {
		m.ok.Observe(d.Seconds())
		return
	}
	m.failed.Observe(d.Seconds())
	m.errs[labels.Kind(kind)].Add(1)
}

// ObserveBreaker implements redisstore.Observer.
func (m *RedisMetrics) ObserveBreaker(from, to remote.BreakerState) {
	if int(to) >= len(labels.BreakerStates) {
		return
	}
	m.state.Store(uint32(to))
	m.transitions[to].Add(1)
}

// ObserveFallback implements redisstore.Observer.
func (m *RedisMetrics) ObserveFallback(source floodgate.Source) {
	if i, ok := labels.Fallback(source); ok {
		m.fallbacks[i].Add(1)
	}
}

// ObserveStarved implements redisstore.Observer.
func (m *RedisMetrics) ObserveStarved() { m.starved.Add(1) }

// ObserveInstances implements redisstore.Observer.
func (m *RedisMetrics) ObserveInstances(n int) { m.instances.Store(int64(n)) }

// Describe implements prometheus.Collector.
func (m *RedisMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.calls.Describe(ch)
	ch <- m.errDesc
	ch <- m.stateDesc
	ch <- m.transDesc
	ch <- m.fallsDesc
	ch <- m.starvedDesc
	ch <- m.instDesc
}

// Collect implements prometheus.Collector. Every labelled series is
// exported from the start, at 0.
func (m *RedisMetrics) Collect(ch chan<- prometheus.Metric) {
	m.calls.Collect(ch)
	for k := remote.KindTimeout; int(k) < labels.NumKinds; k++ {
		ch <- prometheus.MustNewConstMetric(m.errDesc, prometheus.CounterValue, float64(m.errs[k].Load()), k.String())
	}
	state := m.state.Load()
	for s, label := range labels.BreakerStates {
		v := 0.0
		if uint32(s) == state {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(m.stateDesc, prometheus.GaugeValue, v, label)
		ch <- prometheus.MustNewConstMetric(m.transDesc, prometheus.CounterValue, float64(m.transitions[s].Load()), label)
	}
	for i, f := range labels.FallbackSources {
		ch <- prometheus.MustNewConstMetric(m.fallsDesc, prometheus.CounterValue, float64(m.fallbacks[i].Load()), f.Label)
	}
	ch <- prometheus.MustNewConstMetric(m.starvedDesc, prometheus.CounterValue, float64(m.starved.Load()))
	ch <- prometheus.MustNewConstMetric(m.instDesc, prometheus.GaugeValue, float64(m.instances.Load()))
}
