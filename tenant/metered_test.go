package tenant_test

import (
	"bytes"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

const (
	generate = "/llm.v1.Completions/Generate"
	stream   = "/llm.v1.Completions/Stream"
	download = "/files.v1.Files/Download"
)

// meterID mirrors the documented derivation of a metered bucket's ID.
func meterID(pattern, unit string) string { return id(pattern + " " + unit) }

func TestMeteredRules(t *testing.T) {
	tbl := parseFile(t, "valid/metered.yaml")
	if !tbl.Metered() {
		t.Error("Metered() = false for a table with metered quotas")
	}
	tokens := func(rate float64, burst, debt, estimate, chunk int, header, pattern string) *tenant.Meter {
		return &tenant.Meter{
			Unit: "tokens", Limit: floodgate.Limit{Rate: rate, Burst: burst, Debt: debt},
			Estimate: estimate, EstimateHeader: header, Chunk: chunk,
			ID: meterID(pattern, "tokens"), Pattern: pattern,
		}
	}
	const svc = "/llm.v1.Completions/*"
	tests := []struct {
		tenant, method string
		want           tenant.Rule
	}{
		// The call limit comes from the tier's default, the meter from
		// the service's entry; the chunk defaults to the estimate.
		{"acme", generate, withMeter(rule(50, 100, 1, "default"),
			tokens(100000.0/60, 20000, 20000, 4000, 4000, "x-max-tokens", svc))},
		// The exact entry sets a cost and a meter of its own.
		{"acme", stream, withMeter(rule(50, 100, 2, "default"),
			tokens(100000.0/60, 20000, 0, 1000, 500, "", stream))},
		// debt: 0 is no debt; an estimate of 0 chunks a tenth of the burst.
		{"acme", download, withMeter(rule(50, 100, 1, "default"), &tenant.Meter{
			Unit: "bytes", Limit: floodgate.Limit{Rate: 1 << 20, Burst: 4 << 20, Debt: floodgate.NoDebt},
			Chunk: 4 << 20 / 10, ID: meterID(download, "bytes"), Pattern: download,
		})},
		{"acme", "/other.v1.Other/Call", rule(50, 100, 1, "default")},
		// A tenant's own meter on the tier's pattern and unit: another
		// limit, the same bucket.
		{"bigco", generate, withMeter(rule(50, 100, 1, "default"),
			tokens(500000.0/60, 100000, 0, 4000, 4000, "", svc))},
		// The tenant's service entry beats the tier's exact one, as for
		// limits; the tier's cost stays.
		{"bigco", stream, withMeter(rule(50, 100, 2, "default"),
			tokens(500000.0/60, 100000, 0, 4000, 4000, "", svc))},
		{"unmetered", generate, withMeter(rule(50, 100, 1, "default"), &tenant.Meter{
			Unit: "tokens", Limit: floodgate.Inf, Chunk: 1, ID: meterID(svc, "tokens"), Pattern: svc,
		})},
		{"", generate, rule(1, 5, 1, "default")},
	}
	for _, tt := range tests {
		t.Run(tt.tenant+tt.method, func(t *testing.T) {
			tn := tbl.Anonymous()
			if tt.tenant != "" {
				tn, _ = tbl.TenantByID(tt.tenant)
			}
			if diff := cmp.Diff(tt.want, tn.Rule(tt.method), cmp.Comparer(sameLimit)); diff != "" {
				t.Errorf("%q.Rule(%q) mismatch (-want +got):\n%s", tt.tenant, tt.method, diff)
			}
		})
	}
}

func withMeter(r tenant.Rule, m *tenant.Meter) tenant.Rule {
	r.Meter = m
	return r
}

// sameLimit compares limits whose rates come from a division.
func sameLimit(a, b floodgate.Limit) bool {
	return a.Burst == b.Burst && a.Debt == b.Debt &&
		(a.Rate == b.Rate || math.Abs(a.Rate-b.Rate) <= 1e-9*math.Abs(a.Rate))
}

// TestMeterIDs: a metered bucket's ID depends on its pattern and unit
// only, so a reload that changes its limit keeps its state (its debt
// too), a new unit is a new bucket, and it never names a call bucket.
func TestMeterIDs(t *testing.T) {
	compile := func(unit string, rate float64) *tenant.Tenant {
		t.Helper()
		tbl, err := tenant.Compile(&tenant.Config{Tenants: map[string]tenant.TenantSpec{"acme": {
			Default: &tenant.LimitSpec{Rate: 10, Burst: 10},
			Methods: map[string]tenant.MethodSpec{"/llm.v1.Completions/*": {
				Limit:   &tenant.LimitSpec{Rate: 5, Burst: 5},
				Metered: &tenant.MeteredSpec{Unit: unit, Rate: rate, Burst: 100, Estimate: 10},
			}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		tn, _ := tbl.TenantByID("acme")
		return tn
	}
	before, after, bytes := compile("tokens", 10).Rule(generate), compile("tokens", 99).Rule(generate), compile("bytes", 10).Rule(generate)
	if before.Meter.ID != after.Meter.ID {
		t.Errorf("meter ID changed with the rate: %q, then %q", before.Meter.ID, after.Meter.ID)
	}
	if got, want := after.Meter.Limit.Rate, 99.0; got != want {
		t.Errorf("reloaded meter rate = %v, want %v", got, want)
	}
	if before.Meter.ID == bytes.Meter.ID {
		t.Errorf("meters in tokens and bytes share the ID %q", bytes.Meter.ID)
	}
	if before.Meter.ID == before.ID {
		t.Errorf("the meter and the call limit of one pattern share the ID %q", before.ID)
	}
}

func TestNotMetered(t *testing.T) {
	tbl := parseFile(t, "valid/tenants.yaml")
	if tbl.Metered() {
		t.Error("Metered() = true for a table without metered quotas")
	}
	acme, _ := tbl.TenantByID("acme")
	if m := acme.Rule(export).Meter; m != nil {
		t.Errorf("Rule(%q).Meter = %+v, want nil", export, m)
	}
}

func TestCompileMeteredErrors(t *testing.T) {
	_, err := tenant.Compile(&tenant.Config{Tiers: map[string]tenant.TierSpec{"t": {
		Default: &tenant.LimitSpec{Rate: 10, Burst: 10},
		Methods: map[string]tenant.MethodSpec{
			"/a.S/A": {Metered: &tenant.MeteredSpec{Unit: "tokens", Rate: 10, Burst: 10, Estimate: 11}},
			"/a.S/B": {Metered: &tenant.MeteredSpec{Unit: "tokens", Rate: 10, Burst: 10, Debt: -2, Chunk: -1}},
			"/a.S/C": {Metered: &tenant.MeteredSpec{Rate: math.NaN(), Burst: 10}},
			"/a.S/D": {},
		},
	}}})
	want := `tenant: invalid config: 6 errors:
tiers.t.methods["/a.S/A"].metered.estimate: estimate 11 exceeds burst 10: such calls could never be admitted
tiers.t.methods["/a.S/B"].metered.chunk: must be ≥ 1
tiers.t.methods["/a.S/B"].metered.debt: must be ≥ 0 (0 for no debt)
tiers.t.methods["/a.S/C"].metered.rate: must be > 0
tiers.t.methods["/a.S/C"].metered.unit: invalid unit: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit
tiers.t.methods["/a.S/D"]: sets neither a limit, a cost, a metered quota nor a priority`
	if err == nil || err.Error() != want {
		t.Errorf("Compile error:\n%v\nwant:\n%s", err, want)
	}
}

// TestMeteredChangeLogged: a reload that changes only a metered quota is
// a change of its tier, as an operator reads it in the log.
func TestMeteredChangeLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	var logs bytes.Buffer
	r, _ := newRegistry(t, tenant.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	w := r.NewWatcher(path)
	const config = `tiers:
  pro:
    default: {rate: 10, burst: 20}
    methods:
      "/llm.v1.Completions/*": {metered: {unit: tokens, rate: RATE, burst: 100, estimate: 10}}
`
	replaceFile(t, path, strings.ReplaceAll(config, "RATE", "100"))
	w.Poll()
	logs.Reset()
	replaceFile(t, path, strings.ReplaceAll(config, "RATE", "50"))
	w.Poll()
	if got, want := logs.String(), "tiers_changed=pro"; !strings.Contains(got, want) {
		t.Errorf("log after a metered change lacks %q:\n%s", want, got)
	}
	pro, _ := r.Table().TenantByID("")
	if m := pro.Rule(generate).Meter; m != nil {
		t.Errorf("anonymous rule has a meter %+v", m)
	}
}
