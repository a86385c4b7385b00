package tenant

import "time"

// Config is the declarative form of a tenant table: what a YAML or JSON
// config file decodes to, and what a program may build directly and pass to
// [Compile]. A Config is plain data; nothing is checked until it is compiled.
//
// The zero Config compiles to a table in which every caller is anonymous and
// anonymous callers are admitted nothing.
type Config struct {
	// Tiers are the shared service levels, by name. Names use letters,
	// digits, '.', '_' and '-', at most 64 bytes.
	Tiers map[string]TierSpec
	// Tenants are the known callers, by tenant ID (same alphabet as tier
	// names, so an ID can sit inside a bucket key or a metric label).
	Tenants map[string]TenantSpec
	// Anonymous is the policy for callers without a known identity. Its
	// Keys must be empty. When nil, anonymous callers are admitted nothing:
	// a deployment that forgets the policy fails closed.
	Anonymous *TenantSpec
}

// TierSpec is a tier: a default limit and per-method limits and costs that
// every tenant of the tier inherits.
type TierSpec struct {
	// Default is the limit for every method no entry of Methods limits.
	// A tier needs a Default or a Methods["*"] entry with a limit.
	Default *LimitSpec
	// Methods are per-method entries keyed by pattern: "/pkg.Svc/Method",
	// "/pkg.Svc/*" or "*".
	Methods map[string]MethodSpec
	// Weight is each of the tier's tenants' share of the server when the
	// overload controller must shed, relative to other tenants': a tenant
	// of weight 2 keeps twice the calls in flight of a tenant of weight 1
	// before it is shed. 0 means 1.
	Weight float64
	// Priority ranks the tier's calls when the overload controller must
	// shed: "sheddable" (shed first), "default" or "critical" (shed
	// last); "" means "default".
	Priority string
}

// TenantSpec is one tenant, or the anonymous policy.
type TenantSpec struct {
	// Tier names the tier the tenant inherits from. It may be empty when
	// the tenant sets its own Default (or Methods["*"] limit).
	Tier string
	// Keys are the SHA-256 digests of the tenant's API keys, as 64 hex
	// digits (either case). The keys themselves never appear in a config:
	// see [HashKey] and the floodgate-keyhash command.
	Keys []string
	// Default overrides the tier's limits for every method this tenant's
	// Methods do not limit; it shadows the tier's per-method limits too.
	Default *LimitSpec
	// Methods are per-method overrides keyed by pattern, as in [TierSpec].
	Methods map[string]MethodSpec
	// Weight and Priority override the tier's (see [TierSpec]); 0 and ""
	// inherit them.
	Weight   float64
	Priority string
}

// MethodSpec is the entry for one method pattern: a limit, a cost, a
// metered quota, a priority, or any of them together.
type MethodSpec struct {
	// Limit, when set, is one bucket shared by every method the pattern
	// covers: "/pkg.Svc/*" limits the service as a whole, not each method.
	Limit *LimitSpec
	// Cost is the number of tokens one call takes, ≥ 1; 0 means inherit
	// (from a less specific entry, else 1). Costs resolve independently of
	// limits, so an entry may set only a cost and keep the inherited bucket.
	Cost int
	// Metered, when set, is a quota in a unit of its own (tokens, bytes,
	// rows) beside the call limit, charged at what each call turns out to
	// cost: one bucket shared by every method the pattern covers, as for
	// Limit. It resolves independently of limits and costs.
	Metered *MeteredSpec
	// Priority, when set, overrides the tenant's priority for the methods
	// the pattern covers (see [TierSpec]): a batch export can be
	// "sheddable" while the rest of a tenant's calls are not.
	Priority string
}

// LimitSpec is a token bucket in config units: Rate tokens per Per, holding
// at most Burst tokens.
type LimitSpec struct {
	// Rate is the number of tokens gained per Per: > 0, or +Inf for no
	// limit at all.
	Rate float64
	// Burst is the bucket's capacity, 1 ≤ Burst ≤ floodgate.MaxBurst. It
	// is ignored for an infinite Rate.
	Burst int
	// Per is the period Rate is counted over; 0 means one second.
	Per time.Duration
}

// MeteredSpec is a metered quota: a token bucket of Rate units per Per,
// holding at most Burst, whose calls are charged what they actually cost,
// known only when they end (the tokens of a model's reply, the bytes a
// stream sent). A call reserves its estimate as it is admitted and settles
// at its actual cost when it ends: the difference is refunded, or charged
// below zero, down to Debt units owed; while the bucket owes, the
// tenant's calls under the quota are refused. A stream reserves Chunk
// units at a time as it runs.
type MeteredSpec struct {
	// Unit names what is counted ("tokens", "bytes"): letters, digits,
	// '.', '_' and '-', at most 64 bytes. Required. It names the bucket
	// together with the pattern, and appears in rejections and events.
	Unit string
	// Rate is the units gained per Per: > 0, or +Inf for no limit at all
	// (the other fields but Unit are then ignored).
	Rate float64
	// Burst is the bucket's capacity, 1 ≤ Burst ≤ floodgate.MaxBurst.
	Burst int
	// Per is the period Rate is counted over; 0 means one second.
	Per time.Duration
	// Debt is the most units the bucket may owe, as floodgate.Limit's
	// Debt: 0 means one Burst, floodgate.NoDebt none, else at most
	// floodgate.MaxBurst. (In a config file, debt: 0 means none and
	// leaving it out means one burst.)
	Debt int
	// Estimate is what a call reserves when nothing better is known: no
	// EstimateHeader in the request and no estimate function in the
	// middleware. 0 ≤ Estimate ≤ Burst. A call estimated at 0 reserves
	// nothing but is still refused while the bucket owes.
	Estimate int
	// EstimateHeader, when set, names the request header (gRPC metadata)
	// from which a caller states its call's estimate, such as
	// "x-max-tokens": lower case, neither binary ("-bin") nor reserved
	// ("grpc-"). A value that is not a whole number within [0, Burst]
	// refuses the call (see package middleware).
	EstimateHeader string
	// Chunk is how many units a stream reserves each time its
	// reservations run out: 1 ≤ Chunk ≤ Burst; 0 means the estimate, or a
	// tenth of the burst (at least 1) when the estimate is 0. Package
	// httplimit covers an HTTP response's Write longer than Burst bytes
	// Chunk bytes at a time.
	Chunk int
}
