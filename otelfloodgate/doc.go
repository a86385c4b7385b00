// Package otelfloodgate records floodgate's decisions through
// OpenTelemetry: as metrics, with the names, units and attribute bounds of
// promfloodgate's Prometheus series wherever OTel's conventions allow, and
// as events on the call's span. The core packages do not import OTel; this
// module does, and reads the Limiter only through the events of its
// observer, and the other sources through their Stats and Snapshot.
//
//	rec, _ := otelfloodgate.New(meterProvider, // nil: otel.GetMeterProvider()
//		otelfloodgate.WithMethods(otelfloodgate.ServiceMethods(&pb.Inventory_ServiceDesc)...),
//		otelfloodgate.WithKeyed(store), otelfloodgate.WithOverload(ctrl))
//	lim, _ := middleware.New(store, reg, middleware.WithOverload(ctrl), middleware.WithObserver(rec.Observer()))
//	srv := grpc.NewServer(append(lim.ServerOptions(), grpc.StatsHandler(otelgrpc.NewServerHandler()))...)
//
// # Metrics
//
// A Recorder's observer (Recorder.Observer, for middleware.WithObserver)
// counts every decision of the Limiter in floodgate.decisions, with the
// attributes of promfloodgate's floodgate_decisions_total: outcome, reason,
// code, source, tier, method, stage and, with WithTenantLabels, tenant,
// from the same bounded sets (methods registered with WithMethods, the
// first WithMaxTiers tiers and WithTenantLabels tenants seen, "other"
// beyond them, "none" for anonymous callers); its reasons are
// promfloodgate's: admitted, quota, gate (the CPU gate's), overload (the
// overload controller's), store_error, and a metered quota's
// (tenant.MeteredSpec) debt and invalid_estimate, and its code is the
// rejection's (middleware.Rejection), OK for a call that runs. From the
// same events it counts the tap handle's rejections, the calls to exempt
// methods and the decisions of callers whose API key header was ignored.
// Each metered call's settle adds what it reserved, the
// cost it settled at, what it reserved beyond that and what the debt limit
// left uncharged to the cost instruments, by the quota's unit (the first
// MaxUnitLabels units seen, "other" beyond), tier, method and, with
// WithTenantLabels, tenant: promfloodgate's floodgate_cost_* series. The
// floodgate.cost.debt gauge is what tenants' metered buckets owe, by unit,
// tier and, with WithTenantLabels, tenant, as promfloodgate's
// floodgate_cost_debt: each bucket's debt as the observer last saw it less
// what refill has repaid since (on the WithClock clock), a series the sum
// of its buckets (the tenants folded into "other" among them), gone once
// they are repaid; at most MaxDebtBuckets buckets are followed, the one
// seen longest ago dropped for a new one, and not the anonymous callers'.
// Processes sharing the Redis store each report what they saw last:
// aggregate them with max, not sum. The
// state of the sources given to New is read by one callback, registered
// once, at each collection. For the Redis store, NewRedisMetrics returns a
// redisstore.Observer. The instruments, and the series OTel's Prometheus
// exporter (go.opentelemetry.io/otel/exporters/prometheus, default
// translation) makes of them:
//
//	instrument                           kind                unit          Prometheus series (attributes)
//	floodgate.decisions                  async counter       {call}        floodgate_decisions_total (as above)
//	floodgate.cost.reserved              async counter       {unit}        floodgate_cost_reserved_total (unit, tier, method, tenant)
//	floodgate.cost.settled               async counter       {unit}        floodgate_cost_settled_total (unit, tier, method, tenant)
//	floodgate.cost.refunded              async counter       {unit}        floodgate_cost_refunded_total (unit, tier, method, tenant)
//	floodgate.cost.uncharged             async counter       {unit}        floodgate_cost_uncharged_total (unit, tier, method, tenant)
//	floodgate.cost.debt                  async gauge         {unit}        floodgate_cost_debt (unit, tier, tenant)
//	floodgate.tap.rejections             async counter       {call}        floodgate_tap_rejections_total
//	floodgate.exempt                     async counter       {call}        floodgate_exempt_total
//	floodgate.api_keys.ignored           async counter       {call}        floodgate_api_keys_ignored_total (reason)
//	floodgate.keyed.keys                 async gauge         {bucket}      floodgate_keyed_keys
//	floodgate.keyed.evictions            async counter       {bucket}      floodgate_keyed_evictions_total
//	floodgate.keyed.evicted_not_full     async counter       {bucket}      floodgate_keyed_evicted_not_full_total
//	floodgate.keyed.overflowed           async counter       {take}        floodgate_keyed_overflowed_total
//	floodgate.gate.scale                 async gauge         1             floodgate_gate_scale_ratio ¹
//	floodgate.gate.state                 async gauge                       floodgate_gate_state (state)
//	floodgate.gate.cpu                   async gauge         1             floodgate_gate_cpu_ratio
//	floodgate.gate.cpu.smoothed          async gauge         1             floodgate_gate_cpu_smoothed_ratio
//	floodgate.gate.sampler_info          async gauge                       floodgate_gate_sampler_info (source)
//	floodgate.gate.sample_failures       async counter       {sample}      floodgate_gate_sample_failures_total
//	floodgate.overload.state             async gauge                       floodgate_overload_state (state)
//	floodgate.overload.limit             async gauge         {call}        floodgate_overload_limit
//	floodgate.overload.inflight          async gauge         {call}        floodgate_overload_inflight
//	floodgate.overload.queued            async gauge         {call}        floodgate_overload_queued
//	floodgate.overload.queue_cap         async gauge         {call}        floodgate_overload_queue_cap
//	floodgate.overload.latency           async gauge         s             floodgate_overload_latency_seconds
//	floodgate.overload.baseline          async gauge         s             floodgate_overload_baseline_seconds
//	floodgate.overload.queue_target      async gauge         s             floodgate_overload_queue_target_seconds
//	floodgate.overload.throughput        async gauge         {call}/s      floodgate_overload_throughput_per_second ²
//	floodgate.overload.wait              async gauge         s             floodgate_overload_wait_seconds
//	floodgate.overload.admitted          async counter       {call}        floodgate_overload_admitted_total (waited)
//	floodgate.overload.shed              async counter       {call}        floodgate_overload_shed_total (cause)
//	floodgate.overload.untapped          async counter       {call}        floodgate_overload_untapped_total
//	floodgate.config.loads               async counter       {load}        floodgate_config_loads_total (outcome)
//	floodgate.config.loaded_timestamp    async gauge         s             floodgate_config_loaded_timestamp_seconds
//	floodgate.redis.call.duration        histogram           s             floodgate_redis_call_duration_seconds (outcome)
//	floodgate.redis.call.errors          counter             {call}        floodgate_redis_call_errors_total (kind)
//	floodgate.redis.breaker.state        async gauge                       floodgate_redis_breaker_state (state)
//	floodgate.redis.breaker.transitions  counter             {transition}  floodgate_redis_breaker_transitions_total (to)
//	floodgate.redis.fallback_decisions   counter             {call}        floodgate_redis_fallback_decisions_total (source)
//	floodgate.redis.starved_calls        counter             {call}        floodgate_redis_starved_calls_total
//	floodgate.redis.instances            async gauge         {instance}    floodgate_redis_instances
//
// OTel names dotted namespaces and leaves the unit out of the name and
// counters without _total; the exporter puts both back, so each series is
// promfloodgate's but for two, whose units OTel's conventions fix: ¹ a
// dimensionless factor has unit 1, which the exporter names _ratio
// (promfloodgate: floodgate_gate_scale), and ² a rate's unit {call}/s
// becomes _per_second (promfloodgate: floodgate_overload_throughput).
// Attribute keys and values are promfloodgate's labels, not OTel's rpc.*
// ones, which describe the call on its span. Counters that have not counted
// appear from their first count, not at 0.
//
// # Span events
//
// The observer finds the call's span in its context (trace.SpanFromContext:
// otelgrpc's stats handler, or grpc-go's OTel stats handler, puts it there),
// and when the span records, adds
//
//   - floodgate.rejected to a call the Limiter rejected (or in dry-run mode
//     would have), with floodgate.reason (quota, gate, overload,
//     store_error, and a metered quota's debt and invalid_estimate),
//     floodgate.tier and floodgate.tenant when the caller has them,
//     floodgate.retry_delay (seconds) when the rejection states one,
//     floodgate.overload.cause when the overload controller shed it
//     (queue_full, displaced, wait_timeout, deadline) and
//     floodgate.dry_run;
//   - floodgate.waited to an admitted call that waited for a slot of the
//     overload controller, with floodgate.wait (seconds).
//
// A call admitted at once gets no event. The tap handle's rejections have
// no span: they happen before grpc-go calls its stats handlers, and are
// counted in floodgate.decisions (stage tap) and floodgate.tap.rejections.
// WithSpanEvents(false) turns the events off.
//
// # Cost
//
// The observer runs on the request path. It labels a decision as
// promfloodgate does (a map built by New, maps read without a lock) and
// adds one to the series' count, an atomic word reported at collection
// through an asynchronous counter, so that no call hashes the series'
// attributes. It allocates nothing but a new series' attribute set
// (TestObserverAllocs; a metered call's settle adds its cost to its series
// alike), and without a recording span, or for a call admitted at once, it
// adds no event. What it adds to an admitted call is in BENCHMARKS.md
// (BenchmarkObserverOverhead).
package otelfloodgate
