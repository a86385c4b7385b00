package rls

import (
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/floodgate-go/floodgate/tenant"
)

// Descriptor entry keys of a domain served from a tenant config.
const (
	// TenantKeyEntry carries the caller's API key, as sent: it is hashed
	// and looked up among the tenants' key digests.
	TenantKeyEntry = "api_key"
	// TenantIDEntry carries a tenant ID, for callers identified otherwise.
	TenantIDEntry = "tenant"
	// MethodEntry carries the gRPC full method, "/pkg.Svc/Method" (an
	// HTTP path also works: it is matched as a method would be).
	MethodEntry = "method"
	// AddressEntry carries the client's address, which keys anonymous
	// callers' buckets.
	AddressEntry = "remote_address"
)

// resolveTenant resolves a descriptor of a tenant domain: the tenant from
// its api_key or tenant entry (anonymous without one, or with an unknown
// one), the rule from its method entry, and the bucket the floodgate
// middleware uses for the same tenant and rule ("t:<id>:<rule>", or
// "a:<address>:<rule>"), so that the service and the library share
// buckets on a shared store.
func (s *Service) resolveTenant(dom *domain, entries []*rlpb.RateLimitDescriptor_Entry, m *match) bool {
	var (
		ten          *tenant.Tenant
		found        bool
		method, addr string
	)
	for _, e := range entries {
		switch e.GetKey() {
		case TenantKeyEntry:
			if !found {
				ten, found = dom.tenants.TenantByKey(e.GetValue())
			}
		case TenantIDEntry:
			if !found {
				ten, found = dom.tenants.TenantByID(e.GetValue())
			}
		case MethodEntry:
			method = e.GetValue()
		case AddressEntry:
			addr = e.GetValue()
		}
	}
	if ten == nil {
		ten = dom.tenants.Anonymous()
	}
	rule := ten.Rule(method)
	subject := "a:-"
	switch {
	case found:
		subject = "t:" + ten.ID()
	case addr != "":
		subject = "a:" + addr
	}
	rpu, unit := responseLimit(rule.Limit)
	*m = match{rule: dom.tenantRule, limit: rule.Limit, cost: rule.Cost, key: subject + ":" + rule.ID,
		rpu: rpu, unit: unit, top: dom.name + "." + subject + ":" + rule.Pattern}
	if rule.Limit.IsInf() {
		m.rule = &unlimitedTenantRule
	}
	return true
}

var unlimitedTenantRule = rule{id: -1, unlimited: true}
