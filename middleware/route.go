package middleware

import (
	"net/netip"

	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// A route is where one caller's calls under one rule go: the bucket key and
// the overload controller's flow. Routes are immutable and cached, so that
// a caller seen before costs no key built: a rejection allocates nothing.
type route struct {
	ten     *tenant.Tenant // the tenant, or the anonymous policy
	found   bool           // ten is a known tenant, not the anonymous policy
	rule    tenant.Rule
	subject string // "t:<tenant ID>" or "a:<address prefix>"
	key     string // subject + ":" + rule ID
	// meterKey is the metered bucket's key, subject + ":" + meter ID
	// (prefixed "dry:" in dry-run mode), or "" when the rule has no meter.
	meterKey string
	flow     overload.Flow
}

// routeKey names a route: a tenant, or the anonymous policy and the
// caller's address prefix (the zero Addr without one), and the rule's ID.
// Methods under one rule share a route, so made-up method names add none.
// A reload makes new tenants, so the old routes stop matching and age out.
type routeKey struct {
	ten     *tenant.Tenant
	addr    netip.Addr
	ruleID  string
	meterID string // methods under one rule may have different meters
}

// routeCacheSize bounds the routes cached: tenants and anonymous addresses
// in use, times their rules. A route pushed out is built again on its
// caller's next call, with a few small allocations.
const routeCacheSize = 8192

// route returns the route of call c by the caller identified as ten
// (found).
func (l *Limiter) route(ten *tenant.Tenant, found bool, c *Call) *route {
	rule := ten.Rule(c.Method)
	k := routeKey{ten: ten, ruleID: rule.ID}
	if rule.Meter != nil {
		k.meterID = rule.Meter.ID
	}
	if !found {
		k.addr = l.aggregate(l.forwarded(c))
	}
	if r, ok := l.routes.Peek(k); ok {
		return r
	}
	r := &route{ten: ten, found: found, rule: rule, subject: "a:-"}
	switch {
	case found:
		r.subject = "t:" + ten.ID()
	case k.addr.IsValid():
		r.subject = "a:" + k.addr.String()
	}
	r.key = r.subject + ":" + rule.ID
	if rule.Meter != nil {
		r.meterKey = r.subject + ":" + rule.Meter.ID
		if l.o.dryRun {
			// A dry run meters in buckets of its own, so that the debt
			// its overruns build is never inherited by enforcement.
			r.meterKey = dryRunPrefix + r.meterKey
		}
	}
	r.flow = flowOf(ten, rule, r.subject)
	l.routes.Add(k, r)
	return r
}

// flowOf returns the overload controller's flow of calls held to rule for
// ten, keyed by subject.
func flowOf(ten *tenant.Tenant, rule tenant.Rule, subject string) overload.Flow {
	prio := ten.Priority()
	if rule.Ranked {
		prio = rule.Priority
	}
	return overload.Flow{Key: subject, Weight: ten.Weight(), Priority: prio}
}
