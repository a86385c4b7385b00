package otelfloodgate

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/remote"
	"github.com/floodgate-go/floodgate/tenant"
)

// mapping is the package doc's table: each instrument's name, and the
// series OTel's Prometheus exporter makes of it, which is promfloodgate's
// name but where the doc says otherwise.
var mapping = []struct{ otel, prom string }{
	{"floodgate.decisions", "floodgate_decisions_total"},
	{"floodgate.cost.reserved", "floodgate_cost_reserved_total"},
	{"floodgate.cost.settled", "floodgate_cost_settled_total"},
	{"floodgate.cost.refunded", "floodgate_cost_refunded_total"},
	{"floodgate.cost.uncharged", "floodgate_cost_uncharged_total"},
	{"floodgate.cost.debt", "floodgate_cost_debt"},
	{"floodgate.tap.rejections", "floodgate_tap_rejections_total"},
	{"floodgate.exempt", "floodgate_exempt_total"},
	{"floodgate.api_keys.ignored", "floodgate_api_keys_ignored_total"},
	{"floodgate.keyed.keys", "floodgate_keyed_keys"},
	{"floodgate.keyed.evictions", "floodgate_keyed_evictions_total"},
	{"floodgate.keyed.evicted_not_full", "floodgate_keyed_evicted_not_full_total"},
	{"floodgate.keyed.overflowed", "floodgate_keyed_overflowed_total"},
	{"floodgate.gate.scale", "floodgate_gate_scale_ratio"}, // promfloodgate: floodgate_gate_scale
	{"floodgate.gate.state", "floodgate_gate_state"},
	{"floodgate.gate.cpu", "floodgate_gate_cpu_ratio"},
	{"floodgate.gate.cpu.smoothed", "floodgate_gate_cpu_smoothed_ratio"},
	{"floodgate.gate.sampler_info", "floodgate_gate_sampler_info"},
	{"floodgate.gate.sample_failures", "floodgate_gate_sample_failures_total"},
	{"floodgate.overload.state", "floodgate_overload_state"},
	{"floodgate.overload.limit", "floodgate_overload_limit"},
	{"floodgate.overload.inflight", "floodgate_overload_inflight"},
	{"floodgate.overload.queued", "floodgate_overload_queued"},
	{"floodgate.overload.queue_cap", "floodgate_overload_queue_cap"},
	{"floodgate.overload.latency", "floodgate_overload_latency_seconds"},
	{"floodgate.overload.baseline", "floodgate_overload_baseline_seconds"},
	{"floodgate.overload.queue_target", "floodgate_overload_queue_target_seconds"},
	{"floodgate.overload.throughput", "floodgate_overload_throughput_per_second"}, // promfloodgate: floodgate_overload_throughput
	{"floodgate.overload.wait", "floodgate_overload_wait_seconds"},
	{"floodgate.overload.admitted", "floodgate_overload_admitted_total"},
	{"floodgate.overload.shed", "floodgate_overload_shed_total"},
	{"floodgate.overload.untapped", "floodgate_overload_untapped_total"},
	{"floodgate.config.loads", "floodgate_config_loads_total"},
	{"floodgate.config.loaded_timestamp", "floodgate_config_loaded_timestamp_seconds"},
	{"floodgate.redis.call.duration", "floodgate_redis_call_duration_seconds"},
	{"floodgate.redis.call.errors", "floodgate_redis_call_errors_total"},
	{"floodgate.redis.breaker.state", "floodgate_redis_breaker_state"},
	{"floodgate.redis.breaker.transitions", "floodgate_redis_breaker_transitions_total"},
	{"floodgate.redis.fallback_decisions", "floodgate_redis_fallback_decisions_total"},
	{"floodgate.redis.starved_calls", "floodgate_redis_starved_calls_total"},
	{"floodgate.redis.instances", "floodgate_redis_instances"},
}

// TestPrometheusNames exports every instrument through OTel's Prometheus
// exporter and finds each under the name the mapping gives, and no other.
func TestPrometheusNames(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	gate, err := cpugate.New(cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		return cpugate.Reading{CPU: 0.3, Source: "scripted"}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := gate.SampleAt(time.Now()); err != nil {
		t.Fatal(err)
	}
	ctrl, err := overload.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(mp, WithKeyed(store), WithGate(gate), WithOverload(ctrl), WithRegistry(tables))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	r.Observer()(middleware.Event{Decision: middleware.Decision{Allowed: true}, Method: methodGet})
	r.Observer()(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonSettled, Allowed: true, Reserved: 4000}, Method: methodGet, Unit: "tokens", Settled: 1000})
	r.Observer()(middleware.Event{
		Decision: middleware.Decision{Tenant: "acme", Reason: middleware.ReasonDebt, Metered: floodgate.Result{Limit: floodgate.Limit{Rate: 1, Burst: 1000}, Owed: 1000}},
		Method:   methodGet,
		Unit:     "tokens",
		MeterID:  "m",
	})
	rm, err := NewRedisMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rm.Close() })
	rm.ObserveCall(time.Millisecond, remote.KindTimeout)
	rm.ObserveBreaker(remote.BreakerClosed, remote.BreakerOpen)
	rm.ObserveFallback(floodgate.SourceFallback)
	rm.ObserveStarved()
	rm.ObserveInstances(3)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, m := range mapping {
		if !got[m.prom] {
			t.Errorf("%s: no series %s", m.otel, m.prom)
		}
		delete(got, m.prom)
	}
	for name := range got {
		t.Errorf("series %s is not in the mapping", name)
	}
}
