package tenant_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/floodgate-go/floodgate/tenant"
)

// benchTable builds a table of n tenants spread over two tiers, every
// tenant with one key and every tenth with its own override, and returns
// the digests of all keys.
func benchTable(b *testing.B, n int) (*tenant.Table, [][32]byte) {
	b.Helper()
	cfg := &tenant.Config{
		Tiers: map[string]tenant.TierSpec{
			"free": {Default: lim(10), Methods: map[string]tenant.MethodSpec{
				svcPat: {Limit: lim(5)},
				export: {Limit: lim(2)},
				search: {Cost: 2},
			}},
			"pro": {Default: lim(100), Methods: map[string]tenant.MethodSpec{export: {Limit: lim(20)}}},
		},
		Tenants: make(map[string]tenant.TenantSpec, n),
	}
	digests := make([][32]byte, n)
	for i := range n {
		key := "bench-key-" + strconv.Itoa(i)
		hash, err := tenant.HashKey(key)
		if err != nil {
			b.Fatal(err)
		}
		spec := tenant.TenantSpec{Tier: "free", Keys: []string{hash}}
		if i%2 == 1 {
			spec.Tier = "pro"
		}
		if i%10 == 0 {
			spec.Methods = map[string]tenant.MethodSpec{search: {Limit: lim(50)}}
		}
		cfg.Tenants["t"+strconv.Itoa(i)] = spec
		digests[i] = tenant.Digest(key)
	}
	tbl, err := tenant.Compile(cfg)
	if err != nil {
		b.Fatal(err)
	}
	// An empty or mis-keyed table would measure misses only.
	for _, d := range digests {
		if _, ok := tbl.TenantByDigest(d); !ok {
			b.Fatal("benchmark table does not hold its own keys")
		}
	}
	return tbl, digests
}

var sinkRule tenant.Rule

// BenchmarkLookup measures identity + method → rule, the middleware's
// per-call work once the key is hashed: TenantByDigest then Rule. Keys
// rotate over all tenants so that large tables pay their cache misses.
func BenchmarkLookup(b *testing.B) {
	methods := []struct{ name, method string }{
		{"exact", export},
		{"service", list},
		{"fallback", foreign},
	}
	for _, n := range []int{10, 1000, 100000} {
		tbl, digests := benchTable(b, n)
		for _, m := range methods {
			b.Run("tenants="+strconv.Itoa(n)+"/"+m.name, func(b *testing.B) {
				b.ReportAllocs()
				var r tenant.Rule
				i := 0
				for b.Loop() {
					tn, _ := tbl.TenantByDigest(digests[i])
					r = tn.Rule(m.method)
					if i++; i == len(digests) {
						i = 0
					}
				}
				sinkRule = r
			})
		}
	}
}

// BenchmarkLookupParallel is BenchmarkLookup on every core at once.
func BenchmarkLookupParallel(b *testing.B) {
	tbl, digests := benchTable(b, 1000)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var r tenant.Rule
		i := 0
		for pb.Next() {
			tn, _ := tbl.TenantByDigest(digests[i])
			r = tn.Rule(export)
			if i++; i == len(digests) {
				i = 0
			}
		}
		sinkRule = r
	})
}

// BenchmarkTenantByKey is the lookup from a raw key, SHA-256 included.
func BenchmarkTenantByKey(b *testing.B) {
	tbl, _ := benchTable(b, 1000)
	for _, size := range []int{32, 64, 128} {
		raw := make([]byte, size)
		for i := range raw {
			raw[i] = 'a' + byte(i%26)
		}
		// Converted once: a conversion in the loop would allocate and be
		// charged to the lookup.
		key := string(raw)
		b.Run("keylen="+strconv.Itoa(size), func(b *testing.B) {
			b.ReportAllocs()
			var r tenant.Rule
			for b.Loop() {
				tn, _ := tbl.TenantByKey(key)
				r = tn.Rule(export)
			}
			sinkRule = r
		})
	}
}

// BenchmarkParse measures a reload of the example config (not a hot path).
func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile(filepath.Join(testdata, "valid", "tenants.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tenant.Parse("tenants.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}
