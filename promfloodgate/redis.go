package promfloodgate

import (
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/remote"
)

// DefaultCallBuckets are the upper bounds, in seconds, of the Redis call
// latency histogram when WithCallBuckets is not given: from 100 µs (a round
// trip on loopback) to 1 s (well past any decision's deadline).
var DefaultCallBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// A RedisOption configures RedisMetrics. NewRedisMetrics applies the
// options to a copy of the defaults, then validates the result.
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

func (o *redisOptions) validate() error {
	for i, b := range o.buckets {
		if !(b > 0) || math.IsInf(b, 0) || i > 0 && b <= o.buckets[i-1] {
			return invalid("WithCallBuckets", o.buckets, "finite, positive and increasing bounds")
		}
	}
	if len(o.buckets) == 0 {
		return invalid("WithCallBuckets", "no bounds", "at least one")
	}
	return nil
}

// numKinds is the number of error kinds labelled; a kind beyond them, from
// a newer redisstore, counts as "other".
const numKinds = int(remote.KindOther) + 1

// numBreakerStates is the number of breaker states labelled.
const numBreakerStates = int(remote.BreakerHalfOpen) + 1

// fallbackSources are the sources of the decisions Redis did not make, in
// label order, and their labels (as in floodgate_decisions_total).
var fallbackSources = [...]struct {
	source floodgate.Source
	label  string
}{
	{floodgate.SourceCache, "cache"},
	{floodgate.SourceLease, "lease"},
	{floodgate.SourceFallback, "fallback"},
	{floodgate.SourceFailOpen, "fail_open"},
	{floodgate.SourceFailClosed, "fail_closed"},
}

// breakerLabels label the breaker states, by remote.BreakerState.
var breakerLabels = [numBreakerStates]string{"closed", "open", "half_open"}

// RedisMetrics is a redisstore.Observer that is also a prometheus.Collector:
// pass it to redisstore.WithObserver and register it. It exports
//
//   - floodgate_redis_call_duration_seconds{outcome}: a histogram of the
//     store's round trips to Redis (a batch is one), outcome "ok" or
//     "error";
//   - floodgate_redis_call_errors_total{kind}: failed round trips by
//     remote.ErrorKind (timeout, canceled, connection, cluster, script,
//     other);
//   - floodgate_redis_breaker_state{state}: 1 for the breaker's state
//     (closed, open, half_open), 0 for the others;
//   - floodgate_redis_breaker_transitions_total{to}: transitions of the
//     breaker, by the state entered;
//   - floodgate_redis_fallback_decisions_total{source}: decisions Redis did
//     not make, by source (cache, lease, fallback, fail_open, fail_closed);
//   - floodgate_redis_starved_calls_total: calls that missed their deadline
//     while the process was starved of CPU, which the failure policy
//     decided without holding them against Redis;
//   - floodgate_redis_instances: the stores sharing the store's prefix and
//     name, as last counted on Redis (0 before the first count), which the
//     Local failure policy divides the limits by.
//
// Every label takes a few fixed values: no key, address or error text.
// Observing allocates nothing: a histogram observation or an atomic add.
//
// A RedisMetrics observes one Store: the breaker gauge follows one breaker.
// For several stores, give each its own RedisMetrics and register each with
// a label telling them apart, through prometheus.WrapRegistererWith.
// RedisMetrics is safe for concurrent use; the zero value is not usable.
type RedisMetrics struct {
	calls                 *prometheus.HistogramVec
	ok, failed            prometheus.Observer
	errs                  [numKinds]atomic.Uint64
	state                 atomic.Uint32 // remote.BreakerState
	transitions           [numBreakerStates]atomic.Uint64
	fallbacks             [len(fallbackSources)]atomic.Uint64
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
		opt(&o)
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
	k := int(kind)
	if k >= numKinds {
		k = int(remote.KindOther)
	}
	m.errs[k].Add(1)
}

// ObserveBreaker implements redisstore.Observer.
func (m *RedisMetrics) ObserveBreaker(from, to remote.BreakerState) {
	if int(to) >= numBreakerStates {
		return
	}
	m.state.Store(uint32(to))
	m.transitions[to].Add(1)
}

// ObserveFallback implements redisstore.Observer.
func (m *RedisMetrics) ObserveFallback(source floodgate.Source) {
	for i, f := range fallbackSources {
		if f.source == source {
			m.fallbacks[i].Add(1)
		}
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
	for k := remote.KindTimeout; int(k) < numKinds; k++ {
		ch <- prometheus.MustNewConstMetric(m.errDesc, prometheus.CounterValue, float64(m.errs[k].Load()), k.String())
	}
	state := m.state.Load()
	for s, label := range breakerLabels {
		v := 0.0
		if uint32(s) == state {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(m.stateDesc, prometheus.GaugeValue, v, label)
		ch <- prometheus.MustNewConstMetric(m.transDesc, prometheus.CounterValue, float64(m.transitions[s].Load()), label)
	}
	for i, f := range fallbackSources {
		ch <- prometheus.MustNewConstMetric(m.fallsDesc, prometheus.CounterValue, float64(m.fallbacks[i].Load()), f.label)
	}
	ch <- prometheus.MustNewConstMetric(m.starvedDesc, prometheus.CounterValue, float64(m.starved.Load()))
	ch <- prometheus.MustNewConstMetric(m.instDesc, prometheus.GaugeValue, float64(m.instances.Load()))
}
