// Package rls serves Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), which
// Envoy, Istio, Envoy Gateway and other Envoy-based proxies ask before each
// request, with floodgate's token buckets: in memory (keyed.Map) for one
// replica, or on Redis (redisstore.Store) for a fleet that shares them.
// The command floodgate-rls (rls/cmd/floodgate-rls) runs it.
//
// # Config
//
// [LoadConfig] reads envoyproxy/ratelimit's config format as it is: a
// domain, nested descriptors of key and optional value, rate_limit with
// requests_per_unit and unit (second, minute, hour, day, and week, month,
// year as envoyproxy/ratelimit counts them), unlimited, name and replaces,
// shadow_mode, detailed_metric, wildcard values ('*' matches any bytes:
// "foo*", "a*b"), and share_threshold; value_to_metric and metadata are
// accepted and have no effect; quota_mode is refused. A path may be one
// file or a directory of them, one domain each, or with [WithMergeDomains]
// a domain split across files, merged at its top level as
// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does. Validation is strict: an
// unknown or duplicate key, a value of the wrong type, a duplicate
// descriptor or domain, a bad unit, unlimited with a unit, an empty or
// self-naming replaces: every problem is reported at once, each with its
// file and line ([ConfigError]).
//
// Two fields are floodgate's own, which envoyproxy/ratelimit would refuse
// as unknown keys, so a file shared with it must not use them:
// rate_limit.burst, the bucket's capacity (default: one unit's worth,
// requests_per_unit), and the top-level failure_policy (local, open or
// closed; see below).
//
// A floodgate tenant config (package tenant: tiers, tenants, anonymous)
// is accepted too: it serves the domain named by its file's base name
// without extension. Its descriptors carry the entries api_key (the
// caller's key, hashed and looked up) or tenant (an ID), method (the gRPC
// full method) and remote_address (which keys anonymous callers); each
// resolves to the tenant's rule for the method, with its cost, and to the
// bucket the floodgate middleware uses for the same tenant and rule, so
// that the service and the library share buckets on a shared store.
//
// # Matching
//
// A descriptor resolves as in envoyproxy/ratelimit: at each level its
// entry's key and value, then the key's wildcard values in config order,
// then the key alone; a rate_limit applies when the level that holds it
// matches the descriptor's last entry. No match, or a match without a
// rate_limit, is OK and takes nothing; so is unlimited (limit_remaining
// is the largest uint32). A limit whose name another matched descriptor's
// replaces lists is dropped from the request. A descriptor that carries
// its own limit (the limit override) is limited by it.
//
// # Semantics
//
// Every limited descriptor is one token bucket: requests_per_unit tokens
// per unit, refilled evenly (rate = requests_per_unit / unit), holding a
// burst of requests_per_unit unless rate_limit.burst says otherwise. So
// over any window of length t a bucket admits at most burst + rate × t,
// where a fixed window (envoyproxy/ratelimit's) admits up to twice its
// limit across a window's edge. The bucket's key is the domain and the
// request's entries, keys and values (a share_threshold wildcard's
// pattern stands for its values): it does not depend on the limit, so a
// reload that keeps a descriptor keeps its bucket's tokens, and a changed
// limit applies from the next decision.
//
// A descriptor's cost is its hits_addend when it sets one, 0 included (a
// check that takes nothing, refused only while the bucket owes tokens),
// else the request's hits_addend, where 0 means 1. A cost above the
// burst can never be admitted and is OVER_LIMIT. A descriptor with
// is_negative_hits gives its cost back (a refund, never above the burst)
// and is OK.
//
// A request is OVER_LIMIT when any of its descriptors not in shadow mode
// is, and then nothing is taken from any bucket. The service takes from
// each limited bucket in order, each take atomic in its store (one Lua
// script call on Redis); at the first refusal it gives back every take
// before it ([floodgate.Reservation.Settle] with 0: exact, since a refund
// never lifts a bucket above its burst, so the bucket ends as if never
// taken from) and takes no further. Between a take and its refund a
// concurrent request can see the lower count, and be refused for it:
// the transient errs toward the limit, never over it. This holds alike in
// memory and on Redis, standalone or Cluster (each bucket is one key in
// its own slot; no script spans keys). The descriptors after the refusal
// are peeked for their status, taking nothing.
//
// On a store that batches its round trips (redisstore.WithBatching), the
// takes of a request's descriptors go at once instead of in order, so
// that they share one round trip; a refusal then gives back every other
// take, the same way, and every descriptor's decision is counted in the
// metrics (taken in order, those after a refusal are not). Before taking,
// the service asks the store's deny cache (redisstore.WithDenyCache): a
// descriptor it refuses refuses the request with nothing taken, and the
// others are peeked for their status; a request that carries a refund
// (is_negative_hits) or a reservation entry skips this step.
//
// Shadow mode decides and counts as usual but answers OK: a refused
// shadow descriptor takes nothing and refuses nothing. The response
// carries overall_code and, per descriptor, code, current_limit,
// limit_remaining (the bucket's whole tokens left) and
// duration_until_reset (until the bucket is full again). With
// [WithResponseHeaders] it adds x-ratelimit-limit (requests_per_unit),
// x-ratelimit-remaining and x-ratelimit-reset (whole seconds until the
// refused take could succeed, or until the bucket is full) for the
// descriptor that refused, else the one with the fewest tokens left.
//
// # Charges on the response
//
// Envoy sends a second call when a request is done for rate limits with
// apply_on_stream_done, whose hits_addend may carry the actual cost (bytes,
// tokens of a model's reply). envoyproxy/ratelimit adds it like any hit.
// Here, a descriptor that carries the entry [ReservationKey]
// ("floodgate.reservation", value: the request's ID, say x-request-id)
// links the two calls: the first takes its cost as an estimate and keeps
// the [floodgate.Reservation]; the second, with the same entries and ID,
// settles it at its cost, refunding the difference or charging the
// overrun (into debt down to the limit's debt limit, one burst), and is
// OK. The entry is not part of the match or of the bucket. The service
// keeps reservations in process ([WithReservations], 65536 for 5 minutes
// by default); a second call that finds none (expired, pushed out, or
// sent to another replica) is taken as a first call, which errs toward
// the limit by the estimate. A request refused as a whole holds nothing,
// so its second call settles nothing. A descriptor without the entry is
// charged at each call, as envoyproxy/ratelimit does.
//
// # Stores, leases and failures
//
// The store is any [floodgate.Reserver]. On redisstore, batching and the
// deny cache cost no accuracy, and leases (redisstore.WithLeases) let a
// replica decide hot buckets in process on tokens Redis leased to it; the
// bound that holds for all replicas together, leases or not, is in
// docs/stores.md.
//
// When the store cannot decide (Redis down or slow, its breaker open: a
// Result whose Source is floodgate.SourceFallback, SourceFailOpen or
// SourceFailClosed, or a store error that is not the caller's), the
// domain's failure_policy decides: local (the default) keeps the store's
// own decision (redisstore's Local policy: a local bucket at the limit
// divided among the replicas), open admits, closed refuses. Each such
// decision is counted (floodgate_rls_store_fallback_total). A request
// whose context ends first gets the context's error, never a fallback.
//
// # Observability
//
// [WithRegisterer] registers the metrics: decisions by domain, configured
// descriptor path (keys and the values the config names, never the
// request's values) and code; requests by domain and overall code;
// shadow-mode over-limit and near-limit decisions; fallbacks; unmatched
// descriptors; config loads; charges on the response. Every label comes
// from the config or a fixed set, so series are bounded by the config.
// The descriptors most often over the limit are a Space-Saving summary
// ([Service.Top], [Service.TopHandler], and the gauge
// floodgate_rls_over_limit_top): at most [WithTopK] entries, named by
// configured path, or by their values when detailed_metric.
//
// # Quotas (RLQS)
//
// Package rlqsclient makes a gRPC server a subscriber too: a Store for
// the middleware that decides locally at its assigned share.
//
// [QuotaServer] serves Envoy's rate-limit quota service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService), in memory for
// one replica, from a Service's config and its reloads. Envoy streams a
// usage report per bucket every interval (5 s); the server divides each
// limit among the buckets that share it and answers with token buckets,
// which Envoy enforces locally.
//
// A report's domain is the config's domain. Its BucketId, a map, matches
// the descriptor path whose keys are exactly the map's keys, the config tree
// supplying the order (config order breaks ties), each value matched as a
// descriptor entry's is; the rule at the last key's level is the limit, and
// the path's bucket key (as a descriptor with those entries would have it)
// names the quota that every bucket reporting it shares. No match, an
// tenant-config domain, a path without a rate_limit, unlimited and
// shadow_mode get a blanket ALLOW_ALL, and a limit of 0 a DENY_ALL,
// refreshed like any assignment.
//
// A report no Envoy would send ends its stream with InvalidArgument, its
// message naming the field: a line without a bucket_id, a time_elapsed that
// is negative or not a valid Duration, or counts of more than 10⁹ requests
// a second over the time the line covers (2^63 allowed, say). None of the
// report is taken; the stream's buckets hold their shares until they lapse,
// as any ended stream's. Lines an Envoy may send but that name nothing to
// divide are skipped unanswered, leaving Envoy on its no_assignment_behavior,
// and counted by floodgate_rls_quota_reports_ignored_total{reason}: an empty
// BucketId (empty_bucket_id; Envoy ignores any answer for it), a domain the
// config does not have (unknown_domain: the operator's fallback rather than an
// ALLOW_ALL, and nothing held for a domain nobody configured), and a new
// bucket past [WithMaxBucketsPerStream] (too_many_buckets: an abandon would
// have Envoy resubscribe it on every request). The rest of the report, and
// other streams, are taken as usual.
//
// The subscribers of a quota are its (stream, BucketId) pairs. Demand is
// the requests reported (allowed and denied) over the time between two
// reports by the server's clock (Envoy's time_elapsed is whole seconds,
// often 0, so it is not used), smoothed (a subscriber denied nothing that
// asks for less than half its smoothed demand is taken at its word at
// once); the capacity is the limit less a
// 1% reserve for newcomers, less the shares still held by subscribers that
// left and by newcomers not yet measured; it is divided by proportional
// share with 5% headroom, in whole tokens per fill interval (1 s while the
// limit gives each subscriber one request a second, else the config's
// unit up to 60 s), at least 1 token, with a burst of half a second's
// rate. A new bucket is answered at once with a newcomer's share; every
// report is answered; a change pushed at once, on a report or on
// [QuotaServer.Tick] ([QuotaServer.Run] ticks every interval), when it moves
// more than a token and 5%, or up at all for a subscriber that reported
// denials. Every assignment lives 2I + 2 s (whole seconds;
// Envoy reads nothing finer and drops a TTL of 0 at once), and a subscriber
// that stops reporting, or whose stream ends, holds its share until then.
//
// [QuotaServer.Close] ends every stream with UNAVAILABLE and sends nothing:
// Envoys keep their assignments until they lapse and reconnect on their
// next report.
//
// # Restart
//
// A new QuotaServer in memory cannot see the assignments a previous one
// handed out, which Envoys enforce until their TTL. For one TTL from its construction,
// by its clock, it learns (Doorman's learning mode): a returning
// subscriber, one whose first report on its stream covers a second or more,
// gets back the allowed rate that report shows, as far as the capacity not
// yet handed out allows; a new one gets a newcomer's share from the reserve;
// and a division shares among the measured subscribers at most what they
// already hold. The capacity no one has shown stays held until the window
// ends, when every earlier assignment has lapsed or been replaced. The cost
// is the quota left unused by Envoys that do not come back, for one TTL; a
// bucket created while its Envoy's stream was down reports its allow-all
// traffic as held, within the capacity left.
//
// # Replicas on Redis
//
// With [WithQuotaStore] (floodgate-rls's -redis), replicas that share a
// Redis and a prefix divide each limit together. Each quota is a hash on
// Redis with a field a replica: its grant, the rates of its subscribers
// that are not divided again (held), and its measured subscribers'
// demands. Every quarter of the report interval (within 100 ms and 1 s),
// and at once for a new quota or a returning subscriber, a replica takes
// one round a quota: it publishes what it has and asks for its part of the
// fleet's division, the same proportional share run over its own
// subscribers and every other replica's as they last published them.
// It asks for its held rates and its part; Redis grants that, at most the
// limit less the 1% reserve less the other replicas' grants, in one
// script, so the grants never sum above the
// limit; a replica hands out at most its grant, and a part that grows is
// granted as the other replicas come round and give theirs back.
//
// A grant lives on Redis the TTL plus two rounds past the round that set
// it: a replica that crashes holds its share until every assignment it
// handed out has lapsed, and its Envoys get little where they reconnect
// until then. A replica that shuts down ([QuotaServer.Close]) marks its
// grants draining instead; a returning subscriber, one whose first report
// on its new stream covers a second or more, has the replica it comes to
// claim from draining grants the rate it held, so that a rolling restart
// keeps the fleet at its limit. No learning window is needed: what a
// previous instance handed out stays covered by its grant.
//
// The bound: the assignments in force across all replicas add up to at
// most the limit, plus the newcomers' shares not yet measured, the one
// token per fill interval every subscriber gets however little is left,
// and the decreases still on their way to Envoys. A returning
// subscriber's claim is its allowed count over its first report's span,
// which may hold its bucket's burst: what that claims beyond its rate is
// taken from Envoys of the drained replica still to return, within one
// report interval. A subscriber that returns from a
// replica that did not drain (a crash, a dropped connection) while another
// drains may claim what it held from the draining one: the fleet may then
// admit that rate over the limit until the drained grant lapses. When a
// round fails (Redis down or slower than a round), the replica keeps
// dividing the grant it last held, among its own subscribers, and counts
// the failure (floodgate_rls_quota_share_errors_total): with Redis down
// for every replica the fleet stays within the limit; a replica cut off
// from Redis alone keeps its grant while the others, after its hold,
// divide it again, so the fleet may admit up to that grant over the limit
// until the replica reaches Redis again.
//
// # Reload
//
// [Service.SetConfig], [Service.Load] and [Service.Watch] replace the
// config atomically: each request is decided under one config. A config
// that fails to load leaves the previous one in force; the error lists
// every problem with its file and line.
//
// # Concurrency
//
// A [Service] is safe for concurrent use and starts no goroutine that
// outlives a request: Watch runs on its caller's.
package rls
