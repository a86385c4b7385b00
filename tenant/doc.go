// Package tenant maps callers to per-method quotas: tenants, tiers and an
// anonymous policy, declared in a strictly validated YAML or JSON config,
// compiled into an immutable [Table] whose lookups do not allocate, and held
// by a [Registry] that reloads the config when it changes.
//
// The package decides which limit applies to a call; it keeps no bucket
// state. A [floodgate.Store] holds the buckets and the limit travels with
// each take, so a reload applies at the next call and buckets keep their
// tokens across reloads. The package never imports gRPC: it sees a method
// as the string grpc-go calls FullMethod.
//
// # Model
//
// A tier is a service level: a default limit, per-method limits and
// per-method costs. A tenant is a known caller: an ID, a tier, the SHA-256
// digests of its API keys, and optionally its own default limit and
// per-method entries that override its tier. The anonymous policy has the
// shape of a tenant without keys and applies to every caller without a
// known identity; the caller (the middleware) keys its buckets by client
// address, so anonymous callers get one bucket per address and rule.
//
// Method entries are keyed by pattern: "/pkg.Svc/Method" (one method),
// "/pkg.Svc/*" (every method of a service) or "*" (every method). Each
// pattern that sets a limit is one bucket: "/pkg.Svc/*" limits the service
// as a whole, not each of its methods, and a default limit is one bucket
// for every method nothing more specific limits.
//
// A limit is rate tokens per period (per, one second by default) with a
// bucket of burst tokens; rate may be "inf" for no limit. A call takes cost
// tokens, 1 unless an entry says otherwise; an entry may set a cost alone
// and keep the bucket it would otherwise use.
//
// # Precedence
//
// The limit for a call to a method comes from the first of these that sets
// a limit:
//
//  1. the tenant's entry for the method, then for its service's wildcard,
//     then for "*";
//  2. the tenant's default;
//  3. the tier's entry for the method, then for its service's wildcard,
//     then for "*";
//  4. the tier's default.
//
// So a tenant default shadows all of its tier's per-method limits: a
// custom contract replaces the tier's limits rather than merging with
// them. The cost comes from the first entry in the same order (1, then 3)
// that sets a cost, else 1; defaults have no cost. Within one level,
// default and a "*" limit would say the same thing, so setting both is an
// error. Every method has a rule: validation makes sure each tier, tenant
// and the anonymous policy reach a limit for any method.
//
// [Rule.ID] names a rule's bucket within its tenant. It derives from the
// pattern that supplied the limit, so it is stable across reloads and tier
// changes, and methods share a bucket exactly when their limits come from
// the same pattern.
//
// # Config format
//
// A config is YAML, or JSON when its name ends in ".json" (the same
// structure). Decoding is strict: unknown fields, duplicate keys, values of
// the wrong type, YAML aliases and multiple documents are errors, and so is
// any limit that [floodgate.Limit.Validate] rejects, a cost ≥ 1 that
// exceeds the burst of a limit it meets, a tier reference to a tier that
// does not exist, and a tenant or tier without a limit for some method.
// All problems are reported at once, in a [*ConfigError] whose entries read
// like
//
//	tenants.yaml:14: tiers.free.methods["/x.Y/Z"].rate: must be > 0
//
// A full example, abridged from testdata/tenant/valid/tenants.yaml in the
// repository:
//
//	tiers:
//	  free:
//	    default: {rate: 10, burst: 20}                        # 10/s, bursts of 20
//	    methods:
//	      "/inventory.v1.Inventory/*": {rate: 5, burst: 10}   # the whole service
//	      "/inventory.v1.Inventory/Export": {rate: 2, burst: 2, per: 1m}
//	      "/inventory.v1.Inventory/Search": {cost: 2}         # same bucket, 2 tokens
//	  pro:
//	    default: {rate: 100, burst: 200}
//	    methods:
//	      "/inventory.v1.Inventory/Export": {rate: 1, burst: 5}
//	tenants:
//	  acme:
//	    tier: pro
//	    keys:   # SHA-256 hex digests, never the keys themselves
//	      - 52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32
//	    methods:
//	      "/inventory.v1.Inventory/Export": {rate: 10, burst: 20}
//	  initech:
//	    tier: free
//	    keys: [9873bbdaaa392d094b7f1aaf4bb0da5756431cd88a323b9576f08576e7b7a571]
//	    default: {rate: 50, burst: 100}   # shadows the free tier's method limits
//	anonymous:
//	  default: {rate: 1, burst: 5}
//	  methods:
//	    "/inventory.v1.Inventory/Export": {rate: 1, burst: 1, per: 1h}
//
// Fields: top level tiers, tenants, anonymous; a tier has default and
// methods; a tenant (and anonymous) has tier, keys, default and methods; a
// limit has rate, burst and per (a Go duration such as 500ms, 1m, 1h); a
// method entry has rate, burst, per, cost, priority and metered (see
// Metered quotas); tiers and tenants also take weight and priority. Tier names and tenant IDs
// use letters, digits, '.', '_' and '-'. Without an anonymous policy,
// anonymous callers are admitted nothing. A program can build the same
// structure as a [Config] and [Compile] it.
//
// # Metered quotas
//
// Some calls cost what they cost: the tokens of a model's reply, the rows
// a query scanned, the bytes a download sent, known only once the call is
// done. A method entry's metered quota counts them in a unit of its own,
// per second, minute or hour, beside the call limit (which still counts
// calls, as above):
//
//	tiers:
//	  pro:
//	    default: {rate: 50, burst: 100}          # calls
//	    methods:
//	      "/llm.v1.Completions/*":
//	        metered:
//	          unit: tokens                       # required: what is counted
//	          rate: 100000
//	          per: 1m
//	          burst: 20000
//	          debt: 20000                        # the default, one burst; 0: none
//	          estimate: 4000                     # required: reserved per call
//	          estimate_header: x-max-tokens      # optional: the caller states it
//	          chunk: 4000                        # streams; default the estimate
//
// A call reserves its estimate from the metered bucket as it is admitted,
// and the middleware settles it at the actual cost when it ends: what was
// not used is refunded, and an overrun is charged below zero, down to debt
// units owed. While the bucket owes, every call under the quota is
// refused, until the debt is repaid at the quota's rate; so over any
// window of t, a tenant's calls cost at most burst + rate × t + debt, plus
// what a settle past the debt limit reported it could not charge. The
// estimate is the config's, unless the request's estimate_header, or a
// function the middleware is given, says otherwise. A stream reserves
// chunk units each time what it reported used up what it reserved, and
// ends at the first chunk it cannot have.
//
// Metered quotas resolve as limits do, the most specific entry of the
// precedence first, independently of limits and costs: an entry may set
// only a metered quota and keep its inherited call limit. [Rule.Meter]
// holds the compiled quota. Its bucket is named by the pattern and the
// unit alone ([Meter.ID]): a reload that changes the rate or the burst, or
// moves the tenant to another tier with the same pattern, keeps the
// bucket, and its debt with it; a new unit is a new bucket. The estimate
// and the chunk must fit the burst, and rate may be "inf" to lift a
// tier's quota for one tenant. Only a store that settles
// (floodgate.Reserver: keyed, redisstore) serves a table with metered
// quotas ([Table.Metered]).
//
// # Security of API keys
//
// A config holds only SHA-256 digests of API keys, as 64 hex digits; a
// value that is not one is an error, and error messages never quote it (it
// may be the key). `go run ./cmd/floodgate-keyhash` prints the digest of a
// key read from standard input. A fast unsalted hash is right for this
// use only because API keys must be random and long (at least 128 bits):
// it makes a leaked config useless to an attacker without making each
// lookup slow, but it would not protect guessable keys.
//
// An unknown key, and a malformed one (empty, over [MaxKeyLen] bytes, or
// not printable ASCII), resolves to the anonymous policy, never to a new
// tenant with fresh buckets. A caller that presents a new made-up key on
// every request therefore stays in its address's anonymous buckets and
// gains nothing; malformed keys are not even hashed. Lookups compare
// digests, so their timing can say something about digests at most, and
// digests do not lead back to keys.
//
// [Table.TenantByKey] costs one SHA-256 of the key, which dominates, plus a
// map lookup; [Table.TenantByDigest] is the map lookup alone, for callers
// that hash a key once per connection or stream. BENCHMARKS.md has the
// figures.
//
// # Hot reload
//
// [Registry.Load] replaces the table in force with one built from a file;
// [Registry.Watch] polls the file (its size and modification time, and its
// content's SHA-256 when those changed or are too recent to trust) and
// reloads it on change. A config that fails to load never replaces the
// table in force: the error goes to the [WithOnReload] function and the
// logger, once per bad content, and the previous table stays. Replace the
// file atomically (write, then rename), as a partially written file that
// happens to be valid would load.
//
// # Concurrency
//
// A [Table], its [Tenant] values and [Rule] values are immutable and safe
// for concurrent use. A [Registry] publishes each new table with one atomic
// store; [Registry.Table] is one atomic load, so a request sees one whole
// table, old or new, never a mix. Callers that make several lookups for
// one request should load the table once. Nothing in this package starts a
// goroutine: [Registry.Watch] runs on the caller's goroutine until its
// context ends.
package tenant
