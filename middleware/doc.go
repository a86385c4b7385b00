// Package middleware admits gRPC calls per tenant and sheds load under
// overload: a Limiter with unary and stream server interceptors and a tap
// handle for the cheapest early rejection.
//
// # The request path
//
// Admit is the one path every call takes: the interceptors, Limit (the
// go-grpc-middleware adapter) and package httplimit go through it, and the
// tap handle does its first steps early. One gRPC call through
// ServerOptions visits each step once, but for a caller the tap cannot
// tell without hashing an API key it has not seen or calling a
// WithKeyFunc hook: the tap judges that caller by its address, and the
// interceptor resolves it in full.
//
//	conn reader ─► TapHandle (constant work, no I/O; exempt methods pass
//	               untouched): makes the call's context, which keeps its
//	               headers as grpc-go read them. With an overload
//	               controller, or while the CPU gate sheds, it also
//	               resolves the caller (identity ─► tenant ─► route, the
//	               bucket key and flow ─► priority) in the tenant table in
//	               force, counts the call into the controller (Enter) and
//	               may reject it: server full and the caller's flow at its
//	               fair share (a unary method the interceptor has seen),
//	               or the caller inside a retry delay the gate gave it.
//	               The call's body is never read then.
//	handler g. ─►  interceptor ─► Admit: the tap's resolution, when it made
//	               one in the table still in force (else resolve, once) ─►
//	               store.TakeN(key, limit (× gate scale), cost) ─►
//	               metered quota: store.ReserveN(estimate) (see below) ─►
//	               controller.Acquire(the caller's flow) (WithOverload)
//	               admitted → handler, with the Decision in the context,
//	                          then a metered call's settle
//	               rejected → the Rejection and its pushback trailer; the
//	                          handler never runs
//
// A stream takes the same path, but is not held to the controller. The tap
// cannot tell a stream from a unary call: it counts in the calls of a
// method neither interceptor has seen, but turns them away only once the
// unary interceptor has seen the method, and stops counting a method's
// calls in once the stream interceptor has. Without the tap handle (the
// interceptors alone) the interceptor resolves every call, and each header
// it reads is copied.
//
// The Limiter joins three parts built elsewhere: a floodgate.Store holding
// the buckets (keyed in memory, redisstore across instances), the tenant
// table (tenant.Registry, or Static for a fixed table) and, optionally, an
// overload.Controller (WithOverload, recommended) that admits what the
// server completes and sheds the tenants over their fair share first, or
// a Gate such as cpugate.Gate (WithGate, the classic) whose scale
// multiplies every limit while the CPU is saturated. Each tenant has one
// bucket per rule (a rule is the method pattern that supplied the limit),
// so a tenant's cheap and expensive methods do not drain each other;
// anonymous callers have the same buckets per client address. An admitted
// call allocates one object through ServerOptions: its context, which
// carries the Decision; so does a rejected one. Each caller's bucket key,
// per rule, is kept in a bounded LRU cache (golang-lru), by tenant or, for
// anonymous callers, by address prefix, and rejections (Rejection) are
// built once per reason and retry delay and shared.
//
// # Identity and trust
//
// A caller is, in order of precedence: the tenant a WithKeyFunc hook names; the
// tenant a verified TLS client certificate names (by default its common
// name); the tenant an API key belongs to (x-api-key, or authorization:
// Bearer); else an anonymous caller keyed by its address. Every identity
// must be known to the tenant table: a hook's unknown tenant ID, an
// unknown or malformed API key is anonymous, keyed by address, so a caller
// who makes keys up shares one bucket with itself instead of getting a
// fresh one per key. A certificate naming no known tenant (a mesh workload
// identity) passes the question on to the API key. API keys are compared by SHA-256 digest (see tenant.Digest); digests
// of known keys are cached, unknown keys never.
//
// The address is the connection's peer, with IPv4-mapped IPv6 addresses
// unmapped and IPv6 addresses aggregated to their /64 (WithAddressBits).
// x-forwarded-for, RFC 7239 forwarded (its for= parameters) and x-real-ip
// are read only when the peer is a trusted proxy (WithTrustedProxies),
// right to left, skipping trusted hops; the first untrusted address is the
// client. Headers from anyone else are
// ignored, so a client cannot pick its own bucket by spoofing them. A proxy
// that sets x-real-ip but passes the client's x-forwarded-for through
// unchanged must be paired with WithClientAddressHeader("x-real-ip").
//
// Hostile metadata never causes a rejection: an oversized, repeated, non-ASCII
// or malformed header is ignored and the caller is treated as anonymous. Of
// an oversized x-forwarded-for only the right end, where the trusted proxies
// wrote, is read; of a repeated x-real-ip, the last line (a proxy that adds
// a line adds it last). A connection without an IP address (a Unix socket, an in-memory pipe)
// makes an anonymous caller share the buckets "a:-:<rule ID>" with all such
// callers.
//
// # Rejections and what clients do with them
//
// A caller over its quota gets RESOURCE_EXHAUSTED; a caller shed by the
// overload controller, or rejected while the CPU gate sheds load, gets
// UNAVAILABLE (WithCodes changes both). The
// status carries details a client can decode with status.FromError and
// Status.Details: errdetails.ErrorInfo (reason RATE_LIMITED, OVERLOADED,
// IN_DEBT for a metered quota in debt, or LIMITER_UNAVAILABLE for a failed
// store under WithFailClosed, domain from WithDomain; a metered quota's
// rejection names its unit under the metadata key quota_unit),
// errdetails.RetryInfo with the wait until the caller's tokens return, and
// errdetails.QuotaFailure for quota rejections. An estimate header that is
// not a whole number within the burst gets INVALID_ARGUMENT, reason
// INVALID_COST_ESTIMATE and an errdetails.BadRequest naming the header.
// Messages are short and static: never a key, an address, a method or a
// store's error text.
//
// The trailer grpc-retry-pushback-ms repeats the wait in milliseconds,
// never 0, or -1 (do not retry) when the wait outlasts the call's deadline
// or WithMaxPushback. grpc-go's retry (a retryPolicy in the client's service
// config, see testdata/middleware/service_config.json) honours it only on a
// Trailers-Only response, that is when the server sent no header metadata
// before failing: the interceptors never set header metadata on a rejection,
// and must run before any interceptor that does. Waits are rounded up onto
// a fixed grid (1 ms to 1 s, 10 ms to 10 s, then seconds) so that each
// status is built once and shared: a rejection costs no proto marshalling.
//
// The tap handle sends the overload status with its details but cannot send
// metadata, so clients back off by their policy's exponential backoff.
//
// # Other transports
//
// Admit makes the interceptors' decision for a Call from any transport:
// its method, peer address, headers and verified client certificate, under
// the same tenant table, store, gate and controller. Package httplimit
// uses it to serve net/http (grpc-gateway, Connect, gRPC-Web) from the
// same Limiter as the gRPC server, so that a tenant's calls share their
// buckets whichever way they come.
//
// # Cost known after the call
//
// A method's metered quota (tenant.Meter, "metered" in the tenant config)
// counts what its calls cost in a unit of its own, tokens or bytes,
// beside the call limit. A call reserves its estimate from the metered
// bucket as it is admitted, after its call limit admitted it, and settles
// at its actual cost when its handler returns: the difference is refunded,
// never above the burst, or charged below zero, down to the quota's debt
// limit. While the bucket owes, every call under the quota is refused
// (ReasonDebt, IN_DEBT), with RetryInfo the time until the debt is repaid
// and the estimate is back. So over any window of t a tenant's calls cost
// at most burst + rate × t + debt, plus what a settle past the debt limit
// reported it could not charge (Event.Uncharged), and a refund never makes
// a token. A call the metered quota refuses keeps the call-limit token it
// took: the call was asked for, and counts against the call rate.
//
// The estimate is, in order: what the WithCostEstimate function returns
// for the request; the number the caller states in the quota's estimate
// header (x-max-tokens, say), which must be one whole number of units from
// 0 to the burst (no sign, point or exponent, so no NaN, Inf, negative or
// fraction): anything else refuses the call with INVALID_ARGUMENT before
// anything is taken, for it is the caller's bug, which a fallback would
// hide; and the config's estimate. An estimate above the burst that the
// function gives is refused as a cost above the burst is, with no retry.
//
// The handler reports what the call cost with ReportCost(ctx, n), which
// adds n to what it reported, or the WithActualCost function says it from
// the response; both add up. A call that reports nothing settles at its
// estimate, whether it returned, failed, panicked or ran out of time: the
// settle runs after the handler, panics included, with the call's values
// and without its deadline (as context.WithoutCancel). A call the overload
// controller does not run gets its estimate back. A settle that the debt
// limit cuts short reports the rest in Event.Uncharged; one the store
// fails leaves the estimate charged (Event.Err).
//
// A stream reserves its estimate as it starts, then chunks
// (tenant.Meter.Chunk) as it runs: before each message it sends, what it
// reported and what WithActualCost says the message costs must fit what it
// reserved, and before each message it receives, what it reported; else
// it reserves the chunks it needs. A chunk refused ends the stream: SendMsg
// or RecvMsg returns the rejection, with RetryInfo and pushback, without
// sending or receiving, and from then on. So a stream runs past its
// reservations only by what its handler reported after sending, and never
// past its quota by more than one such message. Only the last of its
// reservations is settled: a stream reserves more only once its reports
// pass what it reserved before, so its actual cost is never less. Package
// httplimit does the same for HTTP (Admission.Send on each Write).
//
// In dry-run mode metered quotas take from buckets of their own (their
// keys prefixed "dry:"), which mirror what enforcement would do: a call
// they refuse runs, holds nothing and is charged nothing, as enforcement
// would not have run it. The debt a dry run's overruns build stays there:
// a Limiter that enforces over the same store finds the metered buckets
// as enforcement last left them, and admits the tenant at once.
//
// # Composing with go-grpc-middleware
//
// The Limiter implements go-grpc-middleware/v2's ratelimit.Limiter
// (Limiter.Limit), so its ratelimit interceptors accept it, at the price of
// their fixed RESOURCE_EXHAUSTED status without details. Limiter.Selector
// returns a selector.Matcher that matches every method but the exemptions,
// to wrap other interceptors. Place UnaryServerInterceptor after recovery
// and logging (so that rejections are logged) but before anything that
// sends or sets header metadata.
//
// # Exemptions
//
// gRPC health checks, server reflection and ORCA load reports are exempt by
// default (WithExemptions): limiting them would make an
// overloaded server look dead to its load balancer. Exempt calls take no
// tokens and their contexts carry no Decision.
//
// # Dry run
//
// WithDryRun makes the Limiter decide, take tokens, count and report as
// usual, but admit every call: the Decision and the Event say what
// would have been rejected. Roll out a new quota in dry run first.
// Metered quotas keep buckets of their own in dry run (see Cost known
// after the call), so that enforcement never inherits a dry run's debt.
//
// # Observing
//
// WithObserver reports each decision as an Event, the one record of it:
// its Decision (reason, tenant, tier, subject, the store's answers), the
// method, the store's deciding source (memory, Redis, deny cache, lease,
// fallback or a failure policy), and the Rejection the caller was sent.
// The tap handle's rejections and exempt calls are events too; so is a
// metered call's end, of ReasonSettled, with the cost it settled at: sum
// Event.Settled by tenant to rank tenants by what they cost as well as by
// their calls. Method, tier and source are bounded sets; an adapter that
// labels by tenant must cap its labels, and the subject holds an address:
// promfloodgate and otelfloodgate count from these events alone.
//
// # Outbound
//
// Calls to an upstream that limits its callers are the client's side:
// package throttle's Quota keeps them within the upstream's quota.
//
// The floodgatetest package drives a real interceptor chain over an
// in-memory connection with a fake clock and scripted CPU readings, to test
// a quota config in go test.
package middleware
