package tenant

import (
	"crypto/sha256"
	"slices"
	"strconv"
	"strings"
)

// specSum is a digest of one tier's or tenant's spec in a canonical form
// (map entries and keys sorted, floats exact), so that two tables built
// from the same spec, however written, compare equal.
type specSum [32]byte

// sums are a table's per-tier and per-tenant digests, for saying what a
// reload changed.
type sums struct {
	tiers   map[string]specSum
	tenants map[string]specSum
	anon    specSum
}

func sumsOf(cfg *Config) sums {
	s := sums{tiers: make(map[string]specSum, len(cfg.Tiers)), tenants: make(map[string]specSum, len(cfg.Tenants))}
	for name, spec := range cfg.Tiers {
		var b []byte
		b = appendLimit(b, spec.Default)
		b = appendMethods(b, spec.Methods)
		b = appendShare(b, spec.Weight, spec.Priority)
		s.tiers[name] = sha256.Sum256(b)
	}
	for id, spec := range cfg.Tenants {
		s.tenants[id] = sumTenant(spec)
	}
	if cfg.Anonymous != nil {
		s.anon = sumTenant(*cfg.Anonymous)
	}
	return s
}

func sumTenant(spec TenantSpec) specSum {
	b := append([]byte(spec.Tier), 0)
	keys := make([]string, len(spec.Keys))
	for i, k := range spec.Keys {
		keys[i] = strings.ToLower(k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = append(append(b, k...), 0)
	}
	b = appendLimit(b, spec.Default)
	b = appendMethods(b, spec.Methods)
	b = appendShare(b, spec.Weight, spec.Priority)
	return sha256.Sum256(b)
}

func appendLimit(b []byte, l *LimitSpec) []byte {
	if l == nil {
		return append(b, '-', 0)
	}
	b = strconv.AppendFloat(b, l.Rate, 'g', -1, 64)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(l.Per), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(l.Burst), 10)
	return append(b, 0)
}

func appendMethods(b []byte, m map[string]MethodSpec) []byte {
	for _, p := range sortedKeys(m) {
		ms := m[p]
		b = append(append(b, p...), 0)
		b = appendLimit(b, ms.Limit)
		b = strconv.AppendInt(b, int64(ms.Cost), 10)
		b = append(append(b, ms.Priority...), 0)
		b = appendMetered(b, ms.Metered)
	}
	return append(b, 1)
}

func appendMetered(b []byte, m *MeteredSpec) []byte {
	if m == nil {
		return append(b, '-', 0)
	}
	b = append(append(b, m.Unit...), 0)
	b = appendLimit(b, &LimitSpec{Rate: m.Rate, Burst: m.Burst, Per: m.Per})
	for _, n := range []int{m.Debt, m.Estimate, m.Chunk} {
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, ',')
	}
	return append(append(b, m.EstimateHeader...), 0)
}

func appendShare(b []byte, w float64, prio string) []byte {
	b = strconv.AppendFloat(b, w, 'g', -1, 64)
	return append(append(b, prio...), 0)
}

// changeSet says what one table changes from another: the tiers and
// tenants added, removed and changed, each sorted, and whether the
// anonymous policy changed. A tenant whose own spec is the same but whose
// tier changed is not listed; its tier is.
type changeSet struct {
	TiersAdded, TiersRemoved, TiersChanged       []string
	TenantsAdded, TenantsRemoved, TenantsChanged []string
	Anonymous                                    bool
}

// changes compares two tables' sums.
func changes(from, to *Table) changeSet {
	var c changeSet
	c.TiersAdded, c.TiersRemoved, c.TiersChanged = diff(from.sums.tiers, to.sums.tiers)
	c.TenantsAdded, c.TenantsRemoved, c.TenantsChanged = diff(from.sums.tenants, to.sums.tenants)
	c.Anonymous = from.sums.anon != to.sums.anon
	return c
}

func diff(from, to map[string]specSum) (added, removed, changed []string) {
	for name, s := range to {
		if old, ok := from[name]; !ok {
			added = append(added, name)
		} else if old != s {
			changed = append(changed, name)
		}
	}
	for name := range from {
		if _, ok := to[name]; !ok {
			removed = append(removed, name)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	slices.Sort(changed)
	return added, removed, changed
}

// maxNamesLogged bounds the names a reload's log line lists per kind of
// change: a first load of thousands of tenants says how many, not who.
const maxNamesLogged = 10

// logAttrs returns the log attributes of the non-empty changes: each a
// count and up to maxNamesLogged names.
func (c changeSet) logAttrs() []any {
	var out []any
	add := func(key string, names []string) {
		if len(names) == 0 {
			return
		}
		s := strings.Join(names[:min(len(names), maxNamesLogged)], ",")
		if len(names) > maxNamesLogged {
			s += ",…(" + strconv.Itoa(len(names)-maxNamesLogged) + " more)"
		}
		out = append(out, key, s)
	}
	add("tiers_added", c.TiersAdded)
	add("tiers_removed", c.TiersRemoved)
	add("tiers_changed", c.TiersChanged)
	add("tenants_added", c.TenantsAdded)
	add("tenants_removed", c.TenantsRemoved)
	add("tenants_changed", c.TenantsChanged)
	if c.Anonymous {
		out = append(out, "anonymous_changed", true)
	}
	return out
}
