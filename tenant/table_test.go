package tenant_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

const (
	export  = "/inventory.v1.Inventory/Export"
	search  = "/inventory.v1.Inventory/Search"
	list    = "/inventory.v1.Inventory/ListItems"
	foreign = "/other.v1.Other/Call"
	svcPat  = "/inventory.v1.Inventory/*"
)

// id mirrors the documented rule ID derivation, so that tests pin it.
func id(pattern string) string {
	sum := sha256.Sum256([]byte(pattern))
	return hex.EncodeToString(sum[:4])
}

func rule(rate float64, burst, cost int, pattern string) tenant.Rule {
	return tenant.Rule{Limit: floodgate.PerSecond(rate, burst), Cost: cost, ID: id(pattern), Pattern: pattern}
}

func parseFile(t testing.TB, rel string) *tenant.Table {
	t.Helper()
	path := filepath.Join(testdata, rel)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := tenant.Parse(filepath.Base(path), data)
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// TestExampleConfig walks the documented example config through every
// level of the precedence.
func TestExampleConfig(t *testing.T) {
	tbl := parseFile(t, "valid/tenants.yaml")
	tests := []struct {
		tenant string // "" for anonymous
		method string
		want   tenant.Rule
	}{
		// acme: pro tier, its own Export limit.
		{"acme", export, rule(10, 20, 1, export)},        // tenant method
		{"acme", search, rule(100, 200, 2, "default")},   // tier default, tier cost
		{"acme", list, rule(100, 200, 1, "default")},     // tier default
		{"acme", foreign, rule(100, 200, 1, "default")},  // tier default
		{"globex", export, rule(2.0/60, 2, 1, export)},   // tier method, per: 1m
		{"globex", search, rule(5, 10, 2, svcPat)},       // tier service wildcard, tier cost
		{"globex", list, rule(5, 10, 1, svcPat)},         // tier service wildcard
		{"globex", foreign, rule(10, 20, 1, "default")},  // tier default
		{"initech", export, rule(50, 100, 1, "default")}, // tenant default shadows tier method
		{"initech", search, rule(50, 100, 2, "default")}, // ... but tier costs still apply
		{"initech", foreign, rule(50, 100, 1, "default")},
		{"", export, rule(1.0/3600, 1, 1, export)},
		{"", list, rule(1, 5, 1, "default")},
	}
	for _, tt := range tests {
		t.Run(tt.tenant+tt.method, func(t *testing.T) {
			tn := tbl.Anonymous()
			if tt.tenant != "" {
				var ok bool
				if tn, ok = tbl.TenantByID(tt.tenant); !ok {
					t.Fatalf("TenantByID(%q) not found", tt.tenant)
				}
			}
			if diff := cmp.Diff(tt.want, tn.Rule(tt.method)); diff != "" {
				t.Errorf("%q.Rule(%q) mismatch (-want +got):\n%s", tt.tenant, tt.method, diff)
			}
		})
	}
}

func lim(n float64) *tenant.LimitSpec { return &tenant.LimitSpec{Rate: n, Burst: int(n)} }

// TestPrecedence pins tenant method > tenant default > tier method > tier
// default, and exact > service wildcard > "*" within a level, for limits
// and (independently) for costs.
func TestPrecedence(t *testing.T) {
	cfg := &tenant.Config{
		Tiers: map[string]tenant.TierSpec{
			"t": {Methods: map[string]tenant.MethodSpec{
				"*":      {Limit: lim(2)},
				"/a.S/*": {Limit: lim(3), Cost: 2},
				"/a.S/M": {Limit: lim(4)},
			}},
			"d": {Default: lim(5), Methods: map[string]tenant.MethodSpec{"*": {Cost: 3}}},
		},
		Tenants: map[string]tenant.TenantSpec{
			"x":     {Tier: "t", Methods: map[string]tenant.MethodSpec{"/a.S/N": {Limit: lim(5)}}},
			"y":     {Tier: "t", Methods: map[string]tenant.MethodSpec{"/a.S/*": {Limit: lim(6)}, "*": {Limit: lim(7)}}},
			"z":     {Tier: "t", Default: lim(8), Methods: map[string]tenant.MethodSpec{"/a.S/M": {Limit: lim(9)}}},
			"w":     {Tier: "t", Methods: map[string]tenant.MethodSpec{"/a.S/M": {Cost: 4}}},
			"v":     {Tier: "d", Methods: map[string]tenant.MethodSpec{"/b.S/*": {Limit: lim(10), Cost: 5}}},
			"u":     {Methods: map[string]tenant.MethodSpec{"*": {Limit: lim(11)}}}, // no tier
			"plain": {Tier: "t"},
		},
	}
	tbl, err := tenant.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tenant, method string
		want           tenant.Rule
	}{
		{"plain", "/a.S/M", rule(4, 4, 2, "/a.S/M")}, // tier exact; cost from tier service
		{"plain", "/a.S/O", rule(3, 3, 2, "/a.S/*")}, // tier service
		{"plain", "/b.S/M", rule(2, 2, 1, "*")},      // tier "*"
		{"plain", "not-a-method", rule(2, 2, 1, "*")},
		{"plain", "/a.S/M/extra", rule(2, 2, 1, "*")},
		{"x", "/a.S/N", rule(5, 5, 2, "/a.S/N")}, // tenant exact beats tier service
		{"x", "/a.S/M", rule(4, 4, 2, "/a.S/M")}, // tier exact
		{"x", "/a.S/O", rule(3, 3, 2, "/a.S/*")},
		{"y", "/a.S/M", rule(6, 6, 2, "/a.S/*")}, // tenant service beats tier exact
		{"y", "/b.S/Q", rule(7, 7, 1, "*")},      // tenant "*" beats tier "*"
		{"z", "/a.S/M", rule(9, 9, 2, "/a.S/M")},
		{"z", "/a.S/O", rule(8, 8, 2, "default")}, // tenant default beats tier service
		{"z", "/c.S/M", rule(8, 8, 1, "default")},
		{"w", "/a.S/M", rule(4, 4, 4, "/a.S/M")}, // cost-only tenant entry keeps the tier's bucket
		{"w", "/a.S/O", rule(3, 3, 2, "/a.S/*")},
		{"v", "/b.S/M", rule(10, 10, 5, "/b.S/*")}, // tenant service beats tier default
		{"v", "/c.S/M", rule(5, 5, 3, "default")},  // cost from tier "*", limit from tier default
		{"u", "/a.S/M", rule(11, 11, 1, "*")},
	}
	for _, tt := range tests {
		t.Run(tt.tenant+tt.method, func(t *testing.T) {
			tn, ok := tbl.TenantByID(tt.tenant)
			if !ok {
				t.Fatalf("TenantByID(%q) not found", tt.tenant)
			}
			if diff := cmp.Diff(tt.want, tn.Rule(tt.method)); diff != "" {
				t.Errorf("%q.Rule(%q) mismatch (-want +got):\n%s", tt.tenant, tt.method, diff)
			}
		})
	}
}

func TestRuleIDs(t *testing.T) {
	tbl := parseFile(t, "valid/tenants.yaml")
	globex, _ := tbl.TenantByID("globex")
	ids := map[string]string{}
	for _, m := range []string{export, search, list, foreign} {
		r := globex.Rule(m)
		if len(r.ID) != 8 || strings.Trim(r.ID, "0123456789abcdef") != "" {
			t.Errorf("Rule(%q).ID = %q, want 8 lower-case hex digits", m, r.ID)
		}
		if p, ok := ids[r.ID]; ok && p != r.Pattern {
			t.Errorf("patterns %q and %q share ID %q", p, r.Pattern, r.ID)
		}
		ids[r.ID] = r.Pattern
	}
	if got, want := len(ids), 3; got != want { // export, svcPat, default
		t.Errorf("globex has %d distinct rule IDs, want %d", got, want)
	}
	// The ID depends on the pattern only: the same in another table and
	// for another tenant with a different limit from the same pattern.
	again := parseFile(t, "valid/tenants.json")
	acme, _ := again.TenantByID("acme")
	if got, want := acme.Rule(export).ID, globex.Rule(export).ID; got != want {
		t.Errorf("acme Export ID %q != globex Export ID %q", got, want)
	}
}

// TestYAMLAndJSONAgree checks that the two formats of the example compile
// to the same rules.
func TestYAMLAndJSONAgree(t *testing.T) {
	y, j := parseFile(t, "valid/tenants.yaml"), parseFile(t, "valid/tenants.json")
	ids := func(tb *tenant.Table) []string {
		var out []string
		for _, tn := range tb.Tenants() {
			out = append(out, tn.ID()+"/"+tn.Tier())
		}
		return out
	}
	if diff := cmp.Diff(ids(y), ids(j)); diff != "" {
		t.Fatalf("tenants differ (-yaml +json):\n%s", diff)
	}
	for _, yt := range append(y.Tenants(), y.Anonymous()) {
		jt := j.Anonymous()
		if !yt.IsAnonymous() {
			jt, _ = j.TenantByID(yt.ID())
		}
		for _, m := range []string{export, search, list, foreign} {
			if diff := cmp.Diff(yt.Rule(m), jt.Rule(m)); diff != "" {
				t.Errorf("%q.Rule(%q) differs (-yaml +json):\n%s", yt.ID(), m, diff)
			}
		}
	}
}

func TestIdentity(t *testing.T) {
	tbl := parseFile(t, "valid/tenants.yaml")
	tests := []struct {
		name, key, want string // want "" for anonymous
	}{
		{"first key", "demo-key-acme-1", "acme"},
		{"second key", "demo-key-acme-2", "acme"},
		{"other tenant", "demo-key-globex", "globex"},
		{"unknown", "demo-key-acme-3", ""},
		{"the digest itself", "52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32", ""},
		{"empty", "", ""},
		{"space", "demo-key-acme-1 ", ""},
		{"non-ASCII", "demo-key-acme-1\u00e9", ""},
		{"control", "demo-key\x00", ""},
		{"too long", strings.Repeat("k", tenant.MaxKeyLen+1), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tn, ok := tbl.TenantByKey(tt.key)
			if got, want := ok, tt.want != ""; got != want {
				t.Errorf("TenantByKey(%q) ok = %v, want %v", tt.key, got, want)
			}
			if got := tn.ID(); got != tt.want {
				t.Errorf("TenantByKey(%q) = %q, want %q", tt.key, got, tt.want)
			}
			if got, want := tn.IsAnonymous(), tt.want == ""; got != want {
				t.Errorf("TenantByKey(%q).IsAnonymous() = %v, want %v", tt.key, got, want)
			}
			if tt.want == "" && tn != tbl.Anonymous() {
				t.Errorf("TenantByKey(%q) is not the table's anonymous policy", tt.key)
			}
			if tt.want != "" {
				byDigest, ok := tbl.TenantByDigest(tenant.Digest(tt.key))
				if !ok || byDigest != tn {
					t.Errorf("TenantByDigest(Digest(%q)) = %v, %v; want the same tenant", tt.key, byDigest.ID(), ok)
				}
			}
		})
	}
	if tn, ok := tbl.TenantByID("nobody"); ok || !tn.IsAnonymous() {
		t.Errorf("TenantByID(nobody) = %q, %v; want anonymous, false", tn.ID(), ok)
	}
	if tn, ok := tbl.TenantByID(""); ok || !tn.IsAnonymous() {
		t.Errorf("TenantByID(\"\") = %q, %v; want anonymous, false", tn.ID(), ok)
	}
}

func TestHashKey(t *testing.T) {
	got, err := tenant.HashKey("demo-key-acme-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32"; got != want {
		t.Errorf("HashKey = %s, want %s", got, want)
	}
	for _, bad := range []string{"", "a b", "caf\u00e9", strings.Repeat("k", tenant.MaxKeyLen+1)} {
		if _, err := tenant.HashKey(bad); err != tenant.ErrMalformedKey {
			t.Errorf("HashKey(%q) error = %v, want ErrMalformedKey", bad, err)
		}
	}
}

func TestNoAnonymousPolicyFailsClosed(t *testing.T) {
	tbl, err := tenant.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := tbl.Anonymous().Rule(export)
	if !r.Limit.IsZero() || r.Cost != 1 {
		t.Errorf("anonymous rule without a policy = %+v, want the zero limit at cost 1", r)
	}
	if n := len(tbl.Tenants()); n != 0 {
		t.Errorf("Tenants() has %d entries, want 0", n)
	}
}

func TestUnlimitedAndPer(t *testing.T) {
	tbl := parseFile(t, "valid/unlimited.yaml")
	batch, _ := tbl.TenantByID("batch")
	if r := batch.Rule(export); !r.Limit.IsInf() {
		t.Errorf("batch rule = %v, want unlimited", r.Limit)
	}
	partner, _ := tbl.TenantByID("partner")
	r := partner.Rule("/reports.v1.Reports/Build")
	if got, want := r.Limit, floodgate.Every(time.Minute/200, 400); math.Abs(got.Rate-want.Rate) > 1e-12 || got.Burst != want.Burst {
		t.Errorf("partner limit = %v, want %v", got, want)
	}
	if r.Cost != 50 {
		t.Errorf("partner cost = %d, want 50", r.Cost)
	}
}

func TestCompileErrorsWithoutLines(t *testing.T) {
	_, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{"free": {Default: &tenant.LimitSpec{Rate: 0, Burst: 1}}},
		Tenants: map[string]tenant.TenantSpec{
			"acme": {Tier: "gold", Keys: []string{"secret"}},
		},
	})
	want := `tenant: invalid config: 3 errors:
tenants.acme.keys[0]: not a SHA-256 hex digest (64 hex digits): store the hash of the key, never the key (go run ./cmd/floodgate-keyhash)
tenants.acme.tier: unknown tier "gold"
tiers.free.default.rate: must be > 0`
	if err == nil || err.Error() != want {
		t.Errorf("Compile error:\n%v\nwant:\n%s", err, want)
	}
	if err != nil && strings.Contains(err.Error(), "secret") {
		t.Errorf("error quotes the plain-text key")
	}
}

// TestLookupAllocs enforces the zero-allocation promise of the lookups the
// middleware makes on every call.
func TestLookupAllocs(t *testing.T) {
	tbl := parseFile(t, "valid/tenants.yaml")
	d := tenant.Digest("demo-key-globex")
	long := strings.Repeat("k", tenant.MaxKeyLen)
	tests := []struct {
		name string
		f    func()
	}{
		{"TenantByDigest+Rule", func() {
			tn, _ := tbl.TenantByDigest(d)
			_ = tn.Rule(search)
		}},
		{"TenantByKey+Rule", func() {
			tn, _ := tbl.TenantByKey("demo-key-globex")
			_ = tn.Rule(foreign)
		}},
		{"TenantByKey long", func() { _, _ = tbl.TenantByKey(long) }},
		{"TenantByID", func() { _, _ = tbl.TenantByID("acme") }},
		{"Digest", func() { _ = tenant.Digest(long) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, tt.f); n != 0 {
				t.Errorf("%s allocates %v times per call, want 0", tt.name, n)
			}
		})
	}
}

// TestRuleBudget: a config whose tenants override limits of a tier with
// many method patterns resolves tenants × patterns rules; past MaxRules it
// is refused before any is resolved, with a message that says why.
func TestRuleBudget(t *testing.T) {
	build := func(tenants, patterns int) *tenant.Config {
		methods := make(map[string]tenant.MethodSpec, patterns)
		for i := range patterns {
			methods["/svc.S/M"+strconv.Itoa(i)] = tenant.MethodSpec{Limit: &tenant.LimitSpec{Rate: 1, Burst: 1}}
		}
		cfg := &tenant.Config{
			Tiers:   map[string]tenant.TierSpec{"t": {Default: &tenant.LimitSpec{Rate: 1, Burst: 1}, Methods: methods}},
			Tenants: make(map[string]tenant.TenantSpec, tenants),
		}
		for i := range tenants {
			cfg.Tenants["c"+strconv.Itoa(i)] = tenant.TenantSpec{Tier: "t", Default: &tenant.LimitSpec{Rate: 2, Burst: 2}}
		}
		return cfg
	}
	if _, err := tenant.Compile(build(100, 100)); err != nil {
		t.Fatalf("100 tenants × 100 patterns: %v", err)
	}
	var ce *tenant.ConfigError
	_, err := tenant.Compile(build(600, 600))
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "rules") {
		t.Errorf("600 tenants × 600 patterns: %v, want a ConfigError about rules", err)
	}
}

// TestRateUnderflow: a positive rate too small to count per second is an
// error, not a bucket that never refills.
func TestRateUnderflow(t *testing.T) {
	_, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{"t": {Default: &tenant.LimitSpec{Rate: 5e-324, Per: 2000000 * time.Hour, Burst: 1}}},
	})
	if err == nil || !strings.Contains(err.Error(), "too small for its period") {
		t.Errorf("Compile = %v, want an error saying the rate is too small", err)
	}
}

func TestWeightsAndPriorities(t *testing.T) {
	table, err := tenant.Parse("share.yaml", []byte(`
tiers:
  free:
    default: {rate: 10, burst: 10}
  batch:
    default: {rate: 10, burst: 10}
    weight: 0.5
    priority: sheddable
  gold:
    default: {rate: 10, burst: 10}
    weight: 4
    priority: critical
    methods:
      "/x.Y/Export": {priority: sheddable}
tenants:
  a: {tier: free}
  b: {tier: batch}
  c: {tier: gold}
  d: {tier: gold, weight: 2, priority: default}
anonymous:
  default: {rate: 1, burst: 1}
  weight: 0.25
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id, method string
		weight     float64
		tenantPrio floodgate.Priority
		rulePrio   floodgate.Priority
		ranked     bool
	}{
		{"a", "/x.Y/Get", 1, floodgate.Default, floodgate.Default, false},
		{"b", "/x.Y/Get", 0.5, floodgate.Sheddable, floodgate.Default, false},
		{"c", "/x.Y/Get", 4, floodgate.Critical, floodgate.Default, false},
		{"c", "/x.Y/Export", 4, floodgate.Critical, floodgate.Sheddable, true},
		{"d", "/x.Y/Get", 2, floodgate.Default, floodgate.Default, false},
		{"d", "/x.Y/Export", 2, floodgate.Default, floodgate.Sheddable, true},
	} {
		ten, ok := table.TenantByID(tc.id)
		if !ok {
			t.Fatalf("no tenant %s", tc.id)
		}
		if got := ten.Weight(); got != tc.weight {
			t.Errorf("%s.Weight() = %v, want %v", tc.id, got, tc.weight)
		}
		if got := ten.Priority(); got != tc.tenantPrio {
			t.Errorf("%s.Priority() = %v, want %v", tc.id, got, tc.tenantPrio)
		}
		if r := ten.Rule(tc.method); r.Priority != tc.rulePrio || r.Ranked != tc.ranked {
			t.Errorf("%s.Rule(%s) priority %v, ranked %v; want %v, %v", tc.id, tc.method, r.Priority, r.Ranked, tc.rulePrio, tc.ranked)
		}
	}
	if got := table.Anonymous().Weight(); got != 0.25 {
		t.Errorf("Anonymous().Weight() = %v, want 0.25", got)
	}
}
