// Package floodgate is the shared vocabulary of the floodgate rate limiter:
// a [Limit] (a token rate and a burst), the [Result] of one decision, and the
// [Store] interface that every bucket store implements.
//
// The packages below this one do the work:
//
//   - keyed: an in-memory, sharded, capacity-bounded map of token buckets,
//     one per client key;
//   - cpugate: a container-aware CPU gate that scales every limit down while
//     the process is saturated and restores it after a cooldown;
//   - tenant: tenants, tiers and per-method quotas from a validated config;
//   - overload: the overload controller that finds the server's capacity
//     from how long calls queue and sheds the tenants over their fair share
//     first;
//   - middleware: gRPC interceptors and a tap handle built on the above, and
//     Limiter.Admit, the same decision for any transport;
//   - httplimit: that decision as net/http middleware (grpc-gateway,
//     Connect, gRPC-Web);
//   - loadreport: ORCA load reports from the overload controller, so that
//     grpc-go's weighted_round_robin balances a fleet by each replica's
//     capacity;
//   - throttle: client-side adaptive throttling and a retry budget, as gRPC
//     client interceptors;
//   - remote: the vocabulary of stores that call a server (error kinds,
//     breaker states), for their observers;
//   - redisstore (a module of its own): a Redis-backed Store for limits
//     shared by many instances;
//   - promfloodgate (a module of its own): Prometheus metrics, a summary of
//     the callers rejected most often and rate-limited rejection logs;
//   - otelfloodgate (a module of its own): the same metrics through
//     OpenTelemetry, and span events on rejected and waiting calls;
//   - floodgatetest: a harness that runs a quota config through the real
//     gRPC path with a simulated clock and a scripted CPU gate.
//
// # The model
//
// A token bucket holds up to Burst tokens and gains Rate tokens per second.
// Taking n tokens succeeds when the bucket holds at least n; otherwise the
// call is rejected and nothing is taken. A full bucket therefore admits a
// burst of Burst events at once and Rate events per second after that.
//
// The limit travels with every call: a store keeps only each bucket's state
// (tokens and the time they were counted), never its limit. A configuration
// reload or a change of the CPU gate's scale applies at the next call, with no
// sweep over buckets. Lowering a limit caps a fuller bucket at the new burst at
// once; raising it refills the bucket at the new rate, a natural ramp.
//
// # Options
//
// Every package is configured by functional options, which one convention
// governs: options only record, the constructor validates and returns an
// error wrapping [ErrInvalidOption] that names the option, a nil option is
// skipped, and a repeated option replaces the earlier one unless its doc
// says it adds. [ErrInvalidOption] states it in full.
//
// # Cost known after the call
//
// A [Reserver] (keyed.Map, redisstore.Store) serves quotas whose cost is
// known only once the call is done: ReserveN takes the call's estimate as
// TakeN would, and the [Reservation] it returns settles once with the actual
// cost, refunding what was not used (never above the burst) or charging the
// overrun. An overrun may take the bucket below zero, down to the limit's
// debt limit ([Limit].Debt, one burst by default); while the bucket owes
// tokens every take is refused until refill repays them, and the part of a
// charge beyond the debt limit is not charged and is reported
// ([DebtLimitError]). Debt is bucket state like any other: it survives a
// limit change and the keyed store's evictions. A reservation never settled
// keeps its estimate charged, which errs toward the limit.
//
// # Zero values
//
// The zero [Limit] admits nothing. [Inf] admits everything and keeps no state.
// The zero [Result] is a rejection with no retry hint.
package floodgate
