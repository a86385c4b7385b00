package floodgatetest_test

import (
	"fmt"
	"time"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/floodgatetest"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// A test of a quota config: the free tier gets 5 calls a second with a
// burst of 5, anonymous callers 1 a second; under CPU saturation every
// limit drops to a fifth. In a test, use floodgatetest.New(t, …) and assert
// on the counts instead of printing them.
func Example() {
	key := "free-tenant-key-0123456789"
	digest, _ := tenant.HashKey(key)
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers:     map[string]tenant.TierSpec{"free": {Default: &tenant.LimitSpec{Rate: 5, Burst: 5}}},
		Tenants:   map[string]tenant.TenantSpec{"acme": {Tier: "free", Keys: []string{digest}}},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 1}},
	})
	if err != nil {
		panic(err)
	}
	h, err := floodgatetest.Start(floodgatetest.Config{
		Tables:  middleware.Static(tbl),
		Methods: []string{"/inventory.v1.Inventory/Get"},
		Policy:  cpugate.Fixed{},
	})
	if err != nil {
		panic(err)
	}
	defer h.Close()

	acme := h.Tenant(key)
	stranger := h.Anonymous("203.0.113.9")
	counts := h.Run(2*time.Second, 100*time.Millisecond,
		floodgatetest.Load{Caller: acme, Method: "/inventory.v1.Inventory/Get", Rate: 20},
		floodgatetest.Load{Caller: stranger, Method: "/inventory.v1.Inventory/Get", Rate: 20},
	)
	fmt.Printf("acme:     %+v\n", counts[0])
	fmt.Printf("stranger: %+v\n", counts[1])

	h.SetCPU(0.95)
	h.Advance(time.Second)
	fmt.Printf("acme under CPU saturation: %+v\n", acme.CallN("/inventory.v1.Inventory/Get", 5))
	// Output:
	// acme:     {OK:14 ResourceExhausted:26 Unavailable:0 Other:0}
	// stranger: {OK:2 ResourceExhausted:38 Unavailable:0 Other:0}
	// acme under CPU saturation: {OK:1 ResourceExhausted:0 Unavailable:4 Other:0}
}
