package tenant_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/floodgate-go/floodgate/tenant"
)

const exampleConfig = `
tiers:
  free:
    default: {rate: 10, burst: 20}
    methods:
      "/inventory.v1.Inventory/Export": {rate: 2, burst: 2, per: 1m}
      "/inventory.v1.Inventory/Search": {cost: 2}
tenants:
  acme:
    tier: free
    keys: [52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32]
anonymous:
  default: {rate: 1, burst: 5}
`

// The middleware's lookup: identity, then the rule for the method.
func Example() {
	tbl, err := tenant.Parse("tenants.yaml", []byte(exampleConfig))
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"demo-key-acme-1", "made-up-key"} {
		tn, known := tbl.TenantByKey(key)
		for _, m := range []string{"/inventory.v1.Inventory/Export", "/inventory.v1.Inventory/Search"} {
			r := tn.Rule(m)
			fmt.Printf("known=%v tenant=%q %s: %v, cost %d, bucket %s (%s)\n",
				known, tn.ID(), m, r.Limit, r.Cost, r.ID, r.Pattern)
		}
	}
	// Output:
	// known=true tenant="acme" /inventory.v1.Inventory/Export: 0.03333333333333333/s burst 2, cost 1, bucket 486913b4 (/inventory.v1.Inventory/Export)
	// known=true tenant="acme" /inventory.v1.Inventory/Search: 10/s burst 20, cost 2, bucket 37a8eec1 (default)
	// known=false tenant="" /inventory.v1.Inventory/Export: 1/s burst 5, cost 1, bucket 37a8eec1 (default)
	// known=false tenant="" /inventory.v1.Inventory/Search: 1/s burst 5, cost 1, bucket 37a8eec1 (default)
}

func ExampleParse_errors() {
	_, err := tenant.Parse("tenants.yaml", []byte(`
tiers:
  free:
    default: {rate: 10}
    methods:
      "/x.Y/Z": {rate: 0, burst: 5}
tenants:
  acme:
    tier: gold
    keys: [my-secret-key]
`))
	var ce *tenant.ConfigError
	if errors.As(err, &ce) {
		for _, fe := range ce.Errors {
			fmt.Println(fe)
		}
	}
	// Output:
	// tenants.yaml:4: tiers.free.default.burst: required
	// tenants.yaml:6: tiers.free.methods["/x.Y/Z"].rate: must be > 0
	// tenants.yaml:9: tenants.acme.tier: unknown tier "gold"
	// tenants.yaml:10: tenants.acme.keys[0]: not a SHA-256 hex digest (64 hex digits): store the hash of the key, never the key (go run ./cmd/floodgate-keyhash)
}

func ExampleCompile() {
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{
			"free": {Default: &tenant.LimitSpec{Rate: 100, Burst: 100, Per: time.Minute}},
		},
		Tenants: map[string]tenant.TenantSpec{"acme": {Tier: "free"}},
	})
	if err != nil {
		panic(err)
	}
	acme, _ := tbl.TenantByID("acme")
	fmt.Println(acme.Tier(), acme.Rule("/any.Service/Method").Limit)
	// Output: free 1.6666666666666667/s burst 100
}

func ExampleHashKey() {
	hash, err := tenant.HashKey("demo-key-acme-1")
	if err != nil {
		panic(err)
	}
	fmt.Println(hash)
	// Output: 52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32
}

func ExampleRegistry() {
	dir, err := os.MkdirTemp("", "tenant-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tenants.yaml")
	if err := os.WriteFile(path, []byte(exampleConfig), 0o644); err != nil {
		panic(err)
	}

	reg, err := tenant.New(tenant.WithOnReload(func(_ string, t *tenant.Table, err error) {
		fmt.Printf("reload: %d tenants, error %v\n", len(t.Tenants()), err != nil)
	}))
	if err != nil {
		panic(err)
	}
	if err := reg.Load(path); err != nil {
		panic(err)
	}
	// A broken edit is rejected and the table in force stays.
	if err := os.WriteFile(path, []byte("tenants: {acme: {tier: gold}}"), 0o644); err != nil {
		panic(err)
	}
	_ = reg.Load(path)
	tn, ok := reg.Table().TenantByKey("demo-key-acme-1")
	fmt.Println(tn.ID(), ok)
	// In a server: go reg.Watch(ctx, path), and reg.Table() on every call.

	// Output:
	// reload: 1 tenants, error false
	// reload: 1 tenants, error true
	// acme true
}

// A metered quota beside the call limit: the rule's Meter, with its own
// bucket, estimate and chunk.
func ExampleMeter() {
	tbl, err := tenant.Parse("tenants.yaml", []byte(`
anonymous:
  default: {rate: 50, burst: 100}
  methods:
    "/llm.v1.Completions/*":
      metered: {unit: tokens, rate: 100000, per: 1m, burst: 20000, estimate: 4000, estimate_header: x-max-tokens}
`))
	if err != nil {
		panic(err)
	}
	r := tbl.Anonymous().Rule("/llm.v1.Completions/Generate")
	m := r.Meter
	fmt.Printf("calls: %v, bucket %s\n", r.Limit, r.ID)
	fmt.Printf("%s: %v, debt limit %d, estimate %d (or %s), chunk %d, bucket %s\n",
		m.Unit, m.Limit, m.Limit.DebtLimit(), m.Estimate, m.EstimateHeader, m.Chunk, m.ID)
	// Output:
	// calls: 50/s burst 100, bucket 37a8eec1
	// tokens: 1666.6666666666667/s burst 20000, debt limit 20000, estimate 4000 (or x-max-tokens), chunk 4000, bucket 4f5a08a0
}
