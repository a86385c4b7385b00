package promfloodgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/internal/calltest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	_ KeyedMap   = (*keyed.Map)(nil)
	_ Gate       = (*cpugate.Gate)(nil)
	_ Controller = (*overload.Controller)(nil)
	_ Registry   = (*tenant.Registry)(nil)
)

const (
	methodGet    = "/inventory.v1.Inventory/Get"
	methodSecret = "/inventory.v1.Inventory/Secret"
	freeKey      = "free-key-0123456789abcdef"
	proKey       = "pro-key-0123456789abcdef"
)

func testTable(t testing.TB) *tenant.Table {
	t.Helper()
	digest := func(k string) string {
		h, err := tenant.HashKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{
			"free": {Default: &tenant.LimitSpec{Rate: 1e-6, Burst: 2}},
			"pro":  {Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}},
		},
		Tenants: map[string]tenant.TenantSpec{
			"f": {Tier: "free", Keys: []string{digest(freeKey)}},
			"p": {Tier: "pro", Keys: []string{digest(proKey)}},
		},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// callCtx is the context of a server call to methodGet with the API key.
func callCtx(key string) context.Context { return calltest.KeyContext(methodGet, key) }

func noop(context.Context, any) (any, error) { return "ok", nil }

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name, option string
		opt          Option
	}{
		{"bad method", "WithMethods", WithMethods("Get")},
		{"empty method", "WithMethods", WithMethods("")},
		{"method not UTF-8", "WithMethods", WithMethods("/svc.S/\xff")},
		{"zero tiers", "WithMaxTiers", WithMaxTiers(0)},
		{"many tiers", "WithMaxTiers", WithMaxTiers(257)},
		{"negative log", "WithLogger", WithLogger(slog.Default(), -time.Second)},
		{"many methods", "WithMethods", WithMethods(make([]string, MaxMethods+1)...)},
		{"negative tenants", "WithTenantLabels", WithTenantLabels(-1)},
		{"many tenants", "WithTenantLabels", WithTenantLabels(MaxTenantLabels + 1)},
	} {
		if _, err := New(tc.opt); !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), tc.option) {
			t.Errorf("%s: New() error = %v, want floodgate.ErrInvalidOption naming %s", tc.name, err, tc.option)
		}
	}
	// Nil sources are no sources, as when not given.
	if _, err := New(WithKeyed(nil), WithGate(nil), WithOverload(nil), WithRegistry(nil), WithTenantLabels(0)); err != nil {
		t.Errorf("New(nil sources) error = %v", err)
	}
}

// TestDecisionsAndSources drives a real Limiter and checks every series the
// collector exports with its value.
func TestDecisionsAndSources(t *testing.T) {
	store, err := keyed.New(keyed.WithCapacity(1))
	if err != nil {
		t.Fatal(err)
	}
	gate, err := cpugate.New(cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		return cpugate.Reading{CPU: 0.3, Source: "scripted"}, nil
	}), cpugate.WithPolicy(cpugate.Fixed{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := gate.SampleAt(time.Now()); err != nil {
		t.Fatal(err)
	}
	c, err := New(WithMethods(methodGet), WithKeyed(store), WithGate(gate))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithGate(gate), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	call := func(key, method string) error {
		_, err := icpt(callCtx(key), nil, &grpc.UnaryServerInfo{FullMethod: method}, noop)
		return err
	}
	for range 3 {
		_ = call(proKey, methodGet)
	}
	for range 5 {
		_ = call(freeKey, methodGet) // 2 admitted, 3 over quota
	}
	_ = call("", methodSecret)                   // anonymous, unregistered method
	_ = call("", "/grpc.health.v1.Health/Check") // exempt

	want := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="free"} 2
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="pro"} 3
floodgate_decisions_total{code="OK",method="other",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="none"} 1
floodgate_decisions_total{code="ResourceExhausted",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="quota",source="memory",stage="interceptor",tier="free"} 3
# HELP floodgate_exempt_total Calls to exempt methods, which take no tokens and are not in floodgate_decisions_total.
# TYPE floodgate_exempt_total counter
floodgate_exempt_total 1
# HELP floodgate_tap_rejections_total Calls rejected by the tap handle before their request was read.
# TYPE floodgate_tap_rejections_total counter
floodgate_tap_rejections_total 0
# HELP floodgate_keyed_keys Buckets the in-memory store tracks.
# TYPE floodgate_keyed_keys gauge
floodgate_keyed_keys 1
# HELP floodgate_gate_scale Factor the CPU gate multiplies every limit by, in (0, 1].
# TYPE floodgate_gate_scale gauge
floodgate_gate_scale 1
# HELP floodgate_gate_state 1 for the CPU gate's current state, 0 for the others.
# TYPE floodgate_gate_state gauge
floodgate_gate_state{state="open"} 1
floodgate_gate_state{state="ramping"} 0
floodgate_gate_state{state="shedding"} 0
# HELP floodgate_gate_cpu_ratio Latest CPU reading, as a fraction of the CPU available to the process.
# TYPE floodgate_gate_cpu_ratio gauge
floodgate_gate_cpu_ratio 0.3
# HELP floodgate_gate_sampler_info The CPU sampler's source, as a label, from the first reading on; the value is 1.
# TYPE floodgate_gate_sampler_info gauge
floodgate_gate_sampler_info{source="scripted"} 1
# HELP floodgate_gate_sample_failures_total Failed CPU samples.
# TYPE floodgate_gate_sample_failures_total counter
floodgate_gate_sample_failures_total 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"floodgate_decisions_total", "floodgate_exempt_total", "floodgate_tap_rejections_total", "floodgate_keyed_keys",
		"floodgate_gate_scale", "floodgate_gate_state", "floodgate_gate_cpu_ratio",
		"floodgate_gate_sampler_info", "floodgate_gate_sample_failures_total"); err != nil {
		t.Error(err)
	}
	// Capacity 1 with three subjects (pro, free, anonymous): the store
	// evicted or overflowed; the series must agree with its Stats.
	st := store.Stats()
	for name, v := range map[string]uint64{
		"floodgate_keyed_evictions_total":        st.Evictions,
		"floodgate_keyed_evicted_not_full_total": st.EvictedNotFull,
		"floodgate_keyed_overflowed_total":       st.Overflowed,
	} {
		if got := gather(t, c, name); got != float64(v) {
			t.Errorf("%s = %g, want %d", name, got, v)
		}
	}
	if st.Evictions+st.Overflowed == 0 {
		t.Errorf("keyed stats %+v: want evictions or overflow at capacity 1", st)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// gather returns the value of the single unlabelled series name.
func gather(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// rejection returns a rejection for reason, with code.
func rejection(reason middleware.Reason, code codes.Code) *middleware.Rejection {
	return &middleware.Rejection{Reason: reason, Code: code}
}

// TestCodesAndFlags: the code label is the rejection's, OK for a call that
// runs, whatever the reason.
func TestCodesAndFlags(t *testing.T) {
	c, err := New(WithMethods(methodGet))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	for _, e := range []middleware.Event{
		{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonQuota}, Method: methodGet, Rejection: rejection(middleware.ReasonQuota, codes.Aborted)},
		{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonOverload}, Method: methodGet, Shed: true,
			Rejection: rejection(middleware.ReasonOverload, codes.ResourceExhausted)},
		{Decision: middleware.Decision{Tier: "pro", Reason: middleware.ReasonGate}, Method: methodGet, Rejection: rejection(middleware.ReasonGate, codes.ResourceExhausted)},
		{Decision: middleware.Decision{Reason: middleware.ReasonGate}, Method: methodGet, Tap: true, Rejection: rejection(middleware.ReasonGate, codes.Unavailable)},
		{Decision: middleware.Decision{Reason: middleware.ReasonOverload}, Method: methodGet, Tap: true, Rejection: rejection(middleware.ReasonOverload, codes.Unavailable)},
		{Decision: middleware.Decision{Reason: middleware.ReasonStoreError}, Method: methodGet, Rejection: rejection(middleware.ReasonStoreError, codes.Unavailable)},
		{Decision: middleware.Decision{Reason: middleware.ReasonStoreError, Allowed: true}, Method: methodGet},
		{Decision: middleware.Decision{Reason: middleware.ReasonQuota, DryRun: true}, Method: methodGet},
		{Decision: middleware.Decision{Reason: middleware.ReasonExempt, Allowed: true}, Method: methodGet}, // no decision: floodgate_exempt_total
		{Decision: middleware.Decision{Reason: middleware.Reason(200)}, Method: methodGet},                 // unknown: dropped
	} {
		obs(e)
	}
	want := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="Aborted",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="quota",source="memory",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="store_error",source="none",stage="interceptor",tier="none"} 1
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="dry_run_rejected",reason="quota",source="memory",stage="interceptor",tier="none"} 1
floodgate_decisions_total{code="ResourceExhausted",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="gate",source="memory",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="ResourceExhausted",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="overload",source="memory",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="Unavailable",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="gate",source="none",stage="tap",tier="none"} 1
floodgate_decisions_total{code="Unavailable",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="overload",source="none",stage="tap",tier="none"} 1
floodgate_decisions_total{code="Unavailable",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="store_error",source="none",stage="interceptor",tier="none"} 1
# HELP floodgate_exempt_total Calls to exempt methods, which take no tokens and are not in floodgate_decisions_total.
# TYPE floodgate_exempt_total counter
floodgate_exempt_total 1
# HELP floodgate_tap_rejections_total Calls rejected by the tap handle before their request was read.
# TYPE floodgate_tap_rejections_total counter
floodgate_tap_rejections_total 2
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_decisions_total", "floodgate_exempt_total", "floodgate_tap_rejections_total"); err != nil {
		t.Error(err)
	}
}

// TestKeysIgnored counts the decisions of callers whose API key header was
// ignored, by reason, and not their settles.
func TestKeysIgnored(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	for _, e := range []middleware.Event{
		{Decision: middleware.Decision{Allowed: true, KeyIgnored: "repeated"}},
		{Decision: middleware.Decision{Reason: middleware.ReasonQuota, KeyIgnored: "repeated"}},
		{Decision: middleware.Decision{Reason: middleware.ReasonGate, KeyIgnored: "too_long"}, Tap: true},
		{Decision: middleware.Decision{Reason: middleware.ReasonSettled, Allowed: true, KeyIgnored: "too_long"}},
		{Decision: middleware.Decision{Allowed: true}},
	} {
		obs(e)
	}
	want := `
# HELP floodgate_api_keys_ignored_total Decisions of calls whose API key header the limiter ignored, judging the caller anonymous, by reason: repeated (more than one value) or too_long.
# TYPE floodgate_api_keys_ignored_total counter
floodgate_api_keys_ignored_total{reason="repeated"} 2
floodgate_api_keys_ignored_total{reason="too_long"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_api_keys_ignored_total"); err != nil {
		t.Error(err)
	}
}

func TestTierCap(t *testing.T) {
	c, err := New(WithMaxTiers(2))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	for _, tier := range []string{"a", "b", "c", "d", "a", "c"} {
		obs(middleware.Event{Decision: middleware.Decision{Tier: tier, Allowed: true}, Method: "/made.Up/" + tier})
	}
	want := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="OK",method="other",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="a"} 2
floodgate_decisions_total{code="OK",method="other",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="b"} 1
floodgate_decisions_total{code="OK",method="other",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="other"} 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_decisions_total"); err != nil {
		t.Error(err)
	}
}

func TestObserverAllocs(t *testing.T) {
	for _, tenants := range []bool{false, true} {
		offenders, err := NewOffenders()
		if err != nil {
			t.Fatal(err)
		}
		opts := []Option{WithMethods(methodGet), WithLogger(slog.New(slog.DiscardHandler), time.Hour), WithOffenders(offenders)}
		if tenants {
			opts = append(opts, WithTenantLabels(1))
		}
		c, err := New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		obs := c.Observer()
		accepted := middleware.Event{Decision: middleware.Decision{Tier: "pro", Tenant: "p", Allowed: true}, Method: methodGet}
		rejected := middleware.Event{
			Decision:  middleware.Decision{Tier: "pro", Tenant: "p", Subject: "t:p", Reason: middleware.ReasonQuota},
			Method:    methodGet,
			Rejection: rejection(middleware.ReasonQuota, codes.ResourceExhausted),
		}
		// An anonymous caller's rejection at the tap, whose address the
		// offenders hash, and whose API key was ignored.
		tapped := middleware.Event{
			Decision:  middleware.Decision{Subject: "a:203.0.113.7", KeyIgnored: "repeated", Reason: middleware.ReasonGate},
			Method:    methodGet,
			Tap:       true,
			Rejection: rejection(middleware.ReasonGate, codes.Unavailable),
		}
		exempt := middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonExempt, Allowed: true}, Method: "/grpc.health.v1.Health/Check"}
		overCap := middleware.Event{Decision: middleware.Decision{Tier: "pro", Tenant: "q", Allowed: true}, Method: methodGet}
		owing := floodgate.Result{Limit: floodgate.Limit{Rate: 1000, Burst: 20000}, Owed: 1000} // the bucket is in debt
		debt := middleware.Event{Decision: middleware.Decision{Tier: "pro", Tenant: "p", Reason: middleware.ReasonDebt, Metered: owing}, Method: methodGet, Unit: "tokens", MeterID: "m"}
		settled := middleware.Event{
			Decision:  middleware.Decision{Tier: "pro", Tenant: "p", Reason: middleware.ReasonSettled, Allowed: true, Reserved: 4000, Metered: owing},
			Method:    methodGet,
			Unit:      "tokens",
			MeterID:   "m",
			Settled:   5000,
			Uncharged: 10,
		}
		// A settle that leaves a bucket not followed owing nothing.
		repaid := middleware.Event{
			Decision: middleware.Decision{Tier: "pro", Tenant: "q", Reason: middleware.ReasonSettled, Allowed: true, Reserved: 4000, Metered: floodgate.Result{Allowed: true, Limit: owing.Limit}},
			Method:   methodGet,
			Unit:     "tokens",
			MeterID:  "m",
			Settled:  1000,
		}
		for _, e := range []middleware.Event{accepted, rejected, tapped, exempt, overCap, debt, settled, repaid} {
			obs(e) // the first makes the series; a rejection logs once, later ones are suppressed
		}
		for name, e := range map[string]middleware.Event{"accepted": accepted, "rejected": rejected, "rejected at the tap": tapped,
			"exempt": exempt, "over the tenant cap": overCap, "rejected for debt": debt, "settled": settled, "settled, repaid": repaid} {
			if name == "rejected at the tap" && raceEnabled {
				continue // the race detector drops pooled hashers, which the offenders then make anew
			}
			if n := testing.AllocsPerRun(1000, func() { obs(e) }); n != 0 {
				t.Errorf("tenant labels %v, %s: %g allocations per event, want 0", tenants, name, n)
			}
		}
	}
}

func TestRejectionLogIsBounded(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	c, err := New(WithMethods(methodGet), WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)), time.Second),
		WithClock(floodgate.ClockFunc(func() time.Time { return now })))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	for range 100 {
		obs(middleware.Event{Decision: middleware.Decision{Tier: "free", Tenant: "initech", Reason: middleware.ReasonQuota}, Method: methodGet})
		obs(middleware.Event{Decision: middleware.Decision{Tier: "free", Tenant: "initech", Allowed: true}, Method: methodGet})
	}
	now = now.Add(999 * time.Millisecond)
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonOverload}, Method: "/x.Y/Z"})
	now = now.Add(time.Millisecond)
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonOverload}, Method: "/x.Y/Z", Tap: true})

	type line struct {
		Msg, Reason, Tier, Tenant, Method string
		Tap                               bool
		DryRun                            bool `json:"dry_run"`
		Suppressed                        uint64
	}
	var got []line
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var l line
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	want := []line{
		{Msg: "floodgate: call rejected", Reason: "quota", Tier: "free", Tenant: "initech", Method: methodGet},
		{Msg: "floodgate: call rejected", Reason: "overload", Tier: "none", Tenant: "none", Method: "other", Tap: true, Suppressed: 100},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
}

// TestConcurrentObserveAndCollect counts from several goroutines, with new
// tiers arriving, while scrapes run: no count is lost.
func TestConcurrentObserveAndCollect(t *testing.T) {
	c, err := New(WithMethods(methodGet), WithMaxTiers(3))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	done := make(chan struct{})
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		for {
			select {
			case <-done:
				return
			default:
				if _, err := reg.Gather(); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				e := middleware.Event{Decision: middleware.Decision{Tier: string(rune('a' + (i+g)%5)), Allowed: true}, Method: methodGet}
				if i%3 == 0 {
					e.Allowed, e.Reason = false, middleware.ReasonQuota
				}
				obs(e)
			}
		})
	}
	wg.Wait()
	close(done)
	<-scraped
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	tiers := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue()
			for _, l := range m.GetLabel() {
				if l.GetName() == "tier" {
					tiers[l.GetValue()] = true
				}
			}
		}
	}
	if total != 4000 {
		t.Errorf("total = %g, want 4000", total)
	}
	if len(tiers) != 4 || !tiers[LabelOther] { // 3 tiers and "other"
		t.Errorf("tier labels %v, want 3 and other", tiers)
	}
}

// scriptedStore answers takes from a script of results, as a remote store
// reporting which of its parts decided; an error step fails the take.
type scriptedStore struct {
	mu    sync.Mutex
	steps []scriptStep
}

type scriptStep struct {
	res floodgate.Result
	err error
}

func (s *scriptedStore) TakeN(_ context.Context, _ string, lim floodgate.Limit, _ int) (floodgate.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.steps[0]
	s.steps = s.steps[1:]
	st.res.Limit = lim
	return st.res, st.err
}

// TestSourceLabels drives a Limiter over a store whose decisions come from
// each of its sources: each decision is counted under its source, and a
// store error under none.
func TestSourceLabels(t *testing.T) {
	store := &scriptedStore{steps: []scriptStep{
		{res: floodgate.Result{Allowed: true, Source: floodgate.SourceRedis}},
		{res: floodgate.Result{Allowed: true, Source: floodgate.SourceRedis}},
		{res: floodgate.Result{Allowed: true, Source: floodgate.SourceLease}},
		{res: floodgate.Result{RetryAfter: time.Second, Source: floodgate.SourceCache}},
		{res: floodgate.Result{Allowed: true, Source: floodgate.SourceFallback}},
		{res: floodgate.Result{Allowed: true, Source: floodgate.SourceFailOpen}},
		{res: floodgate.Result{RetryAfter: time.Second, Source: floodgate.SourceFailClosed}},
		{err: errors.New("redis: i/o timeout")},
	}}
	c, err := New(WithMethods(methodGet))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	for range len(store.steps) {
		_, _ = icpt(callCtx(proKey), nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop)
	}
	want := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="fail_open",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="fallback",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="lease",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="redis",stage="interceptor",tier="pro"} 2
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="store_error",source="none",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="ResourceExhausted",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="quota",source="cache",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="ResourceExhausted",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="quota",source="fail_closed",stage="interceptor",tier="pro"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_decisions_total"); err != nil {
		t.Error(err)
	}
	// A source newer than this package is counted, not dropped.
	c.Observer()(middleware.Event{Decision: middleware.Decision{Tier: "pro", Allowed: true}, Method: methodGet, Source: floodgate.Source(42)})
	if got := seriesValue(t, c, map[string]string{"source": "unknown"}); got != 1 {
		t.Errorf("unknown source counted %g times, want 1", got)
	}
}

// seriesValue returns the value of the one decision series whose labels
// include match.
func seriesValue(t *testing.T, c *Collector, match map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var found []float64
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_decisions_total" {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range match {
				if labels[k] != v {
					continue next
				}
			}
			found = append(found, m.GetCounter().GetValue())
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d series match %v, want 1", len(found), match)
	}
	return found[0]
}

// TestTenantLabels caps the tenant label: the first tenants seen label
// themselves, later ones are "other", anonymous callers "none"; tiers stay.
func TestTenantLabels(t *testing.T) {
	c, err := New(WithMethods(methodGet), WithTenantLabels(2))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	for _, ten := range []string{"acme", "globex", "initech", "acme", "umbrella", "globex", "acme"} {
		obs(middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: ten, Allowed: true}, Method: methodGet})
	}
	obs(middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "initech", Reason: middleware.ReasonQuota}, Method: methodGet,
		Rejection: rejection(middleware.ReasonQuota, codes.ResourceExhausted)})
	obs(middleware.Event{Decision: middleware.Decision{Allowed: true}, Method: methodGet}) // anonymous
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonOverload}, Method: methodGet, Tap: true,
		Rejection: rejection(middleware.ReasonOverload, codes.Unavailable)}) // the caller's key unknown to the tap: no tenant
	want := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tenant="acme",tier="gold"} 3
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tenant="globex",tier="gold"} 2
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tenant="none",tier="none"} 1
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tenant="other",tier="gold"} 2
floodgate_decisions_total{code="ResourceExhausted",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="quota",source="memory",stage="interceptor",tenant="other",tier="gold"} 1
floodgate_decisions_total{code="Unavailable",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="overload",source="none",stage="tap",tenant="none",tier="none"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_decisions_total"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestTenantLabelsFromLimiter labels a real Limiter's decisions by tenant:
// the Event names the tenant an API key belongs to.
func TestTenantLabelsFromLimiter(t *testing.T) {
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(WithMethods(methodGet), WithTenantLabels(10))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	for _, key := range []string{proKey, freeKey, freeKey, freeKey, ""} {
		_, _ = icpt(callCtx(key), nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop)
	}
	for _, tc := range []struct {
		match map[string]string
		want  float64
	}{
		{map[string]string{"tenant": "p", "tier": "pro", "outcome": "admitted"}, 1},
		{map[string]string{"tenant": "f", "tier": "free", "outcome": "admitted"}, 2},
		{map[string]string{"tenant": "f", "tier": "free", "outcome": "rejected"}, 1},
		{map[string]string{"tenant": "none", "tier": "none", "outcome": "admitted"}, 1},
	} {
		if got := seriesValue(t, c, tc.match); got != tc.want {
			t.Errorf("series %v = %g, want %g", tc.match, got, tc.want)
		}
	}
}

// TestScrapeNeverRepeatsALabelSet: distinct series that come out with the
// same labels are summed into one, since a scrape that sends a label set
// twice fails whole.
func TestScrapeNeverRepeatsALabelSet(t *testing.T) {
	admit := func(tier, tenant string, dryRun bool) middleware.Event {
		return middleware.Event{Decision: middleware.Decision{Tier: tier, Tenant: tenant, Allowed: true, DryRun: dryRun}, Method: methodGet}
	}
	for _, tc := range []struct {
		name       string
		opts       []Option
		events     []middleware.Event
		label, val string // of the one series the events count in
	}{
		{"a tier named other, over the cap", []Option{WithMaxTiers(1)},
			[]middleware.Event{admit("other", "", false), admit("gold", "", false)}, "tier", "other"},
		{"a tier named none, and anonymous", nil,
			[]middleware.Event{admit("none", "", false), admit("", "", false)}, "tier", "none"},
		{"dry run and not", nil,
			[]middleware.Event{admit("pro", "", false), admit("pro", "", true)}, "tier", "pro"},
		{"a tier that is not UTF-8", nil,
			[]middleware.Event{admit("pro\xff", "", false), admit("pro\xfe", "", false)}, "tier", "pro\ufffd"},
		{"a tenant named none, and anonymous", []Option{WithTenantLabels(4)},
			[]middleware.Event{admit("pro", "none", false), admit("pro", "", false)}, "tenant", "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(append(tc.opts, WithMethods(methodGet))...)
			if err != nil {
				t.Fatal(err)
			}
			obs := c.Observer()
			for _, e := range tc.events {
				obs(e)
			}
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(c)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatalf("Gather: %v", err)
			}
			var got []string
			for _, mf := range mfs {
				if mf.GetName() != "floodgate_decisions_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if lp.GetName() == tc.label {
							got = append(got, fmt.Sprintf("%s=%q %v", tc.label, lp.GetValue(), m.GetCounter().GetValue()))
						}
					}
				}
			}
			if want := fmt.Sprintf("%s=%q 2", tc.label, tc.val); len(got) != 1 || got[0] != want {
				t.Errorf("series %v, want one: %s", got, want)
			}
		})
	}
}

// TestScrapeRacesANewTier: a tier named after a scrape read the tier list
// is labelled by its name, not as "other", and the scrape still succeeds.
func TestScrapeRacesANewTier(t *testing.T) {
	c, err := New(WithMethods(methodGet), WithMaxTiers(2))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			obs(middleware.Event{Decision: middleware.Decision{Tier: []string{"gold", "silver", "bronze"}[i%3], Allowed: true}, Method: methodGet})
		}
	})
	for range 200 {
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("Gather while tiers are named: %v", err)
		}
	}
	close(stop)
	wg.Wait()
}

// TestRejectionLogSurvivesClockStep: a wall clock stepped back an hour must
// not silence the rejection log for that hour.
func TestRejectionLogSurvivesClockStep(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(100000, 0)
	c, err := New(WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)), time.Second),
		WithClock(floodgate.ClockFunc(func() time.Time { return now })))
	if err != nil {
		t.Fatal(err)
	}
	obs := c.Observer()
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonQuota}, Method: methodGet})
	now = now.Add(-time.Hour)
	for range 60 { // a rejection a second for a minute
		now = now.Add(time.Second)
		obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonQuota}, Method: methodGet})
	}
	if lines := strings.Count(buf.String(), "\n"); lines < 50 {
		t.Errorf("%d log lines in the minute after the clock stepped back, want about 60", lines)
	}
}

// TestRepeatedMethods: a method registered twice is one label, and the
// methods after it keep their own.
func TestRepeatedMethods(t *testing.T) {
	c, err := New(WithMethods(methodGet, methodSecret, methodGet), WithMethods("/x.Y/Z"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{methodGet, methodSecret, "/x.Y/Z", "/x.Y/Z"} {
		c.Observer()(middleware.Event{Decision: middleware.Decision{Allowed: true}, Method: m})
	}
	for m, want := range map[string]float64{methodGet: 1, methodSecret: 1, "/x.Y/Z": 2} {
		if got := seriesValue(t, c, map[string]string{"method": m}); got != want {
			t.Errorf("series of %s = %g, want %g", m, got, want)
		}
	}
}
