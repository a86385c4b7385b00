// Package promfloodgate exports floodgate's counters to Prometheus, keeps a
// bounded summary of the callers rejected most often, and logs rejections at
// a bounded rate. The core packages do not import client_golang; this one
// does, and reads the Limiter only through the events of its observer, and
// the other sources through their Stats and Snapshot.
//
//	offenders, _ := promfloodgate.NewOffenders()
//	metrics, _ := promfloodgate.New(
//		promfloodgate.WithMethods(promfloodgate.ServiceMethods(&pb.Inventory_ServiceDesc)...),
//		promfloodgate.WithKeyed(store), promfloodgate.WithGate(gate),
//		promfloodgate.WithOffenders(offenders),
//		promfloodgate.WithLogger(logger, time.Second))
//	lim, _ := middleware.New(store, reg, middleware.WithObserver(metrics.Observer()))
//	prometheus.MustRegister(metrics)
//
// # Metrics
//
// A Collector is a prometheus.Collector. Its observer (Collector.Observer,
// for middleware.WithObserver) counts every decision of the Limiter in
// floodgate_decisions_total, labelled by outcome (admitted, rejected,
// dry_run_rejected), reason (admitted, quota, gate, overload, store_error,
// and for metered quotas debt and invalid_estimate), code (the status code
// of the rejection the client got, middleware.Rejection's; OK for a call
// that runs), source (what decided in the store: memory, redis, cache,
// lease, fallback, fail_open, fail_closed; none after a store error and in
// the tap), tier, method, stage (interceptor or tap) and, with
// WithTenantLabels, tenant. Reason gate is the CPU gate's (the caller over
// its quota scaled down, or turned away at the tap while the gate sheds),
// overload the overload controller's. From the same events it counts the
// tap handle's rejections (floodgate_tap_rejections_total, which are in
// floodgate_decisions_total too, at stage tap), the calls to exempt
// methods, which are no decision (floodgate_exempt_total), and the
// decisions of callers whose API key header was ignored
// (floodgate_api_keys_ignored_total{reason}: repeated or too_long).
//
// A metered quota (tenant.MeteredSpec: tokens, bytes) refuses a call whose
// tenant's bucket owes units with reason debt, and a call whose estimate
// header is not a whole number within the burst with reason
// invalid_estimate and INVALID_ARGUMENT. As each metered call ends,
// the observer counts its settle, by unit, tier, method and, with
// WithTenantLabels, tenant: floodgate_cost_reserved_total (its estimate and
// its stream's chunks), floodgate_cost_settled_total (the cost it
// reported, or its estimate when it reported none),
// floodgate_cost_refunded_total (what it reserved beyond that) and
// floodgate_cost_uncharged_total (what the debt limit left uncharged, the
// only units the quota did not count). Rank tenants by
// floodgate_cost_settled_total to find who costs most, or by Offenders'
// cost ranking, which WithOffenders feeds, across every tenant.
//
// floodgate_cost_debt is the gauge of what tenants' metered buckets owe,
// by unit, tier and, with WithTenantLabels, tenant: each bucket's debt as
// the observer last saw it (a settle that charged past what was reserved,
// a call refused for the debt, a settle that left it owing nothing), less
// what refill has repaid since, on the WithClock clock; a series goes once
// its buckets are repaid. A series of several buckets (a tenant's buckets
// of one unit, the tenants folded into "other", every tenant of a tier
// without tenant labels) is their sum. The observer follows at most
// MaxDebtBuckets buckets, dropping the one seen longest ago for a new one,
// and not the anonymous callers' buckets. It reports what this process
// saw: processes sharing the Redis store each report the debt as they saw
// it last, so aggregate them with max, not sum.
//
// The sources given to New are read at each scrape, and only they are
// exported:
//
//   - WithKeyed: floodgate_keyed_keys, floodgate_keyed_evictions_total,
//     floodgate_keyed_evicted_not_full_total, floodgate_keyed_overflowed_total;
//   - WithGate: floodgate_gate_scale, floodgate_gate_state{state},
//     floodgate_gate_cpu_ratio, floodgate_gate_cpu_smoothed_ratio,
//     floodgate_gate_sampler_info{source}, floodgate_gate_sample_failures_total;
//   - WithOverload: floodgate_overload_state{state}, _limit, _inflight,
//     _queued, _queue_cap, _latency_seconds, _baseline_seconds,
//     _queue_target_seconds, _throughput, _wait_seconds,
//     _admitted_total{waited}, _shed_total{cause} and _untapped_total (calls
//     that reached the controller without the tap handle: it should stay 0);
//   - WithRegistry: floodgate_config_loads_total{outcome},
//     floodgate_config_loaded_timestamp_seconds.
//
// For the Redis store, NewRedisMetrics returns a RedisMetrics: set it as the
// store's observer (redisstore.WithObserver) and register it beside the
// Collector. It exports a histogram of each round trip's latency
// (floodgate_redis_call_duration_seconds{outcome}; a batch is one round
// trip), failed round trips by kind (floodgate_redis_call_errors_total{kind}:
// timeout, canceled, connection, cluster, script, other), the breaker's
// state including half-open (floodgate_redis_breaker_state{state}) and its
// transitions (floodgate_redis_breaker_transitions_total{to}), decisions
// Redis did not make (floodgate_redis_fallback_decisions_total{source}),
// calls that timed out while the process was starved of CPU
// (floodgate_redis_starved_calls_total) and the stores sharing the limits
// (floodgate_redis_instances).
// Breaker transitions are logged, one line each, by redisstore.WithLogger.
//
// # Cardinality
//
// No label ever holds a key or an address, and a tenant ID only when asked
// for. A method labels itself only when registered with WithMethods, else
// it is "other", so clients calling made-up methods add no series. The
// first WithMaxTiers tiers seen label themselves, later ones "other";
// anonymous callers are tier "none" unless the anonymous policy names a
// tier (the tap handle judges a caller it cannot resolve alone, one whose
// API key it has not seen yet, say, by its address, as anonymous). Two
// series whose labels come out equal (a tier named "none" or "other", say)
// are reported as one, their sum. Tenant labels are off by default;
// WithTenantLabels(n) names the first n tenants seen and labels later ones
// "other" (anonymous callers "none"). The source label has nine values
// (none, the seven sources and "unknown"), of which a deployment meets
// few; a reason's rejections have one code. The decision series are
// therefore bounded by 56 combinations of reason and flags (7 reasons × 8
// settings of Allowed, DryRun and Tap) × 9 sources × (tiers + 2) ×
// (methods + 1) × (n + 2), and
// in practice are the few combinations that occur: a series exists from
// its first count. The cost series are bounded likewise, by the first
// MaxUnitLabels units seen (later ones "other") × (tiers + 2) × (methods +
// 1) × (n + 2), and the debt series by units × (tiers + 2) × (n + 2).
//
// # Cost
//
// The observer runs on the request path. It finds the method's label in a
// map built by New, the tier's and (with tenant labels) the tenant's in
// maps read without a lock, and the series' counter in another, keyed by
// the labels' numbers, and increments it; the counts beside the series are
// atomic words. It allocates nothing but a new series' counter, and with
// WithOffenders a subject's string as it enters a ranking
// (TestObserverAllocs). A metered call's settle costs about as much again,
// in the cost series. A rejection also reads the clock when WithLogger is
// set, and with WithOffenders takes the summary's lock, after hashing an
// anonymous caller's address; an event that reports a debt reads the clock
// and takes the debt gauge's lock, as a settle does while some bucket
// owes. What the observer adds to an admitted call is in BENCHMARKS.md
// (BenchmarkObserverOverhead).
//
// # Top offenders
//
// Offenders keeps the callers rejected most often in fixed memory, by the
// Space-Saving algorithm over k subjects: every caller with more than 1/k
// of the recorded rejections is listed, with a count that is an upper
// bound, off by at most its Err. The Collector's observer feeds it
// (WithOffenders) with every rejection's subject, the tap handle's
// included: the caller as the Limiter charged it, "t:<tenant ID>", or
// "a:<address prefix>" for an anonymous caller, so a client rotating
// made-up API keys is one subject, its address. Tenant IDs are kept as
// they are; addresses as the first 12 hex digits of their HMAC-SHA-256
// under a per-process secret (WithHashSecret to share one) unless
// WithRawKeys: a plain hash of an IPv4 address would be undone by hashing
// them all. Offenders.Handler serves the list as JSON for an operators'
// port.
//
// Beside the rejections, Offenders ranks the callers whose calls cost most
// under metered quotas, one ranking per unit (tokens, bytes; at most
// MaxCostUnits), by the same algorithm weighted by each call's cost
// (RecordCost; ObserveCost, which WithOffenders calls, from the Limiter's
// settles, by tenant): a caller with more than 1/k of a unit's cost is
// listed. The handler's JSON holds them under "costs".
//
// # Logs
//
// With WithLogger, the observer logs a rejection at most once per interval,
// with the number of rejections not logged since ("suppressed"), so an attack
// cannot turn into one log line per request. Gate transitions are logged by
// cpugate.WithLogger, config reloads by tenant.WithLogger and the Redis
// store's breaker transitions by redisstore.WithLogger.
package promfloodgate
