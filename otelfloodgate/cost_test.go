package otelfloodgate

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate/internal/calltest"
	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// fakeClock is the tests' controlled clock.
type fakeClock = fakeclock.Clock

const methodGenerate = "/llm.v1.Completions/Generate"

// meteredTable: acme (tier gold) has a quota of 100,000 tokens a minute in
// bursts of 20,000 (and the default debt limit, one burst) on the
// Completions service, reserving 4,000 a call.
func meteredTable(t testing.TB) *tenant.Table {
	t.Helper()
	digest, err := tenant.HashKey(goldKey)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{"gold": {
			Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000},
			Methods: map[string]tenant.MethodSpec{"/llm.v1.Completions/*": {Metered: &tenant.MeteredSpec{
				Unit: "tokens", Rate: 100000, Per: time.Minute, Burst: 20000, Estimate: 4000,
			}}},
		}},
		Tenants: map[string]tenant.TenantSpec{"acme": {Tier: "gold", Keys: []string{digest}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// TestCost drives metered calls through a real Limiter, as promfloodgate's
// TestCost does: under the estimate, over it into debt, refused for the
// debt, and past the debt limit once repaid; and reads the instruments
// back.
func TestCost(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	rec, err := New(mp, WithMethods(methodGenerate), WithTenantLabels(4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rec.Close() })
	clk := fakeclock.New(time.Unix(1000, 0))
	store, err := keyed.New(keyed.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(meteredTable(t)), middleware.WithClock(clk), middleware.WithObserver(rec.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	call := func(cost int64) error {
		_, err := icpt(calltest.KeyContext(methodGenerate, goldKey), nil, &grpc.UnaryServerInfo{FullMethod: methodGenerate},
			func(ctx context.Context, _ any) (any, error) {
				middleware.ReportCost(ctx, cost)
				return "ok", nil
			})
		return err
	}
	for _, c := range []int64{1000, 30000} { // a refund of 3,000; then 11,000 owed
		if err := call(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := call(10); err == nil {
		t.Fatal("a call while acme owes tokens was admitted")
	}
	clk.Advance(9 * time.Second)
	if err := call(50000); err != nil { // 26,000 past the debt limit
		t.Fatal(err)
	}
	m := collect(t, reader)
	const attrs = "method=" + methodGenerate + ",tenant=acme,tier=gold,unit=tokens"
	for name, want := range map[string]int64{
		"floodgate.cost.reserved": 12000, "floodgate.cost.settled": 81000,
		"floodgate.cost.refunded": 3000, "floodgate.cost.uncharged": 26000,
	} {
		if diff := cmp.Diff(map[string]int64{attrs: want}, points(t, m[name])); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	want := map[string]int64{
		"code=OK,method=" + methodGenerate + ",outcome=admitted,reason=admitted,source=memory,stage=interceptor,tenant=acme,tier=gold":            3,
		"code=ResourceExhausted,method=" + methodGenerate + ",outcome=rejected,reason=debt,source=memory,stage=interceptor,tenant=acme,tier=gold": 1,
	}
	if diff := cmp.Diff(want, points(t, m["floodgate.decisions"])); diff != "" {
		t.Errorf("floodgate.decisions (-want +got):\n%s", diff)
	}
}

// TestCostDebt: as promfloodgate's TestCostDebt, overruns put tenants in
// debt, which floodgate.cost.debt shows, those past the label cap summed
// in "other", until refill on the Recorder's clock repays it and each
// series goes.
func TestCostDebt(t *testing.T) {
	keys := map[string]string{}
	tenants := map[string]tenant.TenantSpec{}
	for _, id := range []string{"acme", "globex", "initech"} {
		keys[id] = id + "-key-0123456789abcdef"
		digest, err := tenant.HashKey(keys[id])
		if err != nil {
			t.Fatal(err)
		}
		tenants[id] = tenant.TenantSpec{Tier: "gold", Keys: []string{digest}}
	}
	tbl, err := tenant.Compile(&tenant.Config{ // 1,000 tokens a second in bursts of 10,000, 1,000 a call
		Tiers: map[string]tenant.TierSpec{"gold": {
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
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	clk := fakeclock.New(time.Unix(1000, 0))
	rec, err := New(mp, WithMethods(methodGenerate), WithTenantLabels(1), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rec.Close() })
	store, err := keyed.New(keyed.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(tbl), middleware.WithClock(clk), middleware.WithObserver(rec.Observer()))
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
	for _, o := range []struct {
		id   string
		cost int64
	}{{"acme", 15000}, {"globex", 11000}, {"initech", 13000}} { // owe 5,000, 1,000 and 3,000
		if err := call(o.id, o.cost); err != nil {
			t.Fatalf("%s: %v", o.id, err)
		}
	}
	const acme, other = "tenant=acme,tier=gold,unit=tokens", "tenant=other,tier=gold,unit=tokens"
	for _, step := range []struct {
		advance time.Duration
		want    map[string]float64
	}{
		{0, map[string]float64{acme: 5000, other: 4000}},
		{2 * time.Second, map[string]float64{acme: 3000, other: 1000}}, // globex repaid
		{time.Second, map[string]float64{acme: 2000}},
		{2 * time.Second, map[string]float64{}},
	} {
		clk.Advance(step.advance)
		if diff := cmp.Diff(step.want, floatPoints(t, collect(t, reader)["floodgate.cost.debt"])); diff != "" {
			t.Errorf("%v on: floodgate.cost.debt (-want +got):\n%s", clk.Now().Sub(time.Unix(1000, 0)), diff)
		}
	}
}
