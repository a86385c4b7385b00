package otelfloodgate

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/calltest"
	"github.com/floodgate-go/floodgate/internal/pairbench"
	"github.com/floodgate-go/floodgate/middleware"
)

var sink any

// callCtx is a server call's context from 203.0.113.7 with the API key.
// callCtx is the context of a server call to methodGet with the API key.
func callCtx(key string) context.Context { return calltest.KeyContext(methodGet, key) }

func noop(context.Context, any) (any, error) { return "ok", nil }

// sdkRecorder returns a Recorder on the SDK's meter provider, read by a
// manual reader, as a service exporting its metrics has.
func sdkRecorder(tb testing.TB, opts ...Option) *Recorder {
	tb.Helper()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tb.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	r, err := New(mp, append([]Option{WithMethods(methodGet)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// BenchmarkObserverOverhead measures the observer's cost on the accepted
// path by pairs, as promfloodgate's benchmark of the same name does: it
// alternates blocks of calls through the interceptor without and with the
// observer (on the SDK's meter provider), and reports the median over the
// pairs of the difference per call as overhead-ns/op. ns/op is a pair of
// calls.
func BenchmarkObserverOverhead(b *testing.B) {
	r := sdkRecorder(b)
	without, with := pairbench.Interceptor(b, middleware.Static(testTable(b))), pairbench.Interceptor(b, middleware.Static(testTable(b)), middleware.WithObserver(r.Observer()))
	ctx := callCtx(goldKey)
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	pairbench.Overhead(b, without, with, ctx, info, noop)
}

// BenchmarkObserver is the observer alone on an accepted event.
func BenchmarkObserver(b *testing.B) {
	obs := sdkRecorder(b).Observer()
	e := middleware.Event{Decision: middleware.Decision{Tier: "gold", Allowed: true}, Method: methodGet, Context: callCtx(goldKey)}
	b.ReportAllocs()
	for b.Loop() {
		obs(e)
	}
}

// TestObserverAllocs: on the SDK's meter provider, the observer allocates
// nothing for an accepted call, a rejection without a recording span, a
// tenant over the cap, or an accepted call whose span records (an admitted
// call that did not wait has no event).
func TestObserverAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	unsampled, span := tp.Tracer("test").Start(context.Background(), "call")
	defer span.End()
	recording, rspan := sdktrace.NewTracerProvider().Tracer("test").Start(context.Background(), "call")
	defer rspan.End()
	if trace.SpanFromContext(unsampled).IsRecording() || !rspan.IsRecording() {
		t.Fatal("the spans do not record as the test needs")
	}
	for _, tenants := range []bool{false, true} {
		var opts []Option
		if tenants {
			opts = append(opts, WithTenantLabels(1))
		}
		obs := sdkRecorder(t, opts...).Observer()
		accepted := middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "acme", Allowed: true}, Method: methodGet, Context: callCtx(goldKey)}
		rejected := middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "acme", Reason: middleware.ReasonQuota}, Method: methodGet,
			Rejection: &middleware.Rejection{Reason: middleware.ReasonQuota, Code: codes.ResourceExhausted, RetryAfter: time.Second}, Context: unsampled}
		overCap := middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "globex", Allowed: true}, Method: methodGet}
		traced := middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "acme", Allowed: true}, Method: methodGet, Context: recording}
		owing := floodgate.Result{Limit: floodgate.Limit{Rate: 1000, Burst: 20000}, Owed: 1000} // the bucket is in debt
		debt := middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "acme", Reason: middleware.ReasonDebt, Metered: owing}, Method: methodGet, Unit: "tokens", MeterID: "m", Context: unsampled}
		settled := middleware.Event{
			Decision:  middleware.Decision{Tier: "gold", Tenant: "acme", Reason: middleware.ReasonSettled, Allowed: true, Reserved: 4000, Metered: owing},
			Method:    methodGet,
			Unit:      "tokens",
			MeterID:   "m",
			Settled:   5000,
			Uncharged: 10,
			Context:   recording,
		}
		// A settle that leaves a bucket not followed owing nothing.
		repaid := middleware.Event{
			Decision: middleware.Decision{Tier: "gold", Tenant: "globex", Reason: middleware.ReasonSettled, Allowed: true, Reserved: 4000, Metered: floodgate.Result{Allowed: true, Limit: owing.Limit}},
			Method:   methodGet,
			Unit:     "tokens",
			MeterID:  "m",
			Settled:  1000,
		}
		// An anonymous caller's rejection at the tap, whose API key was
		// ignored, and an exempt call.
		tapped := middleware.Event{Decision: middleware.Decision{Subject: "a:203.0.113.7", KeyIgnored: "repeated", Reason: middleware.ReasonGate},
			Method: methodGet, Tap: true, Rejection: &middleware.Rejection{Reason: middleware.ReasonGate, Code: codes.Unavailable, RetryAfter: time.Second}}
		exempt := middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonExempt, Allowed: true}, Method: "/grpc.health.v1.Health/Check", Context: recording}
		for _, e := range []middleware.Event{accepted, rejected, tapped, exempt, overCap, traced, debt, settled, repaid} {
			obs(e) // the series' first event makes its attribute set
		}
		for name, e := range map[string]middleware.Event{"accepted": accepted, "rejected, span not recording": rejected,
			"rejected at the tap": tapped, "exempt, span recording": exempt,
			"over the tenant cap, no context": overCap, "accepted, span recording": traced,
			"rejected for debt, span not recording": debt, "settled, span recording": settled, "settled, repaid": repaid} {
			if n := testing.AllocsPerRun(1000, func() { obs(e) }); n != 0 {
				t.Errorf("tenant labels %v, %s: %g allocations per event, want 0", tenants, name, n)
			}
		}
	}
}
