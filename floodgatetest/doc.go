// Package floodgatetest lets a test check that a quota config does what its
// author means, through the real gRPC path: a Harness serves the methods you
// name behind a middleware.Limiter, over an in-memory connection, with a
// simulated clock and a scripted CPU gate.
//
// # The model
//
// Callers are simulated clients: a tenant presenting an API key, or an
// anonymous address. Every call is a real gRPC call through the Limiter's
// interceptor and tap handle, so identity, rules, costs, scaling and
// rejection codes are the ones production sees; only the handler is a stub
// that always succeeds. Addresses travel in x-forwarded-for from a trusted
// proxy address that the harness adds to the Limiter's options.
//
// Time moves only when the test says: Advance, or Run, which simulates
// steady loads over a span of time in fixed steps. The store, the Limiter
// and the CPU gate all read the harness's clock, so results are exact and
// repeatable: a test can assert counts, not rates. CPU is scripted with
// SetCPU; the gate takes a reading at each SetCPU and at each step of Run,
// as its own loop would.
//
// # Limits
//
// The client never retries, so counts are attempts. Calls are made one at a
// time: the harness checks what a config admits, not how the server
// performs. Only unary methods are served.
package floodgatetest
