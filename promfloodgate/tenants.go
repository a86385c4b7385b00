package promfloodgate

import (
	"maps"
	"slices"
	"strings"
)

// tenantSlots numbers the tenants that label themselves (WithTenantLabels).
// It is copied on write: a lookup is one atomic load and one map access,
// and at most MaxTenantLabels writes ever happen.
type tenantSlots struct {
	m     map[string]uint32 // tenant ID → slot, from tenantFirst
	names []string          // slot − tenantFirst → tenant ID
}

// Tenant slots below the named tenants'.
const (
	tenantNone  = 0 // anonymous callers and tap events
	tenantOther = 1 // tenants beyond the cap
	tenantFirst = 2
)

// tenantIndex returns the slot of a tenant ID, naming it on first sight
// while there is room.
func (c *Collector) tenantIndex(id string) int {
	if id == "" {
		return tenantNone
	}
	ts := c.tenants.Load()
	if i, ok := ts.m[id]; ok {
		return int(i)
	}
	// Tenants past the cap are common to every later event of theirs: they
	// must not take the lock each time.
	if len(ts.names) >= c.o.maxTenants {
		return tenantOther
	}
	c.tenMu.Lock()
	defer c.tenMu.Unlock()
	ts = c.tenants.Load()
	if i, ok := ts.m[id]; ok {
		return int(i)
	}
	if len(ts.names) >= c.o.maxTenants {
		return tenantOther
	}
	// A copy, so the label does not pin a reloaded-away table's strings.
	id = strings.Clone(id)
	next := &tenantSlots{m: make(map[string]uint32, len(ts.m)+1), names: append(slices.Clip(ts.names), id)}
	maps.Copy(next.m, ts.m)
	slot := uint32(tenantFirst + len(ts.names))
	next.m[id] = slot
	c.tenants.Store(next)
	return int(slot)
}

// tenantLabel returns the label of a tenant slot.
func tenantLabel(names []string, slot int) string {
	switch {
	case slot == tenantNone:
		return LabelNone
	case slot >= tenantFirst && slot-tenantFirst < len(names):
		return names[slot-tenantFirst]
	}
	return LabelOther
}
