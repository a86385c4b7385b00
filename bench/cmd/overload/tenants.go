package main

import (
	"fmt"
	"math"

	"github.com/floodgate-go/floodgate/tenant"
)

// The tenants: tenant-0 is heavy, sending half of the traffic; the other
// nine share the other half equally.
const (
	numTenants  = 10
	heavyShare  = 0.5
	heavyTenant = 0
)

// share returns tenant i's share of the offered load.
func share(i int) float64 {
	if i == heavyTenant {
		return heavyShare
	}
	return (1 - heavyShare) / (numTenants - 1)
}

// apiKey is tenant i's API key.
func apiKey(i int) string { return fmt.Sprintf("overload-key-%d", i) }

// rejectKey and rejectTenant are the rejection-cost scenario's caller.
const (
	rejectKey    = "overload-key-reject"
	rejectTenant = "tenant-reject"
)

// tenantID is tenant i's ID.
func tenantID(i int) string { return fmt.Sprintf("tenant-%d", i) }

// Quota rule (variants B, C and D), in calls per second of Allocate with
// capacity the measured capacity:
//
//   - the heavy tenant's quota is heavyHeadroom × its share of capacity
//     (0.75 × capacity): it can use half the server and then some;
//   - each light tenant's quota is lightHeadroom × its share of capacity
//     (4/18 ≈ 0.22 × capacity), sized in the spirit of
//     testdata/multitenant/tenants.yaml's steady tenants: even at Fixed's
//     factor (scale 0.2) the quota still covers the tenant's traffic at
//     0.8× capacity.
//
// Together the quotas are overbooked (2.75 × capacity), as real contracts
// are: the buckets alone keep each tenant to its contract, and the CPU gate
// scales them all down when the server runs hot. Every bucket holds half a
// second of its rate.
const (
	heavyHeadroom = 1.5
	lightHeadroom = 4.0
	burstSeconds  = 0.5
)

// quota returns tenant i's quota in calls per second.
func quota(i int, capacity float64) float64 {
	if i == heavyTenant {
		return heavyHeadroom * share(i) * capacity
	}
	return lightHeadroom * share(i) * capacity
}

// tenantTable returns the tenant table of the quota rule.
func tenantTable(capacity float64) (*tenant.Table, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("the quotas need a capacity, got %v", capacity)
	}
	cfg := &tenant.Config{Tenants: map[string]tenant.TenantSpec{}}
	for i := range numTenants {
		digest, err := tenant.HashKey(apiKey(i))
		if err != nil {
			return nil, err
		}
		r := quota(i, capacity)
		cfg.Tenants[tenantID(i)] = tenant.TenantSpec{
			Keys:    []string{digest},
			Default: &tenant.LimitSpec{Rate: r, Burst: max(int(math.Ceil(r*burstSeconds)), 2)},
		}
	}
	// The rejection-cost scenario's caller: a quota so small that nearly
	// every one of its calls is rejected. No other scenario uses it.
	digest, err := tenant.HashKey(rejectKey)
	if err != nil {
		return nil, err
	}
	cfg.Tenants[rejectTenant] = tenant.TenantSpec{Keys: []string{digest}, Default: &tenant.LimitSpec{Rate: 1, Burst: 1}}
	// Callers without a key (none in this experiment) get little.
	cfg.Anonymous = &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 1}}
	return tenant.Compile(cfg)
}
