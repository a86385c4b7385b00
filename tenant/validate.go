package tenant

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-go/floodgate"
)

const maxNameLen = 64

// validate reports every problem in cfg that does not need resolution.
func validate(cfg *Config, p *problems) {
	for _, name := range sortedKeys(cfg.Tiers) {
		path := namePath("tiers", name)
		tier := cfg.Tiers[name]
		checkName(p, path, name)
		checkLevel(p, path, tier.Default, tier.Methods)
		checkShare(p, path, tier.Weight, tier.Priority)
		if !hasFallback(tier.Default, tier.Methods) && !brokenLevel(p, path) {
			p.add(path, `no default limit: set default or a methods["*"] limit`)
		}
	}
	owners := map[[32]byte]string{}
	for _, id := range sortedKeys(cfg.Tenants) {
		path := namePath("tenants", id)
		checkName(p, path, id)
		checkTenant(p, cfg, path, cfg.Tenants[id], owners)
	}
	if a := cfg.Anonymous; a != nil {
		if len(a.Keys) > 0 {
			p.add("anonymous.keys", "not allowed: anonymous callers have no key")
		}
		checkTenant(p, cfg, "anonymous", TenantSpec{Tier: a.Tier, Default: a.Default, Methods: a.Methods, Weight: a.Weight, Priority: a.Priority}, owners)
	}
}

func checkTenant(p *problems, cfg *Config, path string, t TenantSpec, owners map[[32]byte]string) {
	if t.Tier != "" {
		if _, ok := cfg.Tiers[t.Tier]; !ok && !p.broken["tiers"] {
			p.add(fieldPath(path, "tier"), "unknown tier "+strconv.Quote(t.Tier))
		}
	} else if !hasFallback(t.Default, t.Methods) && !brokenLevel(p, path) && !p.broken[fieldPath(path, "tier")] {
		p.add(path, `no tier and no default limit: set tier, default or a methods["*"] limit`)
	}
	checkLevel(p, path, t.Default, t.Methods)
	checkShare(p, path, t.Weight, t.Priority)
	for i, k := range t.Keys {
		kp := indexPath(fieldPath(path, "keys"), i)
		if p.broken[kp] {
			continue // decoding reported it
		}
		d, ok := parseDigest(k)
		if !ok {
			// Never quote the value: it may well be the key itself.
			p.add(kp, "not a SHA-256 hex digest (64 hex digits): store the hash of the key, never the key (go run ./cmd/floodgate-keyhash)")
			continue
		}
		if first, dup := owners[d]; dup {
			p.add(kp, "duplicate digest: already listed at "+first)
			continue
		}
		owners[d] = kp
	}
}

// MaxWeight is the largest weight a tier or tenant may have.
const MaxWeight = 1e6

// checkShare checks a level's weight and priority.
func checkShare(p *problems, path string, weight float64, priority string) {
	if wp := fieldPath(path, "weight"); !p.broken[wp] && (weight < 0 || weight > MaxWeight || math.IsNaN(weight)) {
		p.add(wp, "must be a number in (0, 1e6], or 0 to inherit")
	}
	checkPriority(p, fieldPath(path, "priority"), priority)
}

func checkPriority(p *problems, path, priority string) {
	if _, err := floodgate.ParsePriority(priority); err != nil && !p.broken[path] {
		p.add(path, "unknown priority "+strconv.Quote(priority)+`: want "sheddable", "default" or "critical"`)
	}
}

// brokenLevel reports whether a level's default or methods could not be
// decoded, in which case a missing fallback is no news.
func brokenLevel(p *problems, path string) bool {
	return p.broken[path] || p.broken[fieldPath(path, "default")] || p.broken[fieldPath(path, "methods")]
}

// hasFallback reports whether a level limits every method by itself.
func hasFallback(def *LimitSpec, methods map[string]MethodSpec) bool {
	return def != nil || methods["*"].Limit != nil
}

// checkLevel checks a tier's or tenant's default and methods.
func checkLevel(p *problems, path string, def *LimitSpec, methods map[string]MethodSpec) {
	if def != nil {
		checkLimit(p, fieldPath(path, "default"), *def)
	}
	mpath := fieldPath(path, "methods")
	for _, pat := range sortedKeys(methods) {
		ep := quotedPath(mpath, pat)
		m := methods[pat]
		if !validPattern(pat) {
			p.add(ep, `invalid method pattern: want "/package.Service/Method", "/package.Service/*" or "*"`)
		}
		if m.Limit == nil && m.Cost == 0 && m.Priority == "" && m.Metered == nil && !p.broken[fieldPath(ep, "metered")] {
			p.add(ep, "sets neither a limit, a cost, a metered quota nor a priority")
		}
		if m.Metered != nil {
			checkMetered(p, fieldPath(ep, "metered"), *m.Metered)
		}
		checkPriority(p, fieldPath(ep, "priority"), m.Priority)
		if m.Cost < 0 {
			p.add(fieldPath(ep, "cost"), "must be ≥ 1")
		}
		if m.Limit != nil {
			checkLimit(p, ep, *m.Limit)
		}
	}
	if def != nil && methods["*"].Limit != nil {
		p.add(quotedPath(mpath, "*"), "limit conflicts with default: set one of them")
	}
}

// checkLimit checks one limit and, when its fields are sound, the compiled
// floodgate.Limit as well.
func checkLimit(p *problems, path string, l LimitSpec) {
	n := len(p.errs)
	rp, bp := fieldPath(path, "rate"), fieldPath(path, "burst")
	// A field the source left out reads as zero; "required" says which.
	missing := func(field string) bool { return p.lines != nil && !p.has(field) }
	inf := math.IsInf(l.Rate, 1)
	switch {
	case inf:
	case l.Rate > 0:
	case l.Rate == 0 && missing(rp):
		p.add(rp, "required")
	default:
		p.add(rp, "must be > 0")
	}
	if !inf {
		switch {
		case l.Burst == 0 && missing(bp):
			p.add(bp, "required")
		case l.Burst < 1:
			p.add(bp, "must be ≥ 1")
		case l.Burst > floodgate.MaxBurst:
			p.add(bp, "must be ≤ "+strconv.Itoa(floodgate.MaxBurst))
		}
	}
	if l.Per < 0 {
		p.add(fieldPath(path, "per"), "must be > 0")
	}
	if len(p.errs) > n {
		return
	}
	lim := toLimit(l)
	if !inf && math.IsInf(lim.Rate, 1) {
		p.add(rp, "too large for its period")
		return
	}
	if !inf && lim.Rate == 0 {
		// A positive rate so small that per second it is no number at
		// all: it would admit one burst and never refill.
		p.add(rp, "too small for its period")
		return
	}
	if err := lim.Validate(); err != nil {
		p.add(path, strings.TrimPrefix(err.Error(), floodgate.ErrInvalidLimit.Error()+": "))
	}
}

// checkMetered checks a metered quota: its unit, its limit, and its
// estimate, header and chunk against the limit.
func checkMetered(p *problems, path string, m MeteredSpec) {
	if up := fieldPath(path, "unit"); !p.broken[up] {
		switch {
		case m.Unit == "" && p.lines != nil && !p.has(up):
			p.add(up, "required: name what is counted, such as tokens or bytes")
		case !validName(m.Unit):
			p.add(up, "invalid unit: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
		}
	}
	n := len(p.errs)
	checkLimit(p, path, LimitSpec{Rate: m.Rate, Burst: m.Burst, Per: m.Per})
	if math.IsInf(m.Rate, 1) {
		return
	}
	// The estimate and the chunk are compared with a burst only when the
	// limit is sound.
	sound := len(p.errs) == n
	dp := fieldPath(path, "debt")
	if m.Debt < floodgate.NoDebt {
		p.add(dp, "must be ≥ 0 (0 for no debt)")
	} else if m.Debt > floodgate.MaxBurst {
		p.add(dp, "must be ≤ "+strconv.Itoa(floodgate.MaxBurst))
	}
	if hp := fieldPath(path, "estimate_header"); m.EstimateHeader != "" && !validHeader(m.EstimateHeader) {
		p.add(hp, "invalid header name: want lower-case letters, digits, '-', '_' or '.', neither binary (-bin) nor reserved (grpc-)")
	}
	ep, cp := fieldPath(path, "estimate"), fieldPath(path, "chunk")
	switch {
	case p.broken[ep]:
	case m.Estimate == 0 && p.lines != nil && !p.has(ep):
		p.add(ep, "required: what a call reserves when nothing better is known (0 to reserve nothing)")
	case m.Estimate < 0:
		p.add(ep, "must be ≥ 0")
	case sound && m.Estimate > m.Burst:
		p.add(ep, "estimate "+strconv.Itoa(m.Estimate)+" exceeds burst "+strconv.Itoa(m.Burst)+": such calls could never be admitted")
	}
	switch {
	case p.broken[cp]:
	case m.Chunk < 0 || m.Chunk == 0 && p.has(cp):
		p.add(cp, "must be ≥ 1")
	case sound && m.Chunk > m.Burst:
		p.add(cp, "chunk "+strconv.Itoa(m.Chunk)+" exceeds burst "+strconv.Itoa(m.Burst)+": a stream could never reserve it")
	}
}

// validHeader reports whether name can carry an estimate: a lower-case
// gRPC metadata key, not binary and not reserved, of at most 64 bytes.
func validHeader(name string) bool {
	if len(name) == 0 || len(name) > maxNameLen || strings.HasSuffix(name, "-bin") || strings.HasPrefix(name, "grpc-") {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// toMeter compiles a checked metered quota found at pattern.
func toMeter(m MeteredSpec, pattern string) *Meter {
	lim := toLimit(LimitSpec{Rate: m.Rate, Burst: m.Burst, Per: m.Per})
	if !lim.IsInf() {
		lim.Debt = m.Debt
	}
	chunk := m.Chunk
	if chunk == 0 {
		chunk = m.Estimate
		if chunk == 0 {
			chunk = max(m.Burst/10, 1)
		}
	}
	return &Meter{
		Unit:           m.Unit,
		Limit:          lim,
		Estimate:       m.Estimate,
		EstimateHeader: m.EstimateHeader,
		Chunk:          chunk,
		ID:             meterID(pattern, m.Unit),
		Pattern:        pattern,
	}
}

// toLimit converts a checked LimitSpec to tokens per second.
func toLimit(l LimitSpec) floodgate.Limit {
	if math.IsInf(l.Rate, 1) {
		return floodgate.Inf
	}
	per := l.Per
	if per == 0 {
		per = time.Second
	}
	return floodgate.Limit{Rate: l.Rate / per.Seconds(), Burst: l.Burst}
}

// checkName checks a tier name or tenant ID: such names end up inside
// bucket keys, log lines and metric labels, so they stay plain.
func checkName(p *problems, path, name string) {
	if !validName(name) {
		p.add(path, "invalid name: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLen || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// validPattern reports whether pat is "*", "/pkg.Svc/*" or "/pkg.Svc/Method".
func validPattern(pat string) bool {
	if pat == "*" {
		return true
	}
	svc, method, ok := splitMethod(pat)
	if !ok {
		return false
	}
	return method == "*" || validMethodName(method) && validServiceName(svc[1:])
}

// splitMethod splits "/pkg.Svc/Method" into "/pkg.Svc" and "Method".
func splitMethod(full string) (svc, method string, ok bool) {
	if len(full) < 4 || full[0] != '/' {
		return "", "", false
	}
	i := strings.LastIndexByte(full, '/')
	if i <= 1 || i == len(full)-1 {
		return "", "", false
	}
	svc, method = full[:i], full[i+1:]
	return svc, method, validServiceName(svc[1:])
}

func validServiceName(s string) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func validMethodName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
