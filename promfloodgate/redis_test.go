package promfloodgate

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
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
	m.ObserveCall(500*time.Microsecond, redisstore.KindNone)
	m.ObserveCall(2*time.Millisecond, redisstore.KindNone)
	m.ObserveCall(250*time.Millisecond, redisstore.KindTimeout)
	m.ObserveCall(time.Millisecond/2, redisstore.KindConnection)
	m.ObserveCall(time.Millisecond/2, redisstore.ErrorKind(200)) // a kind this package does not know
	m.ObserveBreaker(redisstore.BreakerClosed, redisstore.BreakerOpen)
	m.ObserveBreaker(redisstore.BreakerOpen, redisstore.BreakerHalfOpen)
	m.ObserveBreaker(redisstore.BreakerHalfOpen, redisstore.BreakerOpen)
	for _, s := range []floodgate.Source{floodgate.SourceFallback, floodgate.SourceFallback, floodgate.SourceCache,
		floodgate.SourceLease, floodgate.SourceFailOpen, floodgate.SourceFailClosed,
		floodgate.SourceRedis, floodgate.SourceMemory} { // the last two are not fallbacks
		m.ObserveFallback(s)
	}
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
		m.ObserveCall(time.Millisecond, redisstore.KindNone)
		m.ObserveCall(time.Millisecond, redisstore.KindTimeout)
		m.ObserveFallback(floodgate.SourceFallback)
		m.ObserveBreaker(redisstore.BreakerClosed, redisstore.BreakerOpen)
	}); n != 0 {
		t.Errorf("observing allocates %v times per run, want 0", n)
	}
}

// recordingHandler is a slog.Handler that keeps its records' level, message
// and attributes.
type recordingHandler struct {
	mu      sync.Mutex
	records []loggedLine
}

type loggedLine struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	l := loggedLine{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, l)
	h.mu.Unlock()
	return nil
}

func (h *recordingHandler) lines() []loggedLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]loggedLine(nil), h.records...)
}

// redisSeries returns the value of name's series whose label is value (a
// histogram's count).
func redisSeries(t *testing.T, m *RedisMetrics, name, label, value string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() != value {
					continue series
				}
			}
			switch {
			case s.GetCounter() != nil:
				return s.GetCounter().GetValue()
			case s.GetGauge() != nil:
				return s.GetGauge().GetValue()
			case s.GetHistogram() != nil:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

// TestRedisMetricsHungServer runs a store with RedisMetrics and a logger on
// a real redis-server, hangs the server (SIGSTOP) until the breaker opens,
// then resumes it until Redis decides again. The scrapes must show the
// timeouts, the fallback decisions and the breaker's state, and the log one
// line per transition.
func TestRedisMetricsHungServer(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() {
		srv.Cont()
		client.Close()
	})
	m, err := NewRedisMetrics()
	if err != nil {
		t.Fatal(err)
	}
	var logs recordingHandler
	store, err := redisstore.New(client, redisstore.WithObserver(m), redisstore.WithLogger(slog.New(&logs)),
		redisstore.WithPrefix("metrics"), redisstore.WithDeadline(200*time.Millisecond),
		redisstore.WithBreaker(2, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	lim := floodgate.PerSecond(1000, 1000)
	ctx := context.Background()
	// The first call dials, which under the race detector on a loaded
	// machine may miss the deadline: wait for Redis to decide once.
	fallbacks := untilRedis(t, store, "warm", lim, "at start")
	errsBefore := redisSeries(t, m, "floodgate_redis_call_errors_total", "kind", "timeout")

	srv.Stop()
	for range 3 {
		res, err := store.TakeN(ctx, "k", lim, 1)
		if err != nil || res.Source != floodgate.SourceFallback {
			t.Fatalf("TakeN on a hung Redis = %+v, %v, want a fallback decision", res, err)
		}
		fallbacks++
	}
	if got := redisSeries(t, m, "floodgate_redis_call_errors_total", "kind", "timeout") - errsBefore; got < 2 {
		t.Errorf("%v timeouts counted on a hung Redis, want at least 2", got)
	}
	if got, want := redisSeries(t, m, "floodgate_redis_breaker_state", "state", "open"), 1.0; got != want {
		t.Errorf("breaker_state{open} = %v with the breaker %v, want %v", got, store.Stats().Breaker, want)
	}
	if got, want := redisSeries(t, m, "floodgate_redis_fallback_decisions_total", "source", "fallback"), float64(fallbacks); got != want {
		t.Errorf("fallback_decisions_total{fallback} = %v, want %v", got, want)
	}
	lines := logs.lines()
	if len(lines) == 0 {
		t.Fatal("no log line when the breaker opened")
	}
	if l := lines[0]; l.level != slog.LevelWarn || l.msg != "redisstore: breaker state change" ||
		l.attrs["from"] != "closed" || l.attrs["to"] != "open" || l.attrs["error"] != "timeout" || l.attrs["prefix"] != "metrics" {
		t.Errorf("first log line = %+v, want closed → open at Warn after a timeout", l)
	}

	srv.Cont()
	fallbacks += untilRedis(t, store, "k", lim, "after resuming")
	for _, v := range []struct {
		name, label, value string
		want               float64
	}{
		{"floodgate_redis_breaker_state", "state", "closed", 1},
		{"floodgate_redis_breaker_state", "state", "open", 0},
		{"floodgate_redis_breaker_state", "state", "half_open", 0},
		{"floodgate_redis_breaker_transitions_total", "to", "closed", 1},
		{"floodgate_redis_fallback_decisions_total", "source", "fallback", float64(fallbacks)},
		{"floodgate_redis_fallback_decisions_total", "source", "fail_open", 0},
	} {
		if got := redisSeries(t, m, v.name, v.label, v.value); got != v.want {
			t.Errorf("%s{%s=%q} = %v, want %v", v.name, v.label, v.value, got, v.want)
		}
	}
	// Every failed round trip is in the histogram and in exactly one kind.
	kinds := 0.0
	for k := redisstore.KindTimeout; k <= redisstore.KindOther; k++ {
		kinds += redisSeries(t, m, "floodgate_redis_call_errors_total", "kind", k.String())
	}
	if got := redisSeries(t, m, "floodgate_redis_call_duration_seconds", "outcome", "error"); got != kinds {
		t.Errorf("%v failed round trips in the histogram, %v by kind", got, kinds)
	}
	if got := redisSeries(t, m, "floodgate_redis_call_duration_seconds", "outcome", "ok"); got < 2 {
		t.Errorf("%v successful round trips in the histogram, want at least 2", got)
	}
	// One line per transition: as many as the transitions counted.
	transitions := 0.0
	for _, s := range []string{"closed", "open", "half_open"} {
		transitions += redisSeries(t, m, "floodgate_redis_breaker_transitions_total", "to", s)
	}
	lines = logs.lines()
	if float64(len(lines)) != transitions {
		t.Errorf("%d log lines for %v transitions, want one each", len(lines), transitions)
	}
	if l := lines[len(lines)-1]; l.level != slog.LevelInfo || l.attrs["to"] != "closed" || l.attrs["open_for"] == "" {
		t.Errorf("last log line = %+v, want a change to closed at Info with open_for", l)
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
			m.ObserveCall(300*time.Microsecond, redisstore.KindNone)
		}
	})
}

// A store whose metrics are served with the rest of floodgate's.
func ExampleNewRedisMetrics() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	metrics, err := NewRedisMetrics()
	if err != nil {
		panic(err)
	}
	store, err := redisstore.New(client,
		redisstore.WithObserver(metrics),
		redisstore.WithLogger(slog.Default())) // one line per breaker transition
	if err != nil {
		panic(err)
	}
	prometheus.MustRegister(metrics)
	_ = store
}

// untilRedis takes from key until Redis, not a fallback, decides, for at
// most 10 s, and returns how many decisions fell back meanwhile.
func untilRedis(t *testing.T, store *redisstore.Store, key string, lim floodgate.Limit, when string) int {
	t.Helper()
	fallbacks := 0
	for end := time.Now().Add(10 * time.Second); ; {
		res, err := store.TakeN(context.Background(), key, lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Source == floodgate.SourceRedis {
			return fallbacks
		}
		fallbacks++
		if time.Now().After(end) {
			t.Fatalf("Redis did not decide within 10s %s", when)
		}
		runtime.Gosched() // the breaker's cooldown runs on real time
	}
}
