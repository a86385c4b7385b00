package floodgatetest_test

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/floodgatetest"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const method = "/inventory.v1.Inventory/Get"

// tenants returns a table of n tenants "t0"… with keys "key-0"…, each at
// 10 calls/s with a burst of 10, and anonymous callers at 1/s.
func tenants(t *testing.T, n int) *tenant.Table {
	t.Helper()
	cfg := &tenant.Config{
		Tiers:     map[string]tenant.TierSpec{"standard": {Default: &tenant.LimitSpec{Rate: 10, Burst: 10}}},
		Tenants:   map[string]tenant.TenantSpec{},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 1}},
	}
	for i := range n {
		h, err := tenant.HashKey("key-" + strconv.Itoa(i) + "-0123456789")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Tenants["t"+strconv.Itoa(i)] = tenant.TenantSpec{Tier: "standard", Keys: []string{h}}
	}
	tbl, err := tenant.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func key(i int) string { return "key-" + strconv.Itoa(i) + "-0123456789" }

// TestNoisyTenant: one tenant at 10× its quota while nine others stay
// within theirs. The quiet tenants see no rejection; the noisy one gets its
// quota and no more.
func TestNoisyTenant(t *testing.T) {
	h := floodgatetest.New(t, floodgatetest.Config{Tables: middleware.Static(tenants(t, 10)), Methods: []string{method}})
	loads := []floodgatetest.Load{{Caller: h.Tenant(key(0)), Method: method, Rate: 100}}
	for i := 1; i < 10; i++ {
		loads = append(loads, floodgatetest.Load{Caller: h.Tenant(key(i)), Method: method, Rate: 8})
	}
	counts := h.Run(5*time.Second, 100*time.Millisecond, loads...)
	for i, c := range counts[1:] {
		if c.Rejected() != 0 || c.OK != 40 {
			t.Errorf("quiet tenant t%d: %+v, want 40 admitted and none rejected", i+1, c)
		}
	}
	noisy := counts[0]
	// Burst 10 plus 10/s over the 4.9 s between the first and last step.
	if noisy.Total() != 500 || noisy.OK < 55 || noisy.OK > 60 || noisy.ResourceExhausted != noisy.Rejected() {
		t.Errorf("noisy tenant: %+v, want 500 calls, 55 to 60 admitted, the rest RESOURCE_EXHAUSTED", noisy)
	}
}

// TestCPUSaturation is the classic scenario: a tenant within its quota,
// CPU at 90% then back to 30%. While hot and for the whole 5 s cooldown
// after the last hot reading the tenant is held to the scaled rate (0.2 ×
// 10/s) and rejected with UNAVAILABLE; then full limits return.
func TestCPUSaturation(t *testing.T) {
	h := floodgatetest.New(t, floodgatetest.Config{
		Tables:  middleware.Static(tenants(t, 1)),
		Methods: []string{method},
		Policy:  cpugate.Fixed{},
	})
	load := floodgatetest.Load{Caller: h.Tenant(key(0)), Method: method, Rate: 10}
	step := 100 * time.Millisecond
	second := func() floodgatetest.Counts { return h.Run(time.Second, step, load)[0] }

	h.SetCPU(0.3)
	for i := range 2 {
		if c := second(); c.OK != 10 {
			t.Fatalf("calm second %d: %+v, want all 10 admitted", i, c)
		}
	}
	h.SetCPU(0.9)
	var hot floodgatetest.Counts
	for range 2 {
		hot = hot.Plus(second())
	}
	// The scaled limit is 2/s with a burst of 2: the bucket is capped at 2
	// when the gate closes, then gains 2 tokens a second.
	if hot.OK < 5 || hot.OK > 6 || hot.Unavailable != 20-hot.OK {
		t.Errorf("hot 2 s: %+v, want 5 or 6 admitted and the rest UNAVAILABLE", hot)
	}
	h.SetCPU(0.3)
	for i := range 4 {
		c := second()
		if c.OK < 1 || c.OK > 3 || c.Unavailable != 10-c.OK {
			t.Errorf("cooldown second %d: %+v, want about 2 admitted, the rest UNAVAILABLE", i, c)
		}
		if got := h.Gate().State(); got != cpugate.Shedding {
			t.Errorf("cooldown second %d: gate %v, want shedding", i, got)
		}
	}
	_ = second() // the cooldown ends during this second
	if got := h.Gate().State(); got != cpugate.Open {
		t.Fatalf("after the cooldown: gate %v, want open", got)
	}
	if c := second(); c.OK < 9 {
		t.Errorf("after the cooldown: %+v, want the full rate back", c)
	}
}

// TestHarnessBasics covers the harness's own plumbing: addresses, unknown
// keys, methods it does not serve, anonymous callers.
func TestHarnessBasics(t *testing.T) {
	var admitted atomic.Int64 // by the observer, on the server's goroutines
	count := middleware.WithObserver(func(e middleware.Event) {
		if e.Reason == middleware.ReasonAdmitted {
			admitted.Add(1)
		}
	})
	h := floodgatetest.New(t, floodgatetest.Config{Tables: middleware.Static(tenants(t, 1)), Methods: []string{method, "/other.v1.Svc/Do"},
		Options: []middleware.Option{count}})
	a, b := h.Anonymous("198.51.100.1"), h.Anonymous("2001:db8::1")
	got := []floodgatetest.Counts{a.CallN(method, 3), b.CallN(method, 3), a.From("198.51.100.2").CallN(method, 3)}
	want := []floodgatetest.Counts{{OK: 1, ResourceExhausted: 2}, {OK: 1, ResourceExhausted: 2}, {OK: 1, ResourceExhausted: 2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("anonymous callers (-want +got):\n%s", diff)
	}
	// A made-up key from a drained address is the same anonymous caller.
	if c := h.Tenant("made-up-key-0123456789").From("198.51.100.1").CallN(method, 2); c.OK != 0 {
		t.Errorf("made-up key: %+v, want the address's empty bucket", c)
	}
	if err := a.Call("/not.Served/X"); status.Code(err) != codes.Unimplemented {
		t.Errorf("unserved method: %v", err)
	}
	// Other methods share the tenant's default bucket.
	h.Advance(time.Second)
	if c := h.Tenant(key(0)).CallN("/other.v1.Svc/Do", 12); c.OK != 10 {
		t.Errorf("tenant on another method: %+v, want its burst of 10", c)
	}
	if got := admitted.Load(); got != 13 {
		t.Errorf("observed %d admitted calls, want 13", got)
	}
	if _, err := floodgatetest.Start(floodgatetest.Config{}); err == nil {
		t.Error("Start without tables succeeded")
	}
	if _, err := floodgatetest.Start(floodgatetest.Config{Tables: middleware.Static(tenants(t, 1)), Methods: []string{"nope"}}); err == nil {
		t.Error("Start with a malformed method succeeded")
	}
}

// TestCapacityRepeats: with a capacity, the same calls give the same
// outcomes in every harness, though each store seeds its hashing anew.
func TestCapacityRepeats(t *testing.T) {
	seen := map[string]int{}
	for range 20 {
		h, err := floodgatetest.Start(floodgatetest.Config{Tables: middleware.Static(tenants(t, 1)), Methods: []string{method}, Capacity: 32})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 32 { // fill the store with drained buckets
			h.Anonymous("198.51.100." + strconv.Itoa(i+1)).Call(method)
		}
		pattern := ""
		for i := range 4 {
			if h.Anonymous("203.0.113."+strconv.Itoa(i+1)).Call(method) == nil {
				pattern += "Y"
			} else {
				pattern += "n"
			}
		}
		seen[pattern]++
		h.Close()
	}
	if len(seen) != 1 {
		t.Errorf("the same calls admitted new callers differently: %v", seen)
	}
}

// TestMisuse: calls that could not mean what they seem to fail loudly.
func TestMisuse(t *testing.T) {
	tbl := middleware.Static(tenants(t, 1))
	h := floodgatetest.New(t, floodgatetest.Config{Tables: tbl, Methods: []string{method}})
	other := floodgatetest.New(t, floodgatetest.Config{Tables: tbl, Methods: []string{method}})
	for name, f := range map[string]func(){
		"Anonymous(not an address)": func() { h.Anonymous("not-an-address") },
		"Anonymous(a prefix)":       func() { h.Anonymous("198.51.100.7/24") },
		"From(empty)":               func() { h.Tenant(key(0)).From("") },
		"From(zoned)":               func() { h.Tenant(key(0)).From("fe80::1%eth0") },
		"Run(step not dividing d)":  func() { h.Run(time.Second, 300*time.Millisecond) },
		"Run(another harness's caller)": func() {
			h.Run(time.Second, 100*time.Millisecond, floodgatetest.Load{Caller: other.Tenant(key(0)), Method: method, Rate: 1})
		},
		"Run(no caller)": func() { h.Run(time.Second, 100*time.Millisecond, floodgatetest.Load{Method: method, Rate: 1}) },
		"Run(unknown method)": func() {
			h.Run(time.Second, 100*time.Millisecond, floodgatetest.Load{Caller: h.Tenant(key(0)), Method: "/x.Y/Z", Rate: 1})
		},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("%s did not panic", name)
				} else if msg, _ := r.(string); !strings.HasPrefix(msg, "floodgatetest: ") {
					t.Errorf("%s panicked with %v, want a floodgatetest message", name, r)
				}
			}()
			f()
		}()
	}
	if _, err := floodgatetest.Start(floodgatetest.Config{Tables: tbl, Capacity: -1}); err == nil {
		t.Error("Start with a negative capacity succeeded")
	}
	var reg *tenant.Registry
	if _, err := floodgatetest.Start(floodgatetest.Config{Tables: reg}); err == nil {
		t.Error("Start with a nil *tenant.Registry succeeded")
	}
}
