// Package httplimit admits net/http requests through a middleware.Limiter:
// the same tenants, per-method rules, buckets, CPU gate and overload
// controller as the gRPC interceptors, for services also served as
// JSON/HTTP (grpc-gateway), through Connect or gRPC-Web, or next to plain
// handlers. A tenant's HTTP and gRPC calls take from the same buckets.
//
//	lim, err := middleware.New(store, reg, middleware.WithOverload(ctrl),
//		middleware.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))
//	hl, err := httplimit.New(lim)
//	err = http.ListenAndServe(addr, hl.Handle(mux))
//
// # Identity
//
// A request's caller is found as a gRPC call's is (see package
// middleware): a WithKeyFunc hook, given the request's context; the tenant a
// verified TLS client certificate names (http.Request.TLS); an API key in
// X-Api-Key or Authorization: Bearer; else the client's address. The
// address is the connection's peer (http.Request.RemoteAddr), or, when the
// peer is one of the Limiter's trusted proxies (WithTrustedProxies), the
// client X-Forwarded-For, Forwarded (RFC 7239, for=) or X-Real-IP names;
// these headers from any other peer are ignored. A malformed, oversized,
// repeated or non-ASCII header never rejects a request: it is ignored, and
// the caller is anonymous, keyed by its address.
//
// # Methods
//
// The tenant rules and exemptions match the request's path by default.
// Connect, gRPC-Web and gRPC (grpc.Server's ServeHTTP) put the method in
// the path, "/pkg.Svc/Method", so one tenant file serves both transports,
// and health checks stay exempt. WithMethod names the method of other
// routes: grpc-gateway's, mapped to the gRPC methods they call. The name
// is also the method of the Limiter's Events: where paths carry IDs
// ("/v1/items/42"), name a bounded set of methods for the observers'
// sake.
//
// # Rejections
//
// The answer follows the middleware.Rejection's Reason, not its gRPC
// code (middleware.WithCodes): a request over its quota, or whose metered
// quota is in debt, gets 429 Too Many Requests; one whose estimate header
// is invalid, 400 Bad Request; one refused by the CPU gate, shed by the
// overload controller, or refused because the store failed
// (middleware.WithFailClosed), 503 Service Unavailable. Retry-After is the
// Rejection's RetryAfter in whole seconds, rounded up, absent when it
// states no wait (a failed store). A request whose context ended while it
// waited for a slot gets 503 and its context's status, without
// Retry-After. Each comes with a body in the protocol the client speaks:
//
//   - gRPC and gRPC-Web (Content-Type application/grpc…): a Trailers-Only
//     response, a 200 without a body whose headers hold grpc-status,
//     grpc-message and grpc-status-details-bin, as grpc-go's server sends
//     it, so that grpc.Server.ServeHTTP behind the middleware rejects as the
//     interceptors would. There is no pushback trailer: the middleware
//     does not see the call's deadline, and clients retry by their policy's
//     backoff.
//   - Connect unary calls (a Connect-Protocol-Version header, or a GET with
//     connect=v1): Connect's error JSON,
//     {"code":"resource_exhausted","message":"rate limit exceeded","details":[{"type":"google.rpc.RetryInfo","value":"…"}]}.
//   - Connect streams (Content-Type application/connect+…): a 200 whose
//     body is the end-of-stream message holding that error.
//   - Anything else: the google.rpc.Status as JSON, as grpc-gateway writes
//     errors: {"code":8,"message":"rate limit exceeded","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo",…}]}.
//
// The details are the interceptors' (ErrorInfo, RetryInfo, QuotaFailure;
// see middleware.WithDetails). Each body is built once per Rejection, which
// the Limiter shares (one per reason and retry delay on its grid), and
// kept for the 1024 used last.
//
// # Cost known after the call
//
// A request to a method with a metered quota (tenant.Meter) reserves its
// estimate as it is admitted: the middleware.WithCostEstimate function's,
// which gets the *http.Request, else the quota's estimate header's, else
// the config's. Its handler reports what it cost with
// middleware.ReportCost(r.Context(), n), or the middleware.WithActualCost
// function says it from each Write's bytes; the request settles when the
// handler returns, panics included, at what was reported, or at its
// estimate when nothing was. Each Write of a streamed response is covered
// by the request's reservations first: when they run out, the Write
// reserves the next chunk, and when that is refused it writes nothing and
// returns the rejection, a *middleware.Rejection (status.FromError reads
// its status too), or its context's status when the client went away,
// which the handler should end on. A Write longer than the quota's burst
// (an io.Copy's 32 KiB against a smaller burst), which no reservation
// could cover, is covered a chunk at a time (tenant.Meter.Chunk, as the
// request was admitted): it writes the chunks its reservations cover,
// returns how many bytes that was with the error, and the WithActualCost
// function sees each chunk rather than the whole Write. When no header or
// byte of the response has gone out yet (no WriteHeader, Write or Flush
// before), the client gets the rejection as if the request had been
// refused as it came (see Rejections: 429 for the quota or a debt, 503
// under the CPU gate or for a failed store), without RateLimit fields
// beyond those set at admission, the handler's Content-Length and
// Content-Encoding dropped; the handler's later WriteHeader calls do
// nothing and its Writes return the same error. Once the response has
// begun, the client sees it cut short. A request refused for debt as it
// comes gets 429, like one over its quota; one whose estimate header is no
// whole number within the burst gets 400 and no RateLimit fields. The
// RateLimit fields describe the call limit only.
//
// The handler of a metered request writes to a ResponseWriter of the
// middleware's: an http.Flusher (a Flush begins the response), whose
// Unwrap lets http.ResponseController reach the server's for deadlines,
// full duplex and hijacking. It is neither an io.ReaderFrom, so that
// every byte passes Write and its reservations (an io.Copy from a file
// copies rather than sends the file), nor an http.Hijacker: what a
// handler writes to a connection it hijacked (ResponseController.Hijack)
// is not covered, and what it reported is settled as for any request.
//
// # Browsers
//
// A gRPC-Web or Connect client in a browser reads a response only when
// CORS lets it. WithCORS names the origins allowed: a rejection to a
// request from one carries Access-Control-Allow-Origin and exposes the
// gRPC status, Retry-After and RateLimit fields (the handler the
// Middleware kept the request from would have set them), and CORS
// preflights pass to the wrapped handler unlimited.
//
// # RateLimit fields
//
// Responses, admitted or rejected, carry the RateLimit-Policy and
// RateLimit fields of draft-ietf-httpapi-ratelimit-headers-10 for the
// bucket the request took from, counted in requests of the method's cost:
//
//	RateLimit-Policy: "default";q=100;w=10
//	RateLimit: "default";r=37;t=7
//
// The policy is named by the rule's method pattern ("default",
// "/pkg.Svc/*", …). q is the bucket's burst, the most requests a full
// bucket admits at once, and w the seconds it takes to refill from empty
// (burst ÷ rate, rounded up), both of the rule's limit as configured, so
// the policy stays the same from response to response. r is the requests
// left in the bucket, and t the seconds until it is full again, both under
// the limit in force (scaled down while a CPU gate sheds). A token bucket
// has no window that resets: t says when the whole quota is back,
// Retry-After when the next request may pass. WithRateLimitHeaders(false)
// leaves the fields out.
//
// # Order and concurrency
//
// An admitted request holds its overload controller slot
// (middleware.WithOverload) until the wrapped handler returns, panics
// included. Put the middleware after recovery and logging and before the
// handlers that do the work. A Middleware is safe for concurrent use and
// starts no goroutine; the zero Middleware is not usable.
package httplimit
