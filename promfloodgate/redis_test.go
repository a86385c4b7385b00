package promfloodgate

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/remote"
)

func TestNewRedisMetricsValidates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bounds []float64
	}{
		{"none", nil},
		{"zero", []float64{0, 1}},
		{"negative", []float64{-1, 1}},
		{"not increasing", []float64{.1, .1}},
		{"decreasing", []float64{1, .1}},
		{"infinite", []float64{1, math.Inf(1)}},
		{"NaN", []float64{math.NaN()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewRedisMetrics(WithCallBuckets(tc.bounds...)); !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), "WithCallBuckets") {
				t.Errorf("NewRedisMetrics(WithCallBuckets(%v)) error = %v, want floodgate.ErrInvalidOption naming WithCallBuckets", tc.bounds, err)
			}
		})
	}
	if _, err := NewRedisMetrics(WithCallBuckets(.001, .01)); err != nil {
		t.Errorf("NewRedisMetrics(WithCallBuckets(.001, .01)) = %v", err)
	}
}

// TestRedisMetricsSeries feeds events straight to the observer and checks
// every series, labels and all.
func TestRedisMetricsSeries(t *testing.T) {
	m, err := NewRedisMetrics(WithCallBuckets(.001, .01))
	if err != nil {
		t.Fatal(err)
	}
	m.ObserveCall(500*time.Microsecond, remote.KindNone)
	m.ObserveCall(2*time.Millisecond, remote.KindNone)
	m.ObserveCall(250*time.Millisecond, remote.KindTimeout)
	m.ObserveCall(time.Millisecond/2, remote.KindConnection)
	m.ObserveCall(time.Millisecond/2, remote.ErrorKind(200)) // a kind this package does not know
	m.ObserveBreaker(remote.BreakerClosed, remote.BreakerOpen)
	m.ObserveBreaker(remote.BreakerOpen, remote.BreakerHalfOpen)
	m.ObserveBreaker(remote.BreakerHalfOpen, remote.BreakerOpen)
	for _, s := range []floodgate.Source{floodgate.SourceFallback, floodgate.SourceFallback, floodgate.SourceCache,
		floodgate.SourceLease, floodgate.SourceFailOpen, floodgate.SourceFailClosed,
		floodgate.SourceRedis, floodgate.SourceMemory} { // the last two are not fallbacks
		m.ObserveFallback(s)
	}
	m.ObserveStarved()
	m.ObserveStarved()
	m.ObserveInstances(2)
	m.ObserveInstances(3)
	want := `
# HELP floodgate_redis_breaker_state 1 for the state of the Redis store's circuit breaker (closed, open, half_open), 0 for the others.
# TYPE floodgate_redis_breaker_state gauge
floodgate_redis_breaker_state{state="closed"} 0
floodgate_redis_breaker_state{state="half_open"} 0
floodgate_redis_breaker_state{state="open"} 1
# HELP floodgate_redis_breaker_transitions_total Transitions of the Redis store's circuit breaker, by the state entered.
# TYPE floodgate_redis_breaker_transitions_total counter
floodgate_redis_breaker_transitions_total{to="closed"} 0
floodgate_redis_breaker_transitions_total{to="half_open"} 1
floodgate_redis_breaker_transitions_total{to="open"} 2
# HELP floodgate_redis_call_duration_seconds Round trips of the Redis store to Redis (a batch is one), by outcome (ok, error).
# TYPE floodgate_redis_call_duration_seconds histogram
floodgate_redis_call_duration_seconds_bucket{outcome="error",le="0.001"} 2
floodgate_redis_call_duration_seconds_bucket{outcome="error",le="0.01"} 2
floodgate_redis_call_duration_seconds_bucket{outcome="error",le="+Inf"} 3
floodgate_redis_call_duration_seconds_sum{outcome="error"} 0.251
floodgate_redis_call_duration_seconds_count{outcome="error"} 3
floodgate_redis_call_duration_seconds_bucket{outcome="ok",le="0.001"} 1
floodgate_redis_call_duration_seconds_bucket{outcome="ok",le="0.01"} 2
floodgate_redis_call_duration_seconds_bucket{outcome="ok",le="+Inf"} 2
floodgate_redis_call_duration_seconds_sum{outcome="ok"} 0.0025
floodgate_redis_call_duration_seconds_count{outcome="ok"} 2
# HELP floodgate_redis_call_errors_total Failed round trips of the Redis store, by kind (timeout, canceled, connection, cluster, script, other).
# TYPE floodgate_redis_call_errors_total counter
floodgate_redis_call_errors_total{kind="canceled"} 0
floodgate_redis_call_errors_total{kind="cluster"} 0
floodgate_redis_call_errors_total{kind="connection"} 1
floodgate_redis_call_errors_total{kind="other"} 1
floodgate_redis_call_errors_total{kind="script"} 0
floodgate_redis_call_errors_total{kind="timeout"} 1
# HELP floodgate_redis_fallback_decisions_total Decisions of the Redis store not made by Redis, by source (cache, lease, fallback, fail_open, fail_closed).
# TYPE floodgate_redis_fallback_decisions_total counter
floodgate_redis_fallback_decisions_total{source="cache"} 1
floodgate_redis_fallback_decisions_total{source="fail_closed"} 1
floodgate_redis_fallback_decisions_total{source="fail_open"} 1
floodgate_redis_fallback_decisions_total{source="fallback"} 2
floodgate_redis_fallback_decisions_total{source="lease"} 1
# HELP floodgate_redis_instances Stores sharing the Redis store's prefix and name, as last counted on Redis (0 before the first count).
# TYPE floodgate_redis_instances gauge
floodgate_redis_instances 3
# HELP floodgate_redis_starved_calls_total Calls of the Redis store that missed their deadline while the process was starved of CPU; the failure policy decided them.
# TYPE floodgate_redis_starved_calls_total counter
floodgate_redis_starved_calls_total 2
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.CollectAndLint(m); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestRedisMetricsAllocs(t *testing.T) {
	m, err := NewRedisMetrics()
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		m.ObserveCall(time.Millisecond, remote.KindNone)
		m.ObserveCall(time.Millisecond, remote.KindTimeout)
		m.ObserveFallback(floodgate.SourceFallback)
		m.ObserveBreaker(remote.BreakerClosed, remote.BreakerOpen)
	}); n != 0 {
		t.Errorf("observing allocates %v times per run, want 0", n)
	}
}

// BenchmarkRedisMetrics measures the observer's work per round trip: a
// histogram observation, and a counter for a failure.
func BenchmarkRedisMetrics(b *testing.B) {
	m, err := NewRedisMetrics()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.ObserveCall(300*time.Microsecond, remote.KindNone)
		}
	})
}

// Metrics of a Redis store, served with the rest of floodgate's.
func ExampleNewRedisMetrics() {
	metrics, err := NewRedisMetrics()
	if err != nil {
		panic(err)
	}
	prometheus.MustRegister(metrics)
	// The store reports to it:
	//
	//	store, err := redisstore.New(client,
	//		redisstore.WithObserver(metrics),
	//		redisstore.WithLogger(slog.Default())) // one line per breaker transition
}
