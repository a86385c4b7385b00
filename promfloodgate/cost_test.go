package promfloodgate

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/calltest"
	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// fakeClock is the tests' controlled clock.
type fakeClock = fakeclock.Clock

const methodGenerate = "/llm.v1.Completions/Generate"

// meteredTable: tenant acme, tier pro, has a quota of 100,000 tokens a
// minute in bursts of 20,000 (and the default debt limit, one burst) on
// the Completions service, reserving 4,000 a call.
func meteredTable(t testing.TB) *tenant.Table {
	t.Helper()
	digest, err := tenant.HashKey(proKey)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{"pro": {
			Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000},
			Methods: map[string]tenant.MethodSpec{"/llm.v1.Completions/*": {Metered: &tenant.MeteredSpec{
				Unit: "tokens", Rate: 100000, Per: time.Minute, Burst: 20000, Estimate: 4000,
			}}},
		}},
		Tenants:   map[string]tenant.TenantSpec{"acme": {Tier: "pro", Keys: []string{digest}}},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// meteredLimiter is a Limiter over meteredTable on a keyed store and a
// fake clock, observed by obs, and a func that makes one call of acme that
// reports cost tokens and returns its error.
func meteredLimiter(t *testing.T, obs func(middleware.Event)) (func(cost int64) error, *fakeClock) {
	t.Helper()
	clk := fakeclock.New(time.Unix(1000, 0))
	store, err := keyed.New(keyed.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(meteredTable(t)), middleware.WithClock(clk), middleware.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	return func(cost int64) error {
		_, err := icpt(calltest.KeyContext(methodGenerate, proKey), nil, &grpc.UnaryServerInfo{FullMethod: methodGenerate},
			func(ctx context.Context, _ any) (any, error) {
				middleware.ReportCost(ctx, cost)
				return "ok", nil
			})
		return err
	}, clk
}

// TestCost drives metered calls through a real Limiter: one under its
// estimate, one over (into debt), one refused for the debt, and, once the
// debt is repaid, one whose cost passes the debt limit. The decisions
// count the refusal as reason debt; the cost series count what was
// reserved, settled, refunded and left uncharged; the offenders rank acme
// by what its calls cost, and by its one rejection.
func TestCost(t *testing.T) {
	f, err := NewOffenders()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(WithMethods(methodGenerate), WithTenantLabels(4), WithOffenders(f))
	if err != nil {
		t.Fatal(err)
	}
	call, clk := meteredLimiter(t, c.Observer())
	if err := call(1000); err != nil { // reserves 4,000, refunds 3,000: 19,000 left
		t.Fatal(err)
	}
	if err := call(30000); err != nil { // reserves 4,000, charges 26,000 more: owes 11,000
		t.Fatal(err)
	}
	if err := call(10); err == nil {
		t.Fatal("a call while acme owes tokens was admitted")
	}
	clk.Advance(9 * time.Second)        // 15,000 tokens: the debt and an estimate
	if err := call(50000); err != nil { // reserves 4,000, charges 20,000 of 46,000 more
		t.Fatal(err)
	}
	want := `
# HELP floodgate_cost_refunded_total Units metered calls reserved beyond the cost they settled at, given back to their buckets (a bucket keeps what fits under its burst).
# TYPE floodgate_cost_refunded_total counter
floodgate_cost_refunded_total{method="/llm.v1.Completions/Generate",tenant="acme",tier="pro",unit="tokens"} 3000
# HELP floodgate_cost_reserved_total Units metered calls reserved, their estimates and their streams' chunks, counted as they settle, by unit, tier, method and, opt-in, tenant.
# TYPE floodgate_cost_reserved_total counter
floodgate_cost_reserved_total{method="/llm.v1.Completions/Generate",tenant="acme",tier="pro",unit="tokens"} 12000
# HELP floodgate_cost_settled_total Units metered calls were settled at, as they ended: the cost they reported, or their estimate when they reported none.
# TYPE floodgate_cost_settled_total counter
floodgate_cost_settled_total{method="/llm.v1.Completions/Generate",tenant="acme",tier="pro",unit="tokens"} 81000
# HELP floodgate_cost_uncharged_total Units of settles that their buckets' debt limits left uncharged: the only units a metered quota does not count.
# TYPE floodgate_cost_uncharged_total counter
floodgate_cost_uncharged_total{method="/llm.v1.Completions/Generate",tenant="acme",tier="pro",unit="tokens"} 26000
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="OK",method="/llm.v1.Completions/Generate",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tenant="acme",tier="pro"} 3
floodgate_decisions_total{code="ResourceExhausted",method="/llm.v1.Completions/Generate",outcome="rejected",reason="debt",source="memory",stage="interceptor",tenant="acme",tier="pro"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_decisions_total", "floodgate_cost_reserved_total",
		"floodgate_cost_settled_total", "floodgate_cost_refunded_total", "floodgate_cost_uncharged_total"); err != nil {
		t.Error(err)
	}
	if diff := cmp.Diff([]CostOffender{{Key: "t:acme", Cost: 81000}}, f.TopCost("tokens", 0)); diff != "" {
		t.Errorf("TopCost (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Offender{{Key: "t:acme", Rejections: 1}}, f.Top(0)); diff != "" {
		t.Errorf("Top (-want +got):\n%s", diff)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestCostReasons: the metered quota's own reasons label decisions with
// their rejections' codes (an invalid estimate with no source), and a
// settle is no decision.
func TestCostReasons(t *testing.T) {
	c, err := New(WithMethods(methodGenerate))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	obs(middleware.Event{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonDebt}, Method: methodGenerate, Unit: "tokens", Source: floodgate.SourceRedis,
		Rejection: rejection(middleware.ReasonDebt, codes.Aborted)})
	obs(middleware.Event{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonInvalidEstimate}, Method: methodGenerate, Unit: "tokens",
		Rejection: rejection(middleware.ReasonInvalidEstimate, codes.InvalidArgument)})
	obs(middleware.Event{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonDebt, DryRun: true}, Method: methodGenerate, Unit: "tokens"})
	obs(middleware.Event{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonSettled, Allowed: true, Reserved: 10}, Method: methodGenerate, Unit: "tokens", Settled: 4})
	obs(middleware.Event{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonSettled, Allowed: true}, Method: methodGenerate}) // no unit: no cost
	want := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="Aborted",method="/llm.v1.Completions/Generate",outcome="rejected",reason="debt",source="redis",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="InvalidArgument",method="/llm.v1.Completions/Generate",outcome="rejected",reason="invalid_estimate",source="none",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="OK",method="/llm.v1.Completions/Generate",outcome="dry_run_rejected",reason="debt",source="memory",stage="interceptor",tier="pro"} 1
# HELP floodgate_cost_settled_total Units metered calls were settled at, as they ended: the cost they reported, or their estimate when they reported none.
# TYPE floodgate_cost_settled_total counter
floodgate_cost_settled_total{method="/llm.v1.Completions/Generate",tier="pro",unit="tokens"} 4
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_decisions_total", "floodgate_cost_settled_total"); err != nil {
		t.Error(err)
	}
}

// TestCostUnitCap: units past the first MaxUnitLabels seen are "other".
func TestCostUnitCap(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	for i := range MaxUnitLabels + 2 {
		obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonSettled, Allowed: true}, Unit: "u" + strconv.Itoa(i), Settled: 1})
	}
	want := `
# HELP floodgate_cost_settled_total Units metered calls were settled at, as they ended: the cost they reported, or their estimate when they reported none.
# TYPE floodgate_cost_settled_total counter
`
	for i := range MaxUnitLabels {
		want += `floodgate_cost_settled_total{method="other",tier="none",unit="u` + strconv.Itoa(i) + `"} 1` + "\n"
	}
	want += `floodgate_cost_settled_total{method="other",tier="none",unit="other"} 2` + "\n"
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_cost_settled_total"); err != nil {
		t.Error(err)
	}
}

// debtTable: acme, globex and initech, tier pro, have a quota of 1,000
// tokens a second in bursts of 10,000 (and the default debt limit, one
// burst), reserving 1,000 a call.
func debtTable(t testing.TB) (*tenant.Table, map[string]string) {
	t.Helper()
	keys := map[string]string{}
	tenants := map[string]tenant.TenantSpec{}
	for _, id := range []string{"acme", "globex", "initech"} {
		keys[id] = id + "-key-0123456789abcdef"
		digest, err := tenant.HashKey(keys[id])
		if err != nil {
			t.Fatal(err)
		}
		tenants[id] = tenant.TenantSpec{Tier: "pro", Keys: []string{digest}}
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{"pro": {
			Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000},
			Methods: map[string]tenant.MethodSpec{"/llm.v1.Completions/*": {Metered: &tenant.MeteredSpec{
				Unit: "tokens", Rate: 1000, Per: time.Second, Burst: 10000, Estimate: 1000,
			}}},
		}},
		Tenants: tenants,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl, keys
}

// TestCostDebt: overruns put tenants in debt, which the gauge shows, the
// tenants past the label cap summed in "other"; refill repays it on the
// collector's clock, and each series goes once its debt is repaid.
func TestCostDebt(t *testing.T) {
	clk := fakeclock.New(time.Unix(1000, 0))
	c, err := New(WithMethods(methodGenerate), WithTenantLabels(1), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New(keyed.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	tbl, keys := debtTable(t)
	lim, err := middleware.New(store, middleware.Static(tbl), middleware.WithClock(clk), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	call := func(id string, cost int64) error {
		_, err := icpt(calltest.KeyContext(methodGenerate, keys[id]), nil, &grpc.UnaryServerInfo{FullMethod: methodGenerate},
			func(ctx context.Context, _ any) (any, error) {
				middleware.ReportCost(ctx, cost)
				return "ok", nil
			})
		return err
	}
	const head = `
# HELP floodgate_cost_debt Units the tenant's metered bucket owes, as last seen by this process, less what refill has repaid since, by unit, tier and, opt-in, tenant.
# TYPE floodgate_cost_debt gauge
`
	expect := func(when string, series ...string) {
		t.Helper()
		want := ""
		if len(series) > 0 {
			want = head + strings.Join(series, "\n") + "\n"
		}
		if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_cost_debt"); err != nil {
			t.Errorf("%s: %v", when, err)
		}
	}
	expect("before any call")
	// Each reserves 1,000 of 10,000 and settles past the 9,000 left.
	for _, o := range []struct {
		id   string
		cost int64
	}{{"acme", 15000}, {"globex", 11000}, {"initech", 13000}} { // owe 5,000, 1,000 and 3,000
		if err := call(o.id, o.cost); err != nil {
			t.Fatalf("%s: %v", o.id, err)
		}
	}
	if err := call("acme", 10); err == nil {
		t.Fatal("a call while acme owes tokens was admitted")
	}
	expect("in debt",
		`floodgate_cost_debt{tenant="acme",tier="pro",unit="tokens"} 5000`,
		`floodgate_cost_debt{tenant="other",tier="pro",unit="tokens"} 4000`)
	clk.Advance(2 * time.Second) // 2,000 repaid each: globex is clear
	expect("after 2s",
		`floodgate_cost_debt{tenant="acme",tier="pro",unit="tokens"} 3000`,
		`floodgate_cost_debt{tenant="other",tier="pro",unit="tokens"} 1000`)
	clk.Advance(time.Second)
	expect("after 3s", `floodgate_cost_debt{tenant="acme",tier="pro",unit="tokens"} 2000`)
	clk.Advance(2 * time.Second)
	expect("after 5s, repaid")
	clk.Advance(time.Second) // and an estimate
	if err := call("acme", 1000); err != nil {
		t.Fatalf("acme once repaid: %v", err)
	}
	expect("after a call at its estimate")
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestCostDebtBounded: the observer follows at most MaxDebtBuckets
// buckets, dropping the one seen longest ago; a settle that leaves a
// bucket owing nothing clears it; anonymous callers are not followed.
func TestCostDebtBounded(t *testing.T) {
	clk := fakeclock.New(time.Unix(1000, 0))
	c, err := New(WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	lim := floodgate.Limit{Rate: 1, Burst: 10}
	debt := func(tenant string, owed int) middleware.Event {
		return middleware.Event{
			Decision: middleware.Decision{Tier: "pro", Tenant: tenant, Reason: middleware.ReasonDebt, Metered: floodgate.Result{Limit: lim, Owed: owed}},
			Unit:     "tokens",
			MeterID:  "m",
		}
	}
	for i := range MaxDebtBuckets {
		obs(debt("t"+strconv.Itoa(i), 1))
	}
	obs(debt("t0", 2)) // seen again: t1 is now the oldest
	obs(debt("new", 3))
	obs(debt("", 100)) // anonymous
	obs(middleware.Event{
		Decision: middleware.Decision{Tier: "pro", Tenant: "t2", Reason: middleware.ReasonSettled, Allowed: true, Metered: floodgate.Result{Allowed: true, Limit: lim, Remaining: 3}},
		Unit:     "tokens",
		MeterID:  "m",
	})
	// t0's 2, new's 3 and 1 from each of the others but t1 and t2.
	want := `
# HELP floodgate_cost_debt Units the tenant's metered bucket owes, as last seen by this process, less what refill has repaid since, by unit, tier and, opt-in, tenant.
# TYPE floodgate_cost_debt gauge
floodgate_cost_debt{tier="pro",unit="tokens"} ` + strconv.Itoa(2+3+MaxDebtBuckets-3) + "\n"
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_cost_debt"); err != nil {
		t.Error(err)
	}
}
