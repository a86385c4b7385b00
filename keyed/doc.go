// Package keyed is an in-memory store of token buckets, one per key (a
// client IP, an API key, a tenant, a route), for a bounded number of keys.
// [Map] implements [floodgate.Store].
//
// # The model
//
// Each key has a token bucket: it starts full, holds at most the limit's
// burst and refills at the limit's rate, lazily, from the time elapsed since
// its last take. The limit travels with every call and is not stored, so a
// new limit (a config reload, the CPU gate's scale) applies at the next take:
// a lowered limit caps a fuller bucket at once, a raised one refills it
// gradually. Tokens are fixed-point integers in units of 1e-9 token, so
// concurrent takes are exact: over any window the admitted count never
// exceeds burst + rate·elapsed, and refill rounds down, never up.
//
// # Storage and memory
//
// The Map is split into a power-of-two number of shards chosen by the key's
// seeded hash (hash/maphash). A shard is a compact open-addressing table
// whose 32-byte slots hold 62 bits of the key's hash, a lock bit and the
// bucket state (24 bytes: tokens, last take, time it is full again), so a
// take on a known key costs one hash, one compare-and-swap on its slot and
// about one cache miss, and allocates nothing. No key bytes are stored; see
// [Map] for the collision bound.
//
// The capacity bounds the keys tracked across all shards, whichever shards
// they fall in. When a new key arrives at capacity, its shard evicts a bucket
// (or, if the shard holds less than its share of the capacity, another shard
// does) that has refilled, preferring one not used since the eviction scan
// last passed (CLOCK, a cheap approximation of least-recently-used). Evicting
// a full bucket changes no decision: the key would start full anyway. A
// bucket that has not refilled is never evicted under the default [Protect]
// policy, so a flood of made-up keys cannot hand a drained client a fresh
// burst; such new keys share their shard's overflow bucket instead, and
// [Stats].Overflowed tells the operator to raise the capacity. [Evict] trades
// that guarantee for a bucket per key, but never evicts a bucket that owes
// tokens: that would forgive its debt. "Full" means full under the last limit
// that took from the bucket (or refused it while it owed): one drained while
// the CPU gate cut limits counts as full sooner than under the restored limit.
//
// # Reservations and debt
//
// [Map] is a [floodgate.Reserver]: [Map.ReserveN] takes a call's estimated
// cost as TakeN does, and the [floodgate.Reservation] settles once with the
// actual cost ([Map.SettleN]), refunding the difference, never above the
// burst, or charging it. A charge may take the bucket below zero, down to
// the limit's [floodgate.Limit.DebtLimit] (one burst by default), in whole
// tokens; what does not fit is not charged and is reported in a
// [*floodgate.DebtLimitError]. A bucket below zero refuses every take, with
// RetryAfter the time until it holds the tokens asked for, and reports what
// it owes in Result.Owed. The debt is the bucket's own negative tokens, the
// same fixed-point integers as the WaitN reservations it shares them with:
// it is kept across limit changes (the limit travels with each call), no
// eviction drops it, and only [Map.Reset] forgives it. Reservation and
// settle are each one locked update of the key's slot, exact under
// concurrency, and allocate nothing. A refund to a key the Map no longer
// tracks, or one whose reservation its shard's overflow bucket decided, is
// dropped: the estimate stays charged, which errs toward the limit.
//
// # Time
//
// [Map.TakeN] reads the clock once, as a monotonic offset from the Map's
// creation (cheaper than time.Now). [Map.TakeAt] takes the time from the
// caller. A time earlier than a bucket's last take counts as that take's
// time, so concurrent callers that read the clock before taking the lock
// never move a bucket backwards. [WithClock] substitutes any
// [floodgate.Clock], such as a test's fake one.
//
// # Concurrency
//
// All methods are safe for concurrent use, and each take on a key is atomic:
// concurrent takes on one key are decided one after the other. A take on a
// tracked key locks only that key's slot, with a bit set by
// compare-and-swap, so takes on different keys from different cores share
// no written memory; new keys, evictions and resets also take their shard's
// mutex. The locking is sync/atomic throughout, so what the race detector
// checks is the code that runs. Eviction callbacks run after the shard's
// mutex is released. Nothing runs in the background: idle buckets cost only
// their slot until evicted or reset.
//
// # Zero values
//
// The zero Map is not usable: build one with [New], whose options all have
// defaults. The zero [floodgate.Limit] admits nothing by design: its takes
// are refused without an error, and [Map.WaitN] returns
// [floodgate.ErrWouldExceedDeadline].
//
// # Edge cases
//
// A take of 0 tokens reports the bucket without changing it; a reservation
// of 0 tokens is refused while the bucket owes tokens. [Map.TakeN],
// [Map.TakeAt] and [Map.WaitN] reject a negative n with
// [floodgate.ErrNegativeN], and an invalid limit. A take of more than the
// burst is refused with RetryAfter [floodgate.Never], creates nothing, and
// returns [floodgate.ErrExceedsBurst], as every [floodgate.Store] does,
// except under the zero Limit. [floodgate.Inf] admits everything and keeps
// no state. The empty key is an ordinary key, and keys may be of any length:
// only a hash of each is stored.
package keyed
