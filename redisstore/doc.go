// Package redisstore is a [floodgate.Store] whose token buckets live on
// Redis, so that one limit holds across every process that shares the Redis:
// a fleet of gRPC servers enforcing a tenant's quota, or workers pushing
// notifications to a provider that throttles above its rate.
//
// A [Store] decides each take with one atomic Lua script and the semantics
// of the in-memory keyed store (both reproduce testdata/vectors/bucket.json).
// When Redis is slow or down, a failure policy decides instead, and every
// [floodgate.Result] says which source decided.
//
// # Key layout and Cluster
//
// Each bucket is one key, <prefix>:{<subject>}:<name>, where the subject is
// the key given to TakeN (at most [MaxKeyLen] bytes, 1 KiB) with '%', '{'
// and '}' escaped (%25, %7B, %7D). The braces make the subject the key's
// hash tag: every call touches one key in one slot, so the store works on
// Redis Cluster without CROSSSLOT errors, and a subject cannot choose its
// slot by holding braces. The prefix ("floodgate"
// by default, [WithPrefix]) and the name ("b", [WithName]) tell stores apart
// that share a Redis. The store accepts a *redis.Client, *redis.ClusterClient
// or *redis.Ring; on a Cluster, a failed call also triggers a topology reload
// (at most once a second).
//
// # The script
//
// The script keeps each bucket as its tokens and the time they were counted,
// in integer micro-tokens and microseconds (held exactly by Lua's doubles up
// to floodgate.MaxBurst). It refills lazily and rounds down, caps a bucket at
// the current burst, and never moves a bucket's time backwards. It writes
// only when tokens are taken (or refunded, or leased), with SET … PX and a
// TTL of the time until the bucket is full again plus 10 s, during which a
// store that decided on the bucket can tell a lost bucket from a full one
// (docs/stores.md); an expired key and a full bucket mean the same thing,
// and no key is left without an expiry.
// Buckets that refill slower than one burst per 400 days (rate 0 included)
// forget their state after 400 days. A rejected take writes nothing.
//
// The store runs the script with EVALSHA and falls back to EVAL when the
// server answers NOSCRIPT (after SCRIPT FLUSH, a restart or a failover), in
// pipelines too; no decision fails on a flushed script cache.
//
// # Time source
//
// By default the script reads Redis TIME, so that every client shares one
// clock. [WithClientClock] sends the time of a [floodgate.Clock] instead,
// for servers or proxies that refuse TIME in scripts and for tests with a
// controlled clock, which then times the deny cache and leases too. A
// client whose clock runs behind cannot move a bucket back; it only refills
// less. In that mode TTLs carry 1 s of slack, so that a key does not expire
// on Redis's clock before its bucket is full on the clients'.
//
// # Failure policy and breaker
//
// Each decision has a deadline (50 ms by default, [WithDeadline]); Redis
// gets the deadline less a small reserve. When a call fails or misses it,
// the policy decides ([WithFailurePolicy]):
//
//   - [Local] (the default): an in-process keyed bucket at the limit divided
//     by the number of instances sharing it, which the stores count on
//     Redis (at least [WithLocalDivisor]), emptied when Redis goes away,
//     so that it goes on at its part of the rate; Source is
//     floodgate.SourceFallback;
//   - [Open]: admit, floodgate.SourceFailOpen;
//   - [Closed]: reject with a retry hint, floodgate.SourceFailClosed.
//
// A circuit breaker ([WithBreaker]) opens after consecutive failures (5 by
// default); while it is open, decisions skip Redis and go to the policy at
// once. After a wait (an eighth of the 500 ms cooldown, doubling up to it
// while probes fail) a probe of the store's own, which holds no caller up
// and waits for Redis for at least 1 s, checks Redis: its success closes
// the breaker.
//
// Three slow things are not Redis failing, and are kept apart:
//
//   - A caller whose context ends first (its deadline earlier than the
//     store's, or a cancellation) gets the context's error from TakeN,
//     never a decision of the failure policy, and the call counts for
//     nothing in the breaker and in [Stats].Errors.
//   - A process starved of CPU reads answers late. While its runnable
//     goroutines wait to run for a quarter of the deadline or more (the
//     runtime's /sched/latencies:seconds), calls wait for Redis longer, by
//     twice that delay (at most 1 s), and decisions made without Redis
//     yield the processor, so that goroutines woken by the network run
//     soon; a call that misses even the longer wait is counted in
//     [Stats].Starved, not held against Redis, refused under Local as
//     under Closed (a local bucket beside a working Redis would
//     over-admit), and checked by a probe that opens the breaker if Redis
//     does not answer it either.
//   - Redis answering for a key that holds something other than a bucket
//     fails that decision only.
//
// go-redis honours the store's deadline only on a client made with
// ContextTimeoutEnabled: true; give it MaxRetries: -1 too, so that a failed
// call falls back at once instead of retrying. With ContextTimeoutEnabled
// false the store still returns by the deadline, by running each call on a
// goroutine of its own, which costs more. go-redis stops dialing a server
// after PoolSize failed dials and retries once a second: after an outage
// long enough for that, recovery can take up to that second more.
//
// TakeN (and ReserveN) returns an error only for a negative n, an invalid limit, n above
// a positive burst (wrapping floodgate.ErrExceedsBurst, as every store
// does), a key longer than [MaxKeyLen] (1 KiB: [floodgate.ErrKeyTooLong]) or an ended
// context, never for Redis's trouble; Peek, Refund, SettleN and Reset
// return errors wrapping [ErrUnavailable], whose text never includes Redis's (use
// [WithOnError] to log the causes).
//
// # Batching, deny cache and leases
//
// [WithBatching] coalesces concurrent decisions: decisions queued while a
// round trip is on the wire go together in the next one, as one script call
// on a standalone server or per Cluster slot, pipelined otherwise. Each
// decision is still applied on its own and in order, so accounting is
// exact; only latency changes. Under concurrency it multiplies throughput.
//
// [WithDenyCache] remembers the buckets Redis denied most recently, up to a
// given number, with the tokens Redis counted and the time the request was
// sent. Until the denied request's retry-after, a request that cannot fit
// under that count plus the refill since is denied locally
// (floodgate.SourceCache). A cached denial is one Redis would also give,
// except that a Refund, a Reset, a lease given back or a raised limit
// elsewhere is seen only when the entry expires. The cache only ever
// denies, so it never admits more than Redis would.
//
// [WithLeases] is the one way a store decides without a round trip: on
// tokens Redis leased to it. A lease is taken by the script, from the
// bucket, and recorded with it; the bucket refills only up to its burst
// less what is leased out, so the bucket and its leases together never
// hold more than the burst, and leases change the bound below by nothing.
// A key decided on more than once here leases, with the round trip it
// makes anyway, what this store's own demand on it asks for in a quarter
// of the lease time (at most an eighth of the burst; at least half of that,
// or none when the bucket holds less), spends it here
// (floodgate.SourceLease) for half the lease time after it asked, and
// gives back what is left with the key's next round trip within the lease
// time, under a new limit, or at [Store.Close]. A key whose requests all
// reach one instance gets its whole limit. A lease its store no longer
// knows of (the process died, the entry was evicted) is lost: Redis counts
// it out until it expires. Keys seen once in a while lease nothing: each
// of their decisions is a round trip, batched.
//
// # The bound
//
// Over any window of length t, all instances together admit at most
// burst + rate×t tokens of a bucket (plus the debt limit for settled
// reservations), at a fleet's start, as instances join, leave, crash or
// stop, and across limit changes; docs/stores.md states it with the
// failure policy's and what a restarted or flushed Redis adds.
//
// # Reservations
//
// A [Store] is a [floodgate.Reserver], for quotas whose cost is known only
// after the call. [Store.ReserveN] takes the call's estimate as TakeN does;
// the [floodgate.Reservation] settles the actual cost with [Store.SettleN].
// Each is one script call (one round trip, or one decision of a batch) on
// the bucket's one key, so atomic and safe on a Cluster. The script's
// settle mode refunds, never above the burst, or charges whatever the
// bucket holds, below zero down to the limit's debt limit (one burst by
// default) in whole tokens; what does not fit is not charged and is
// reported in a [*floodgate.DebtLimitError]. A bucket below zero refuses
// every take (Result.Owed says what it owes) and keeps its key until it is
// full again, so its debt outlives limit changes and holds in every
// process. A process that dies holding reservations leaves their estimates
// charged: that errs toward the limit, never over it. No settle goes to the
// failure policy (see [Store.SettleN] for one Redis cannot apply); a
// reservation the [Local] fallback decided settles on the fallback.
//
// Batching and leases add nothing to the bound: each decision is applied
// alone and in order, and a leased token is a token taken. A process's
// leased tokens are spent for up to half the lease time after the bucket
// went into debt elsewhere (the process that settled into debt drops its
// own): they were taken before the debt.
//
// # Observability
//
// [Store.Stats] counts decisions by source, failed calls and breaker trips.
// [WithObserver] sets an [Observer] that sees each round trip to Redis (its
// duration and the [remote.ErrorKind] of its error: a batch is one round trip), each
// breaker transition and each decision Redis did not make, by source;
// promfloodgate.RedisMetrics turns them into Prometheus metrics. No event
// carries a key. [WithLogger] logs breaker transitions, one line each, never
// one per decision. [KindOf] classifies any error the store reports, for
// [WithOnError] too. Without an observer the store reads no extra clock and
// allocates nothing for observation.
//
// # Concurrency and zero value
//
// A Store is safe for concurrent use and must be made with [New]; the zero
// Store is not usable. [Store.Close] gives back its leases' unspent
// tokens; a store without leases needs none. It starts no goroutine of its
// own beyond short-lived ones: those serving in-flight batched (or
// guarded) calls; probes, at most two at a time (the breaker's, and one
// checking a starved timeout), each ending within its budget; and at most
// once a second the registration that counts instances for the [Local]
// policy, ending within the deadline.
package redisstore
