// Package share divides a rate among subscribers by their demand: the pure
// arithmetic behind floodgate's RLQS server, with no I/O and no state beyond
// an [EWMA] per subscriber.
//
// # The model
//
// A global limit, less what the caller holds back (a reserve for newcomers,
// leases of subscribers that are gone, debt), is a capacity c in tokens per
// second. Each round the caller smooths every subscriber's measured demand
// with its [EWMA], divides c with [Divide], turns the rates into whole tokens
// per fill interval with [Quantize], and re-sends only the assignments that
// [Changed] reports, so that noise does not refill Envoy's token buckets. A
// subscriber seen for the first time gets [Newcomer]'s rate until the next
// round.
//
// [Divide] keeps every share a float and its sum within c up to rounding;
// [Quantize] is where the bound becomes exact, in whole tokens.
//
// # Invalid input
//
// The functions take rates that the caller measured or configured, so a
// negative, NaN or infinite argument is a bug in the caller: they panic with
// a message prefixed "share:", as they do when slice lengths differ. None of
// them allocates.
//
// # Concurrency and the zero value
//
// The functions are safe for concurrent use on distinct slices. An [EWMA] is a
// plain value, not safe for concurrent use; its zero value is ready, with the
// default weights.
package share
