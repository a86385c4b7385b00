package otelfloodgate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/remote"
)

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name, option string
		opt          Option
	}{
		{"bad method", "WithMethods", WithMethods("Get")},
		{"zero tiers", "WithMaxTiers", WithMaxTiers(0)},
		{"many tiers", "WithMaxTiers", WithMaxTiers(257)},
		{"many methods", "WithMethods", WithMethods(make([]string, MaxMethods+1)...)},
		{"many tenants", "WithTenantLabels", WithTenantLabels(MaxTenantLabels + 1)},
	} {
		if _, err := New(nil, tc.opt); !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), tc.option) {
			t.Errorf("%s: New() error = %v, want floodgate.ErrInvalidOption naming %s", tc.name, err, tc.option)
		}
	}
	for _, bounds := range [][]float64{{}, {0.1, 0.1}, {-1}} {
		if _, err := NewRedisMetrics(nil, WithCallBuckets(bounds...)); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("NewRedisMetrics(WithCallBuckets(%v)) error = %v, want floodgate.ErrInvalidOption", bounds, err)
		}
	}
	// The global meter provider, and nil sources, are the defaults.
	r, err := New(nil, WithKeyed(nil), WithGate(nil), WithOverload(nil), WithRegistry(nil))
	if err != nil {
		t.Fatalf("New(nil, nil sources) error = %v", err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
}

// TestCaps: tiers beyond the cap, tenants beyond theirs and unregistered
// methods share "other"; anonymous callers are "none".
func TestCaps(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	r, err := New(mp, WithMethods(methodGet), WithMaxTiers(1), WithTenantLabels(1), WithSpanEvents(false))
	if err != nil {
		t.Fatal(err)
	}
	obs := r.Observer()
	obs(middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "acme", Allowed: true}, Method: methodGet})
	obs(middleware.Event{Decision: middleware.Decision{Tier: "silver", Tenant: "globex", Allowed: true}, Method: methodGet})
	obs(middleware.Event{Decision: middleware.Decision{Allowed: true}, Method: "/made.Up/Method"})
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonOverload}, Method: methodGet, Tap: true,
		Rejection: &middleware.Rejection{Reason: middleware.ReasonOverload, Code: codes.Unavailable}})
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.Reason(200)}, Method: methodGet}) // newer than the package: dropped
	admitted := func(tier, method, tenant string) string {
		return "code=OK,method=" + method + ",outcome=admitted,reason=admitted,source=memory,stage=interceptor,tenant=" + tenant + ",tier=" + tier
	}
	want := map[string]int64{
		admitted("gold", methodGet, "acme"):         1,
		admitted(LabelOther, methodGet, LabelOther): 1,
		admitted(LabelNone, LabelOther, LabelNone):  1,
		"code=Unavailable,method=" + methodGet + ",outcome=rejected,reason=overload,source=none,stage=tap,tenant=none,tier=none": 1,
	}
	if diff := cmp.Diff(want, points(t, collect(t, reader)["floodgate.decisions"])); diff != "" {
		t.Errorf("floodgate.decisions (-want +got):\n%s", diff)
	}
}

// TestRedisMetrics records a Redis store's events and reads them back.
func TestRedisMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	rm, err := NewRedisMetrics(mp, WithCallBuckets(0.001, 0.01))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rm.Close() })
	rm.ObserveCall(500*time.Microsecond, remote.KindNone)
	rm.ObserveCall(20*time.Millisecond, remote.KindTimeout)
	rm.ObserveCall(time.Millisecond, remote.ErrorKind(99)) // newer than the package: other
	rm.ObserveBreaker(remote.BreakerClosed, remote.BreakerOpen)
	rm.ObserveBreaker(remote.BreakerOpen, remote.BreakerHalfOpen)
	rm.ObserveFallback(floodgate.SourceFallback)
	rm.ObserveFallback(floodgate.SourceFallback)
	rm.ObserveFallback(floodgate.SourceRedis) // Redis decided: not a fallback
	rm.ObserveStarved()
	rm.ObserveInstances(3)

	m := collect(t, reader)
	for name, want := range map[string]map[string]int64{
		"floodgate.redis.call.errors":         {"kind=timeout": 1, "kind=other": 1},
		"floodgate.redis.breaker.state":       {"state=closed": 0, "state=open": 0, "state=half_open": 1},
		"floodgate.redis.breaker.transitions": {"to=open": 1, "to=half_open": 1},
		"floodgate.redis.fallback_decisions":  {"source=fallback": 2},
		"floodgate.redis.starved_calls":       {"": 1},
		"floodgate.redis.instances":           {"": 3},
	} {
		if diff := cmp.Diff(want, points(t, m[name])); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	h, ok := m["floodgate.redis.call.duration"].Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("floodgate.redis.call.duration: %T, want a float64 histogram", m["floodgate.redis.call.duration"].Data)
	}
	got := map[string][]uint64{}
	for _, dp := range h.DataPoints {
		if !cmp.Equal(dp.Bounds, []float64{0.001, 0.01}) {
			t.Errorf("bounds %v, want [0.001 0.01]", dp.Bounds)
		}
		got[attrString(dp.Attributes)] = dp.BucketCounts
	}
	if diff := cmp.Diff(map[string][]uint64{"outcome=ok": {1, 0, 0}, "outcome=error": {1, 0, 1}}, got); diff != "" {
		t.Errorf("call duration buckets (-want +got):\n%s", diff)
	}
}

// TestCounts: the tap handle's rejections, exempt calls and ignored API
// keys come from the observer's events; a settle counts no ignored key.
func TestCounts(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	r, err := New(mp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	obs := r.Observer()
	for _, e := range []middleware.Event{
		{Decision: middleware.Decision{Reason: middleware.ReasonExempt, Allowed: true}, Method: "/grpc.health.v1.Health/Check"},
		{Decision: middleware.Decision{Reason: middleware.ReasonGate, KeyIgnored: "too_long"}, Method: methodGet, Tap: true,
			Rejection: &middleware.Rejection{Reason: middleware.ReasonGate, Code: codes.Unavailable}},
		{Decision: middleware.Decision{Allowed: true, KeyIgnored: "repeated"}, Method: methodGet},
		{Decision: middleware.Decision{Reason: middleware.ReasonSettled, Allowed: true, KeyIgnored: "repeated"}, Method: methodGet},
	} {
		obs(e)
	}
	m := collect(t, reader)
	for name, want := range map[string]map[string]int64{
		"floodgate.tap.rejections":   {"": 1},
		"floodgate.exempt":           {"": 1},
		"floodgate.api_keys.ignored": {"reason=repeated": 1, "reason=too_long": 1},
	} {
		if diff := cmp.Diff(want, points(t, m[name])); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
}
