// Package middleware admits gRPC calls per tenant and sheds load under
// overload: a Limiter with unary and stream server interceptors, a tap
// handle for the cheapest early rejection, and client interceptors that keep
// calls to a rate-limited upstream within its quota.
//
// # The request path
//
// A call meets the Limiter twice at most:
//
//	conn reader ─► TapHandle: constant work, no I/O; counts the call into
//	               the overload controller (Enter). Exempt method? Server
//	               full and the caller at its fair share (WithGate: gate shedding and
//	               the caller inside a retry delay the interceptor gave
//	               it)? → reject before the body is read.
//	handler g. ─►  interceptor: identity ─► tenant and method rule ─►
//	               store.TakeN(key, limit (× gate scale), cost) ─►
//	               controller.Acquire(the tenant's flow) (WithOverload)
//	               admitted → handler, with the Decision in the context
//	               rejected → status and trailer; the handler never runs
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
// call allocates one object: its context, which carries the Decision.
// A rejected call allocates nothing: each caller's bucket key, per rule,
// is kept in a bounded LRU cache (golang-lru), by tenant or, for anonymous
// callers, by address prefix, and rejection statuses are built once per
// retry delay and shared.
//
// # Identity and trust
//
// A caller is, in order of precedence: the tenant a KeyFunc names; the
// tenant a verified TLS client certificate names (by default its common
// name); the tenant an API key belongs to (x-api-key, or authorization:
// Bearer); else an anonymous caller keyed by its address. Every identity
// must be known to the tenant table: a KeyFunc's unknown tenant ID, an
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
// Status.Details: errdetails.ErrorInfo (reason RATE_LIMITED, OVERLOADED, or
// LIMITER_UNAVAILABLE for a failed store under WithFailClosed,
// domain from WithDomain), errdetails.RetryInfo with the wait until the
// caller's tokens return, and errdetails.QuotaFailure for quota rejections.
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
// default (DefaultExemptions, WithExemptions): limiting them would make an
// overloaded server look dead to its load balancer. Exempt calls take no
// tokens and their contexts carry no Decision.
//
// # Dry run
//
// WithDryRun makes the Limiter decide, take tokens, count and report as
// usual, but admit every call: the Decision, the Event and Stats say what
// would have been rejected. Roll out a new quota in dry run first.
//
// # Observing
//
// Stats counts decisions by reason, in counters that only grow (Stats says
// how they add up); WithObserver reports each decision as
// an Event: its reason, method, tier, tenant and the store's deciding
// source (memory, Redis, deny cache, lease, fallback or a failure policy),
// never a key or an address. Method, tier and source are bounded sets; a
// metrics adapter that labels by tenant must cap its labels, as
// promfloodgate does.
//
// # Outbound
//
// UnaryClientInterceptor and StreamClientInterceptor take tokens from any
// floodgate.Store before calling an upstream that limits its callers: they
// wait, bounded by the call's context, or fail fast, and never send a call
// that would be rejected. With a shared store (redisstore), a fleet of
// workers stays within one quota together.
//
// The floodgatetest package drives a real interceptor chain over an
// in-memory connection with a fake clock and scripted CPU readings, to test
// a quota config in go test.
package middleware
