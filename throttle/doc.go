// Package throttle keeps gRPC clients from undoing a server's load
// shedding with retry storms: client-side adaptive throttling, as the
// Google SRE book describes it ("Handling Overload"), and a retry budget;
// and it keeps a client's calls within an upstream's published quota.
//
// When a server sheds load, every rejection still costs it a little, and
// clients that retry at once turn one rejected call into several. An
// [Adaptive] throttle, one per backend, counts over a sliding window the
// calls the application made and the calls the backend accepted, and
// drops a new call on the client, before it reaches the network, with
// probability max(0, (requests − K·accepts)/(requests + 1)). A healthy
// backend sees every call; an overloaded one sees about K times what it
// can accept, and the rest fail at once with [ErrThrottled]. A [Budget]
// caps retries at a share of the requests, so that retries cannot multiply
// the load either.
//
// [Throttle] joins both as unary and stream client interceptors:
//
//	th, err := throttle.New(throttle.WithRetries(3))
//	conn, err := grpc.NewClient(target,
//		grpc.WithChainUnaryInterceptor(th.UnaryClientInterceptor()),
//		grpc.WithChainStreamInterceptor(th.StreamClientInterceptor()))
//
// The retries wait for the delay in the rejection's RetryInfo, which
// floodgate's server interceptors send, so a client comes back when the
// server said it could be served.
//
// # The model
//
// Both windows count in 16 buckets: counts leave a window one sixteenth of
// it at a time. K = 2 (the default) lets a client keep sending twice what
// the backend accepts: enough for the throttle to notice when the backend
// recovers, at the price of the backend rejecting about as many calls as it
// serves. A smaller K protects the backend more and notices recovery later.
//
// # Upstream quotas
//
// A [Quota] keeps calls to an upstream that limits its callers (a push
// provider, a paid API) within the limit it publishes: its interceptors
// take tokens from any [floodgate.Store] before each call, waiting for
// them within the call's deadline or, with WithQuotaFailFast, failing at
// once, and never send a call the upstream would reject:
//
//	q, err := throttle.NewQuota(store, floodgate.PerSecond(100, 10), throttle.WithQuotaKey("fcm:project-42"))
//	conn, err := grpc.NewClient(target,
//		grpc.WithChainUnaryInterceptor(q.UnaryClientInterceptor()))
//
// With a shared store (redisstore), a fleet of workers stays within one
// quota together. A call refused on the client fails with
// [ErrQuotaExceeded] or [ErrQuotaCost] (ResourceExhausted), or
// [ErrQuotaStore] (Unavailable) when the store cannot decide. With a
// Throttle on the same connection, put the Throttle first (outermost), so
// that a call it drops spends no token.
//
// # Concurrency and zero values
//
// Every type is safe for concurrent use. Use the constructors; the zero
// values are not ready.
package throttle
