package tenant

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/floodgate-go/floodgate"
)

// A Table is a compiled config: it maps identities to tenants and
// (tenant, method) to rules. A Table is immutable and safe for concurrent
// use; a reload builds a new Table rather than changing one, so a caller
// that loaded a Table sees one consistent config for as long as it holds it.
//
// Lookups never allocate. Tables come from [Parse], [Compile] or a
// [Registry]; the zero Table is not usable.
type Table struct {
	byDigest map[[32]byte]*Tenant
	byID     map[string]*Tenant
	tenants  []*Tenant // sorted by ID
	anon     *Tenant
	sums     sums // what the specs were, for saying what a reload changed
	metered  bool // some rule has a Meter
}

// A Tenant is a compiled tenant or the anonymous policy: its identity and
// the rule for each method. A Tenant belongs to one [Table] and is
// immutable.
type Tenant struct {
	id     string
	tier   string
	anon   bool
	rules  *ruleSet
	weight float64
	prio   floodgate.Priority
}

// Weight returns the tenant's weight for fair shedding (its own, else its
// tier's, else 1): see [TierSpec.Weight].
func (t *Tenant) Weight() float64 { return t.weight }

// Priority returns the tenant's priority for shedding (its own, else its
// tier's, else floodgate.Default). A method's [Rule.Priority] overrides it
// when the rule is Ranked.
func (t *Tenant) Priority() floodgate.Priority { return t.prio }

// share resolves a tenant's weight and priority from its spec and its tier.
func share(cfg *Config, spec TenantSpec) (float64, floodgate.Priority) {
	tier := cfg.Tiers[spec.Tier]
	w, prio := spec.Weight, spec.Priority
	if w == 0 {
		w = tier.Weight
	}
	if w == 0 {
		w = 1
	}
	if prio == "" {
		prio = tier.Priority
	}
	p, _ := floodgate.ParsePriority(prio) // validated: an unknown name never compiles
	return w, p
}

// ID returns the tenant's ID, or "" for the anonymous policy.
func (t *Tenant) ID() string { return t.id }

// Tier returns the name of the tenant's tier, or "" when it has none.
func (t *Tenant) Tier() string { return t.tier }

// IsAnonymous reports whether t is the anonymous policy, whose buckets the
// caller keys by client address rather than by tenant.
func (t *Tenant) IsAnonymous() bool { return t.anon }

// Rule returns the rule for a call to fullMethod ("/pkg.Svc/Method", as in
// grpc.UnaryServerInfo.FullMethod). Every method has a rule: a method no
// pattern names gets the tenant's fallback. Rule does not allocate.
func (t *Tenant) Rule(fullMethod string) Rule {
	// Exact methods first, then the service: a miss in a small map costs
	// little, and in interleaved runs this order measured as fast as a
	// service-first index for service and fallback lookups, and faster for
	// exact ones.
	rs := t.rules
	if r, ok := rs.exact[fullMethod]; ok {
		return *r
	}
	if len(rs.service) > 0 {
		if i := strings.LastIndexByte(fullMethod, '/'); i > 0 {
			if r, ok := rs.service[fullMethod[:i]]; ok {
				return *r
			}
		}
	}
	return rs.fallback
}

// A Rule is what one call must pass: take Cost tokens from the bucket
// identified by ID under Limit and, when it has a Meter, reserve its
// estimate from the metered bucket (see [Meter]).
type Rule struct {
	// Limit is the bucket's limit in tokens per second. The zero Limit
	// (anonymous callers without an anonymous policy) admits nothing.
	Limit floodgate.Limit
	// Cost is the number of tokens one call takes, ≥ 1.
	Cost int
	// ID names the bucket among the tenant's buckets: methods whose limit
	// comes from the same pattern share it, and methods whose limits come
	// from different patterns never do. It is 8 lower-case hex digits
	// derived from the pattern alone, so it is the same in every table
	// built from a config with that pattern: reloads, tier changes and new
	// limit values keep each bucket's state. It is unique within one
	// tenant, not across tenants: a bucket key holds both.
	ID string
	// Pattern is the method pattern that supplied the limit ("/pkg.Svc/M",
	// "/pkg.Svc/*" or "*"), or "default".
	Pattern string
	// Priority is the priority the most specific method entry that sets
	// one gives these calls, when Ranked; otherwise the tenant's applies
	// (Tenant.Priority).
	Priority floodgate.Priority
	Ranked   bool
	// Meter is the calls' metered quota, from the most specific entry
	// that sets one (in the precedence of limits), or nil when none does.
	// It is shared and must not be modified.
	Meter *Meter
}

// A Meter is a compiled metered quota ([MeteredSpec]): a bucket in a unit
// of its own, from which each call reserves an estimate as it is admitted
// and which it settles at its actual cost when it ends.
type Meter struct {
	// Unit names what the bucket counts, such as "tokens".
	Unit string
	// Limit is the bucket's limit in units per second, with its debt
	// limit (Limit.DebtLimit).
	Limit floodgate.Limit
	// Estimate is what a call reserves when neither its request header
	// nor the middleware's estimate function says otherwise.
	Estimate int
	// EstimateHeader names the request header that may state a call's
	// estimate, or "".
	EstimateHeader string
	// Chunk is how many units a stream reserves each time its
	// reservations run out, ≥ 1.
	Chunk int
	// ID names the bucket among the tenant's buckets, as Rule.ID does: 8
	// lower-case hex digits derived from the pattern and the unit alone,
	// so that reloads, tier changes and new limit values keep the
	// bucket's state, its debt included. It differs from every Rule.ID
	// of the tenant.
	ID string
	// Pattern is the method pattern of the entry that set the quota.
	Pattern string
}

// ruleSet is the resolved rules of one tenant. Tenants without overrides
// share their tier's set. The maps hold pointers: keeping each slot small
// keeps a small map's scan within a few cache lines, which measured faster
// than holding 64-byte rules inline.
type ruleSet struct {
	exact    map[string]*Rule // by full method
	service  map[string]*Rule // by "/pkg.Svc", for "/pkg.Svc/*" patterns
	fallback Rule
}

// TenantByKey returns the tenant an API key belongs to and true, or the
// anonymous policy and false for a key that is unknown or malformed (see
// [ErrMalformedKey]). It never invents a tenant: a caller that rotates
// made-up keys stays anonymous and keeps sharing its address's buckets.
//
// TenantByKey hashes the key with SHA-256, which dominates its cost, and
// then calls [Table.TenantByDigest]. Malformed keys are rejected before
// hashing.
func (t *Table) TenantByKey(key string) (*Tenant, bool) {
	if !wellFormedKey(key) {
		return t.anon, false
	}
	return t.TenantByDigest(Digest(key))
}

// TenantByDigest is [Table.TenantByKey] for a key already hashed with
// [Digest]: a map lookup, for callers that hash a key once and look it up
// on every call (per connection or per stream).
func (t *Table) TenantByDigest(d [32]byte) (*Tenant, bool) {
	if tn, ok := t.byDigest[d]; ok {
		return tn, true
	}
	return t.anon, false
}

// TenantByID returns the tenant with the given ID and true, or the
// anonymous policy and false. It serves identities that are not API keys,
// such as a TLS peer mapped to a tenant ID by the caller.
func (t *Table) TenantByID(id string) (*Tenant, bool) {
	if tn, ok := t.byID[id]; ok {
		return tn, true
	}
	return t.anon, false
}

// Anonymous returns the anonymous policy: the rules for callers without a
// known identity.
func (t *Table) Anonymous() *Tenant { return t.anon }

// Tenants returns the table's tenants sorted by ID, in a new slice.
func (t *Table) Tenants() []*Tenant {
	return append([]*Tenant(nil), t.tenants...)
}

// Compile validates a config built in code and compiles it into a Table.
// Errors are as for [Parse], without file or line. A nil cfg is the zero
// Config.
func Compile(cfg *Config) (*Table, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	return compile(cfg, &problems{})
}

// emptyTable treats every caller as anonymous and admits no one: the table
// in force before any config is loaded.
var emptyTable = mustCompile(&Config{})

func mustCompile(cfg *Config) *Table {
	t, err := Compile(cfg)
	if err != nil {
		panic(err)
	}
	return t
}

// defaultPattern is the Pattern of a rule whose limit is a level's default.
const defaultPattern = "default"

// MaxRules bounds the rules a config resolves to. A tenant with limits of
// its own resolves every method pattern of its tier again, so rules grow
// as tenants × patterns: past this bound (about 50 MB of rules) a config
// is refused before anything is resolved, whatever its size in bytes.
const MaxRules = 1 << 18

// ruleCount bounds the rules cfg resolves to, from above.
func ruleCount(cfg *Config) int {
	n := 1 // the anonymous policy's fallback
	if a := cfg.Anonymous; a != nil {
		n += len(a.Methods) + len(cfg.Tiers[a.Tier].Methods)
	}
	for _, tier := range cfg.Tiers {
		n += len(tier.Methods) + 1
	}
	for _, spec := range cfg.Tenants {
		if spec.Default != nil || len(spec.Methods) > 0 {
			n += len(spec.Methods) + len(cfg.Tiers[spec.Tier].Methods) + 1
		}
	}
	return n
}

func compile(cfg *Config, p *problems) (*Table, error) {
	if n := ruleCount(cfg); n > MaxRules {
		p.add("tenants", "the config resolves to "+strconv.Itoa(n)+" rules, more than "+strconv.Itoa(MaxRules)+
			": tenants with limits of their own repeat their tier's method patterns; move shared limits into tiers")
		return nil, p.err()
	}
	validate(cfg, p)
	if len(p.errs) > 0 {
		checkSound(cfg, p)
		return nil, p.err()
	}
	t := &Table{
		byDigest: map[[32]byte]*Tenant{},
		byID:     make(map[string]*Tenant, len(cfg.Tenants)),
	}
	// Tenants without overrides share their tier's rule set: a table of
	// many tenants on few tiers costs memory per tier, not per tenant.
	shared := map[string]*ruleSet{}
	// Each tier is resolved on its own as well, as a tenant without
	// overrides would see it, so that a tier's own inconsistencies are
	// reported whether or not a tenant uses it yet.
	for _, name := range sortedKeys(cfg.Tiers) {
		shared[name] = resolve(p, cfg, namePath("tiers", name), TenantSpec{Tier: name})
	}
	for _, id := range sortedKeys(cfg.Tenants) {
		spec := cfg.Tenants[id]
		path := namePath("tenants", id)
		var rs *ruleSet
		if spec.Default == nil && len(spec.Methods) == 0 {
			rs = shared[spec.Tier]
			if rs == nil {
				rs = resolve(p, cfg, path, spec)
				shared[spec.Tier] = rs
			}
		} else {
			rs = resolve(p, cfg, path, spec)
		}
		tn := &Tenant{id: id, tier: spec.Tier, rules: rs}
		tn.weight, tn.prio = share(cfg, spec)
		for _, k := range spec.Keys {
			if d, ok := parseDigest(k); ok { // always, after validation
				t.byDigest[d] = tn
			}
		}
		t.byID[id] = tn
		t.tenants = append(t.tenants, tn)
	}
	if a := cfg.Anonymous; a != nil {
		t.anon = &Tenant{tier: a.Tier, anon: true, rules: resolve(p, cfg, "anonymous", *a)}
		t.anon.weight, t.anon.prio = share(cfg, *a)
	} else {
		t.anon = &Tenant{anon: true, weight: 1, rules: &ruleSet{fallback: Rule{Cost: 1, ID: ruleID(defaultPattern), Pattern: defaultPattern}}}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	t.sums = sumsOf(cfg)
	t.metered = hasMetered(cfg)
	return t, nil
}

// hasMetered reports whether some method entry of cfg sets a metered
// quota. An entry no rule resolves to (shadowed by a more specific one)
// counts too: the answer errs toward needing a Reserver.
func hasMetered(cfg *Config) bool {
	levels := make([]map[string]MethodSpec, 0, len(cfg.Tiers)+len(cfg.Tenants)+1)
	for _, t := range cfg.Tiers {
		levels = append(levels, t.Methods)
	}
	for _, t := range cfg.Tenants {
		levels = append(levels, t.Methods)
	}
	if a := cfg.Anonymous; a != nil {
		levels = append(levels, a.Methods)
	}
	for _, ms := range levels {
		for _, m := range ms {
			if m.Metered != nil {
				return true
			}
		}
	}
	return false
}

// checkSound resolves the parts of an invalid config that are sound by
// themselves (no problem under their path or their tier's), so that the
// problems only resolution finds, such as a cost above a burst, are
// reported in the same run as the rest.
func checkSound(cfg *Config, p *problems) {
	faulty := map[string]bool{}
	mark := func(path string) {
		for _, fe := range p.errs {
			if f := fe.Field; f == path || strings.HasPrefix(f, path+".") || strings.HasPrefix(f, path+"[") {
				faulty[path] = true
				return
			}
		}
	}
	for name := range cfg.Tiers {
		mark(namePath("tiers", name))
	}
	for id := range cfg.Tenants {
		mark(namePath("tenants", id))
	}
	mark("anonymous")
	// sound reports whether an entity and its tier can be resolved.
	sound := func(path string, spec TenantSpec) bool {
		if faulty[path] {
			return false
		}
		if spec.Tier == "" {
			return true
		}
		tp := namePath("tiers", spec.Tier)
		_, ok := cfg.Tiers[spec.Tier]
		return ok && !faulty[tp]
	}
	for _, name := range sortedKeys(cfg.Tiers) {
		if path := namePath("tiers", name); sound(path, TenantSpec{}) {
			resolve(p, cfg, path, TenantSpec{Tier: name})
		}
	}
	for _, id := range sortedKeys(cfg.Tenants) {
		spec, path := cfg.Tenants[id], namePath("tenants", id)
		// Tenants without overrides resolve as their tier did.
		if (spec.Default != nil || len(spec.Methods) > 0) && sound(path, spec) {
			resolve(p, cfg, path, spec)
		}
	}
	if a := cfg.Anonymous; a != nil && sound("anonymous", *a) {
		resolve(p, cfg, "anonymous", *a)
	}
}

// level is one layer of the precedence: a tenant's own entries or its
// tier's.
type level struct {
	path    string
	def     *LimitSpec
	methods map[string]MethodSpec
}

// resolve computes a tenant's rule for every method its patterns name, for
// every service a wildcard names, and for everything else, following the
// precedence in the package documentation.
func resolve(p *problems, cfg *Config, path string, spec TenantSpec) *ruleSet {
	levels := []level{{path, spec.Default, spec.Methods}}
	if spec.Tier != "" {
		tier := cfg.Tiers[spec.Tier]
		levels = append(levels, level{namePath("tiers", spec.Tier), tier.Default, tier.Methods})
	}
	exact, services := map[string]bool{}, map[string]bool{}
	for _, l := range levels {
		for pat := range l.methods {
			if svc, m, ok := splitMethod(pat); ok {
				if m == "*" {
					services[svc] = true
				} else {
					exact[pat] = true
				}
			}
		}
	}
	rs := &ruleSet{}
	ids := map[string]string{}
	rule := func(candidates ...string) Rule {
		r := pick(p, levels, candidates)
		claim := func(id, name string) {
			if other, ok := ids[id]; ok && other != name {
				p.add(path, "rule IDs of "+strconv.Quote(other)+" and "+strconv.Quote(name)+" collide: rename one pattern")
			}
			ids[id] = name
		}
		claim(r.ID, r.Pattern)
		if m := r.Meter; m != nil {
			claim(m.ID, m.Pattern+" metered in "+m.Unit)
		}
		return r
	}
	if len(exact) > 0 {
		rs.exact = make(map[string]*Rule, len(exact))
		for _, pat := range sortedKeys(exact) {
			svc, _, _ := splitMethod(pat)
			r := rule(pat, svc+"/*", "*")
			rs.exact[pat] = &r
		}
	}
	if len(services) > 0 {
		rs.service = make(map[string]*Rule, len(services))
		for _, svc := range sortedKeys(services) {
			r := rule(svc+"/*", "*")
			rs.service[svc] = &r
		}
	}
	rs.fallback = rule("*")
	return rs
}

// pick resolves one rule: the limit from the first level, most specific
// pattern first, that sets one (a level's default after its patterns), and
// the cost likewise from the first entry that sets one.
func pick(p *problems, levels []level, candidates []string) Rule {
	var (
		lim              *LimitSpec
		pattern, limPath string
		cost             int
		costPath         string
		prio             string
		meter            *MeteredSpec
		meterPattern     string
	)
	for _, l := range levels {
		mpath := fieldPath(l.path, "methods")
		for _, c := range candidates {
			m, ok := l.methods[c]
			if !ok {
				continue
			}
			if lim == nil && m.Limit != nil {
				lim, pattern, limPath = m.Limit, c, quotedPath(mpath, c)
			}
			if cost == 0 && m.Cost > 0 {
				cost, costPath = m.Cost, fieldPath(quotedPath(mpath, c), "cost")
			}
			if prio == "" {
				prio = m.Priority
			}
			if meter == nil && m.Metered != nil {
				meter, meterPattern = m.Metered, c
			}
		}
		if lim == nil && l.def != nil {
			lim, pattern, limPath = l.def, defaultPattern, fieldPath(l.path, "default")
		}
	}
	if cost == 0 {
		cost = 1
	}
	r := Rule{Cost: cost, ID: ruleID(pattern), Pattern: pattern}
	if meter != nil {
		r.Meter = toMeter(*meter, meterPattern)
	}
	if prio != "" {
		r.Priority, _ = floodgate.ParsePriority(prio) // validated
		r.Ranked = true
	}
	if lim == nil {
		// Unreachable after validation; a zero limit fails closed.
		return r
	}
	r.Limit = toLimit(*lim)
	if !r.Limit.IsInf() && cost > r.Limit.Burst {
		p.add(costPath, "cost "+strconv.Itoa(cost)+" exceeds burst "+strconv.Itoa(r.Limit.Burst)+
			" of "+limPath+": such calls could never be admitted")
	}
	return r
}

// ruleID derives a bucket's short name from its pattern alone, so that it
// survives reloads and stays clear of any key syntax.
func ruleID(pattern string) string {
	sum := sha256.Sum256([]byte(pattern))
	return hex.EncodeToString(sum[:4])
}

// meterID derives a metered bucket's short name from its pattern and unit
// alone, as ruleID does: "pattern unit", which no pattern is (patterns
// hold no space), so that it names another bucket than the pattern's
// call limit.
func meterID(pattern, unit string) string {
	return ruleID(pattern + " " + unit)
}

// Metered reports whether some rule of the table has a metered quota
// (Rule.Meter), which only a store that can settle (floodgate.Reserver)
// can serve.
func (t *Table) Metered() bool { return t.metered }
