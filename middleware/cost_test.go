package middleware_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

const (
	llmGenerate = "/llm.v1.Completions/Generate"
	llmStream   = "/llm.v1.Completions/Stream"
)

// tokensPerMinute is the metered quota of the tests: 100,000 tokens a
// minute in bursts of 20,000, with the default debt limit of one burst and
// an estimate of 4,000 a call, which a caller may state in x-max-tokens.
var tokensPerMinute = tenant.MeteredSpec{
	Unit: "tokens", Rate: 100000, Per: time.Minute, Burst: 20000,
	Estimate: 4000, EstimateHeader: "x-max-tokens",
}

// meteredTable: acme's calls to the Completions service are metered in
// spec (and limited to 1000 calls a second, which no test reaches).
func meteredTable(t testing.TB, spec tenant.MeteredSpec) *tenant.Table {
	t.Helper()
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{"acme": {
			Keys:    []string{hashKey(t, acmeKey)},
			Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000},
			Methods: map[string]tenant.MethodSpec{"/llm.v1.Completions/*": {Metered: &spec}},
		}},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// meterFixture is a Limiter over meteredTable with a fake clock.
type meterFixture struct {
	fixture
	tbl    *tenant.Table
	meter  *tenant.Meter // acme's
	events *eventLog
}

type eventLog struct {
	mu  sync.Mutex
	all []middleware.Event
}

func (e *eventLog) add(ev middleware.Event) {
	e.mu.Lock()
	ev.Context = nil
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

// take returns the events recorded since the last take.
func (e *eventLog) take() []middleware.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.all
	e.all = nil
	return out
}

func newMeterFixture(t testing.TB, spec tenant.MeteredSpec, opts ...middleware.Option) meterFixture {
	t.Helper()
	c := newClock()
	store, err := keyed.New(keyed.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	return meterFixtureOn(t, store, c, spec, opts...)
}

func meterFixtureOn(t testing.TB, store *keyed.Map, c *clock, spec tenant.MeteredSpec, opts ...middleware.Option) meterFixture {
	t.Helper()
	tbl := meteredTable(t, spec)
	ev, ty := &eventLog{}, &tally{}
	l, err := middleware.New(store, middleware.Static(tbl), append([]middleware.Option{middleware.WithClock(c), ty.option(ev.add)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	acme, _ := tbl.TenantByID("acme")
	return meterFixture{fixture: fixture{l: l, store: store, clock: c, tally: ty}, tbl: tbl, meter: acme.Rule(llmGenerate).Meter, events: ev}
}

// tokens returns what acme's metered bucket holds (negative: owes).
func (f meterFixture) tokens() float64 {
	return f.store.Tokens("t:acme:"+f.meter.ID, f.meter.Limit)
}

var acmeCall = call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}

// withMD returns c with the extra metadata pairs.
func (c call) withMD(kv ...string) call {
	c.md = metadata.Join(c.md, metadata.Pairs(kv...))
	return c
}

// meteredUnary calls the unary interceptor directly with a handler that
// reports cost (nothing when cost < 0) and returns herr, and reports whether
// the handler ran, with the decision it saw.
func meteredUnary(l *middleware.Limiter, c call, cost int64, herr error) (ran bool, d middleware.Decision, ts *transportStream, err error) {
	ctx, ts := c.context(llmGenerate)
	_, err = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(ctx context.Context, _ any) (any, error) {
		ran = true
		d, _ = middleware.FromContext(ctx)
		if cost >= 0 {
			middleware.ReportCost(ctx, cost)
		}
		return nil, herr
	})
	return ran, d, ts, err
}

// details decodes a rejection's status details by kind.
type details struct {
	info  *errdetails.ErrorInfo
	retry *errdetails.RetryInfo
	quota *errdetails.QuotaFailure
	bad   *errdetails.BadRequest
}

func detailsOf(t *testing.T, err error) (*status.Status, details) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("err = %v, want a status", err)
	}
	var d details
	for _, x := range st.Details() {
		switch x := x.(type) {
		case *errdetails.ErrorInfo:
			d.info = x
		case *errdetails.RetryInfo:
			d.retry = x
		case *errdetails.QuotaFailure:
			d.quota = x
		case *errdetails.BadRequest:
			d.bad = x
		default:
			t.Errorf("unexpected detail %T", x)
		}
	}
	return st, d
}

// TestMeteredRefund: a call that costs less than its estimate gets the
// difference back.
func TestMeteredRefund(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	ran, d, _, err := meteredUnary(f.l, acmeCall, 1000, nil)
	if !ran || err != nil {
		t.Fatalf("ran %v, err %v; want admitted", ran, err)
	}
	if got, want := d.Reserved, int64(4000); got != want {
		t.Errorf("Decision.Reserved = %d, want %d", got, want)
	}
	if got, want := d.Metered.Remaining, 16000; got != want {
		t.Errorf("Decision.Metered.Remaining = %d, want %d", got, want)
	}
	if got, want := f.tokens(), 19000.0; got != want {
		t.Errorf("bucket holds %v tokens after the settle, want %v", got, want)
	}
	lim, id := f.meter.Limit, f.meter.ID
	want := []middleware.Event{
		{Decision: middleware.Decision{Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonAdmitted, Allowed: true, Reserved: 4000,
			Metered: floodgate.Result{Allowed: true, Limit: lim, Remaining: 16000, ResetAfter: 2400 * time.Millisecond}},
			Method: llmGenerate, Unit: "tokens", MeterID: id},
		{Decision: middleware.Decision{Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonSettled, Allowed: true, Reserved: 4000,
			Metered: floodgate.Result{Allowed: true, Limit: lim, Remaining: 19000, ResetAfter: 600 * time.Millisecond}},
			Method: llmGenerate, Unit: "tokens", Settled: 1000, MeterID: id},
	}
	if diff := cmp.Diff(want, f.events.take(), eventOpts); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got, want := f.tally.counts(), (counts{Admitted: 1, Settled: 1}); got != want {
		t.Errorf("counts() = %+v, want %+v", got, want)
	}
}

// TestMeteredDebt: calls that cost more than they reserved take the bucket
// into debt, and the next call is refused for it, saying so and when the
// debt is repaid.
func TestMeteredDebt(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	// One call that overruns: charged the difference, no debt yet.
	if ran, _, _, err := meteredUnary(f.l, acmeCall, 6000, nil); !ran || err != nil {
		t.Fatalf("ran %v, err %v", ran, err)
	}
	if got, want := f.tokens(), 14000.0; got != want {
		t.Errorf("after one overrun the bucket holds %v, want %v", got, want)
	}
	// Three at once reserve 12,000 of the 14,000; each costs 6,000.
	release := make(chan struct{})
	var wg sync.WaitGroup
	started := make(chan bool)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, _ := acmeCall.context(llmGenerate)
			_, _ = f.l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(ctx context.Context, _ any) (any, error) {
				started <- true
				<-release
				middleware.ReportCost(ctx, 6000)
				return nil, nil
			})
		}()
	}
	for range 3 {
		<-started
	}
	close(release)
	wg.Wait()
	if got, want := f.tokens(), -4000.0; got != want { // 14,000 − 3 × 6,000
		t.Fatalf("bucket holds %v, want %v", got, want)
	}
	f.events.take()
	ran, _, ts, err := meteredUnary(f.l, acmeCall, 0, nil)
	if ran {
		t.Fatal("a call ran while its tenant was in debt")
	}
	st, det := detailsOf(t, err)
	if st.Code() != codes.ResourceExhausted || st.Message() != "quota in debt" {
		t.Errorf("status = %v, want RESOURCE_EXHAUSTED quota in debt", st)
	}
	wantInfo := &errdetails.ErrorInfo{Reason: middleware.ReasonDebt.ErrorReason(), Domain: defaultDomain,
		Metadata: map[string]string{"quota_unit": "tokens"}}
	if diff := cmp.Diff(wantInfo.String(), det.info.String()); diff != "" {
		t.Errorf("ErrorInfo (-want +got):\n%s", diff)
	}
	// The debt of 4,000 and the estimate of 4,000 at 100,000 a minute.
	if det.retry == nil || det.retry.RetryDelay.AsDuration() != 4800*time.Millisecond {
		t.Errorf("RetryInfo = %v, want 4.8s", det.retry)
	}
	if det.quota == nil || !strings.Contains(det.quota.Violations[0].Description, "tokens quota is in debt") {
		t.Errorf("QuotaFailure = %v, want the tokens quota in debt", det.quota)
	}
	if got, want := ts.trailer.Get(pushbackKey), []string{"4800"}; !cmp.Equal(got, want) {
		t.Errorf("pushback = %q, want %q", got, want)
	}
	want := []middleware.Event{{
		Decision: middleware.Decision{Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonDebt,
			Metered: floodgate.Result{Limit: f.meter.Limit, Owed: 4000, RetryAfter: 4800 * time.Millisecond, ResetAfter: 14400 * time.Millisecond}},
		Method: llmGenerate, Unit: "tokens", MeterID: f.meter.ID,
		Rejection: &middleware.Rejection{Reason: middleware.ReasonDebt, Code: codes.ResourceExhausted, RetryAfter: 4800 * time.Millisecond, Unit: "tokens"},
	}}
	if diff := cmp.Diff(want, f.events.take(), eventOpts); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got, want := f.tally.counts(), (counts{Admitted: 4, Debt: 1, Settled: 4}); got != want {
		t.Errorf("counts() = %+v, want %+v", got, want)
	}
	// A refused call takes nothing, and once repaid the tenant is back.
	if got, want := f.tokens(), -4000.0; got != want {
		t.Errorf("the refusal changed the bucket to %v, want %v", got, want)
	}
	f.clock.Advance(4800 * time.Millisecond)
	if ran, _, _, err := meteredUnary(f.l, acmeCall, 4000, nil); !ran || err != nil {
		t.Errorf("after the wait: ran %v, err %v; want admitted", ran, err)
	}
}

// TestSettleEventMetered: a settle's event carries the bucket as the
// settle left it, its debt included, and none when the settle made no
// store call.
func TestSettleEventMetered(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	for _, cost := range []int64{26000, -1} { // 22,000 over: 6,000 owed; then a call that reports nothing
		if cost < 0 {
			f.clock.Advance(7 * time.Second) // 11,666 back: the debt and an estimate
		}
		if ran, _, _, err := meteredUnary(f.l, acmeCall, cost, nil); !ran || err != nil {
			t.Fatalf("cost %d: ran %v, err %v", cost, ran, err)
		}
	}
	var got []floodgate.Result
	for _, e := range f.events.take() {
		if e.Reason == middleware.ReasonSettled {
			got = append(got, e.Metered)
		}
	}
	want := []floodgate.Result{{Allowed: true, Limit: f.meter.Limit, Owed: 6000, ResetAfter: 15600 * time.Millisecond}, {}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("settle events' Metered (-want +got):\n%s", diff)
	}
}

// TestMeteredEndWithoutReport: a call that ends without a report settles
// at its estimate, however it ends, with a context that outlives it.
func TestMeteredEndWithoutReport(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(ctx context.Context) (any, error)
	}{
		{"error", func(context.Context) (any, error) { return nil, status.Error(codes.Internal, "backend failed") }},
		{"panic", func(context.Context) (any, error) { panic("handler bug") }},
		{"deadline", func(ctx context.Context) (any, error) { <-ctx.Done(); return nil, ctx.Err() }},
		{"success without a report", func(context.Context) (any, error) { return "ok", nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			base, err := keyed.New(keyed.WithClock(c))
			if err != nil {
				t.Fatal(err)
			}
			store := &settleRecorder{Map: base}
			ty := &tally{}
			l, err := middleware.New(store, middleware.Static(meteredTable(t, tokensPerMinute)), middleware.WithClock(c), ty.option(nil))
			if err != nil {
				t.Fatal(err)
			}
			ctx, _ := acmeCall.context(llmGenerate)
			ctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second)) // already over
			defer cancel()
			func() {
				defer func() { _ = recover() }()
				_, _ = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(ctx context.Context, _ any) (any, error) {
					return tc.handler(ctx)
				})
			}()
			if got, want := ty.counts().Settled, uint64(1); got != want {
				t.Errorf("counts().Settled = %d, want %d", got, want)
			}
			// The estimate stays charged, and no settle call was needed.
			acme, _ := meteredTable(t, tokensPerMinute).TenantByID("acme")
			m := acme.Rule(llmGenerate).Meter
			if got, want := base.Tokens("t:acme:"+m.ID, m.Limit), 16000.0; got != want {
				t.Errorf("bucket holds %v, want %v: the estimate charged", got, want)
			}
			if n := store.settles(); n != 0 {
				t.Errorf("%d settle calls, want none: a settle at the estimate changes nothing", n)
			}
		})
	}
	// A call whose deadline ends it after a report settles at the report,
	// in a context that is not done.
	c := newClock()
	base, _ := keyed.New(keyed.WithClock(c))
	store := &settleRecorder{Map: base}
	l, err := middleware.New(store, middleware.Static(meteredTable(t, tokensPerMinute)), middleware.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := acmeCall.context(llmGenerate)
	ctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, _ = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(ctx context.Context, _ any) (any, error) {
		middleware.ReportCost(ctx, 1000)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if got := store.ctxErrs(); !cmp.Equal(got, []error{nil}) {
		t.Errorf("settle contexts' errors = %v, want one settle with a live context", got)
	}
}

// settleRecorder is a keyed.Map that records the contexts' errors of its
// settles.
type settleRecorder struct {
	*keyed.Map
	mu   sync.Mutex
	errs []error
}

func (s *settleRecorder) SettleN(ctx context.Context, key string, lim floodgate.Limit, reserved, actual int) (floodgate.Result, error) {
	s.mu.Lock()
	s.errs = append(s.errs, ctx.Err())
	s.mu.Unlock()
	return s.Map.SettleN(ctx, key, lim, reserved, actual)
}

func (s *settleRecorder) ReserveN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Reservation, error) {
	r, err := s.Map.ReserveN(ctx, key, lim, n)
	// Settle through the recorder.
	return floodgate.NewReservation(s, key, lim, n, r.Result), err
}

func (s *settleRecorder) settles() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs)
}

func (s *settleRecorder) ctxErrs() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// TestEstimateHeader: a caller may state its call's estimate; a value
// that is not a whole number within the burst refuses the call before
// anything is taken.
func TestEstimateHeader(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	callBucket := func() float64 {
		acme, _ := f.tbl.TenantByID("acme")
		r := acme.Rule(llmGenerate)
		return f.store.Tokens("t:acme:"+r.ID, r.Limit)
	}
	_, d, _, err := meteredUnary(f.l, acmeCall.withMD("x-max-tokens", "1500"), -1, nil)
	if err != nil || d.Reserved != 1500 {
		t.Fatalf("x-max-tokens 1500: reserved %d, err %v; want 1500 reserved", d.Reserved, err)
	}
	_, d, _, err = meteredUnary(f.l, acmeCall.withMD("x-max-tokens", "0"), -1, nil)
	if err != nil || d.Reserved != 0 {
		t.Fatalf("x-max-tokens 0: reserved %d, err %v; want 0 reserved", d.Reserved, err)
	}
	tokens, calls := f.tokens(), callBucket()
	for _, bad := range [][]string{
		{"NaN"}, {"Inf"}, {"+Inf"}, {"-5"}, {"1.5"}, {"1e3"}, {""}, {" 12"}, {"12 "}, {"+12"}, {"0x10"},
		{"20001"}, {"99999999999999999999"}, {"1000", "1000"},
	} {
		kv := []string{}
		for _, v := range bad {
			kv = append(kv, "x-max-tokens", v)
		}
		ran, _, ts, err := meteredUnary(f.l, acmeCall.withMD(kv...), -1, nil)
		if ran {
			t.Errorf("x-max-tokens %q: the handler ran", bad)
			continue
		}
		st, det := detailsOf(t, err)
		if st.Code() != codes.InvalidArgument || st.Message() != "invalid cost estimate" {
			t.Errorf("x-max-tokens %q: status %v, want INVALID_ARGUMENT", bad, st)
		}
		if det.info == nil || det.info.Reason != middleware.ReasonInvalidEstimate.ErrorReason() || det.info.Metadata["quota_unit"] != "tokens" {
			t.Errorf("x-max-tokens %q: ErrorInfo %v", bad, det.info)
		}
		wantBad := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: "x-max-tokens", Description: "must be a whole number of tokens from 0 to 20000"}}}
		if det.bad.String() != wantBad.String() || det.retry != nil {
			t.Errorf("x-max-tokens %q: BadRequest %v and RetryInfo %v, want %v and none", bad, det.bad, det.retry, wantBad)
		}
		if got, want := ts.trailer.Get(pushbackKey), []string{"-1"}; !cmp.Equal(got, want) {
			t.Errorf("x-max-tokens %q: pushback %q, want %q", bad, got, want)
		}
	}
	if f.tokens() != tokens || callBucket() != calls {
		t.Errorf("refused estimates took tokens: metered %v → %v, calls %v → %v", tokens, f.tokens(), calls, callBucket())
	}
	if got, want := f.tally.counts().InvalidEstimates, uint64(14); got != want {
		t.Errorf("counts().InvalidEstimates = %d, want %d", got, want)
	}
}

// TestCostFuncs: WithCostEstimate comes before the header and the config,
// WithActualCost adds to ReportCost, and negative values are ignored.
func TestCostFuncs(t *testing.T) {
	estimate := func(_ context.Context, method string, req any) (int64, bool) {
		n, ok := req.(int64)
		return n, ok && method == llmGenerate
	}
	actual := func(_ context.Context, method string, resp any) (int64, bool) {
		n, ok := resp.(int64)
		return n, ok
	}
	f := newMeterFixture(t, tokensPerMinute, middleware.WithCostEstimate(estimate), middleware.WithActualCost(actual))
	run := func(c call, req any, report int64, resp any) (middleware.Decision, error) {
		t.Helper()
		ctx, _ := c.context(llmGenerate)
		var d middleware.Decision
		_, err := f.l.UnaryServerInterceptor()(ctx, req, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(ctx context.Context, _ any) (any, error) {
			d, _ = middleware.FromContext(ctx)
			if report >= 0 {
				middleware.ReportCost(ctx, report)
			}
			return resp, nil
		})
		return d, err
	}
	// The function's estimate beats the header's; the response's cost adds
	// to the report.
	before := f.tokens()
	d, err := run(acmeCall.withMD("x-max-tokens", "3000"), int64(500), 100, int64(200))
	if err != nil || d.Reserved != 500 {
		t.Fatalf("reserved %d, err %v; want 500", d.Reserved, err)
	}
	if got, want := before-f.tokens(), 300.0; got != want {
		t.Errorf("the call cost %v, want %v", got, want)
	}
	// Negative values are ignored: the header's estimate, no actual cost
	// from the response, so the report's alone.
	before = f.tokens()
	d, err = run(acmeCall.withMD("x-max-tokens", "3000"), int64(-7), 100, int64(-1))
	if err != nil || d.Reserved != 3000 {
		t.Fatalf("reserved %d, err %v; want the header's 3000", d.Reserved, err)
	}
	if got, want := before-f.tokens(), 100.0; got != want {
		t.Errorf("the call cost %v, want %v", got, want)
	}
	if got, want := f.tally.counts().InvalidCosts, uint64(2); got != want {
		t.Errorf("counts().InvalidCosts = %d, want %d", got, want)
	}
	// An estimate the burst can never hold is a refusal without retry.
	before = f.tokens()
	ctx, ts := acmeCall.context(llmGenerate)
	_, err = f.l.UnaryServerInterceptor()(ctx, int64(20001), &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(context.Context, any) (any, error) {
		t.Error("the handler ran")
		return nil, nil
	})
	st, det := detailsOf(t, err)
	if st.Code() != codes.ResourceExhausted || det.retry != nil || det.info.Reason != middleware.ReasonQuota.ErrorReason() {
		t.Errorf("estimate over the burst: %v, RetryInfo %v; want RESOURCE_EXHAUSTED without one", st, det.retry)
	}
	if got := ts.trailer.Get(pushbackKey); !cmp.Equal(got, []string{"-1"}) {
		t.Errorf("pushback = %q, want -1", got)
	}
	if f.tokens() != before {
		t.Errorf("a refused estimate took tokens: %v → %v", before, f.tokens())
	}
}

// TestReportCostNoOps: ReportCost says false, and counts nothing, outside
// a metered call, for a negative cost and once the call is over.
func TestReportCostNoOps(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	if middleware.ReportCost(context.Background(), 10) {
		t.Error("ReportCost outside any call = true")
	}
	// A limited call without a metered quota.
	if ran, d, _, _ := unary(f.l, acmeCall, methodGet); !ran || d.Reserved != 0 {
		t.Fatalf("unmetered call: ran %v, reserved %d", ran, d.Reserved)
	}
	ctx, _ := acmeCall.context(methodGet)
	var inner context.Context
	_, _ = f.l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, func(ctx context.Context, _ any) (any, error) {
		if middleware.ReportCost(ctx, 10) {
			t.Error("ReportCost in an unmetered call = true")
		}
		return nil, nil
	})
	before := f.tokens()
	ctx, _ = acmeCall.context(llmGenerate)
	_, _ = f.l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(ctx context.Context, _ any) (any, error) {
		inner = ctx
		if middleware.ReportCost(ctx, -1) {
			t.Error("ReportCost(-1) = true")
		}
		if !middleware.ReportCost(context.WithValue(ctx, struct{}{}, 1), 1000) {
			t.Error("ReportCost through a derived context = false")
		}
		return nil, nil
	})
	if middleware.ReportCost(inner, 5000) {
		t.Error("ReportCost after the call settled = true")
	}
	if got, want := before-f.tokens(), 1000.0; got != want {
		t.Errorf("the call cost %v, want %v: only its one valid report", got, want)
	}
	if got, want := f.tally.counts().InvalidCosts, uint64(1); got != want {
		t.Errorf("counts().InvalidCosts = %d, want %d", got, want)
	}
}

// TestChargeBeyondDebtLimit: a report that the debt limit cannot hold is
// charged down to it, and the rest is counted, not lost silently.
func TestChargeBeyondDebtLimit(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	if ran, _, _, err := meteredUnary(f.l, acmeCall, 100000, nil); !ran || err != nil {
		t.Fatalf("ran %v, err %v", ran, err)
	}
	// 20,000 in the bucket and 20,000 of debt: 60,000 not charged.
	if got, want := f.tokens(), -20000.0; got != want {
		t.Errorf("bucket holds %v, want %v", got, want)
	}
	evs := f.events.take()
	if got := evs[len(evs)-1]; got.Reason != middleware.ReasonSettled || got.Settled != 100000 || got.Uncharged != 60000 {
		t.Errorf("settle event %+v, want 100000 settled, 60000 uncharged", got)
	}
	if got, want := f.tally.counts().Uncharged, uint64(60000); got != want {
		t.Errorf("counts().Uncharged = %d, want %d", got, want)
	}
}

// TestSettleOnce: Admission.Done settles once, however often it is called.
func TestSettleOnce(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	ctx := context.Background()
	a, err := f.l.Admit(ctx, middleware.Call{Method: llmGenerate, Header: mdHeaderOf(apiKeyMD(acmeKey))})
	if err != nil {
		t.Fatal(err)
	}
	middleware.ReportCost(a.Context(), 500)
	a.Done()
	after := f.tokens()
	middleware.ReportCost(a.Context(), 500)
	a.Done()
	if got := f.tokens(); got != after || got != 19500 {
		t.Errorf("bucket holds %v after a second Done, want %v (19500)", got, after)
	}
	if got, want := f.tally.counts().Settled, uint64(1); got != want {
		t.Errorf("counts().Settled = %d, want %d", got, want)
	}
}

type mdHeaderOf metadata.MD

func (h mdHeaderOf) Values(key string) []string { return h[key] }

// TestDebtSurvivesReload: the metered bucket keeps its debt through a
// reload that changes the quota's rate, which then sets the repayment.
func TestDebtSurvivesReload(t *testing.T) {
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	reg.Set(meteredTable(t, tokensPerMinute))
	c := newClock()
	store, _ := keyed.New(keyed.WithClock(c))
	l, err := middleware.New(store, reg, middleware.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	if ran, _, _, err := meteredUnary(l, acmeCall, 30000, nil); !ran || err != nil {
		t.Fatalf("ran %v, err %v", ran, err)
	}
	halved := tokensPerMinute
	halved.Rate = 50000
	reg.Set(meteredTable(t, halved))
	acme, _ := reg.Table().TenantByID("acme")
	m := acme.Rule(llmGenerate).Meter
	if got, want := store.Tokens("t:acme:"+m.ID, m.Limit), -10000.0; got != want {
		t.Fatalf("after the reload the bucket holds %v, want %v", got, want)
	}
	_, _, _, err = meteredUnary(l, acmeCall, 0, nil)
	_, det := detailsOf(t, err)
	// 10,000 owed and 4,000 to reserve at 50,000 a minute: 16.8 s, on the
	// grid of retry delays 17 s.
	if det.info.GetReason() != middleware.ReasonDebt.ErrorReason() || det.retry.RetryDelay.AsDuration() != 17*time.Second {
		t.Errorf("after the reload: %v, RetryInfo %v; want IN_DEBT for 17s", det.info, det.retry)
	}
}

// TestDryRunBuildsNoDebt: a dry run whose calls overrun leaves no debt to
// the enforcement that follows it on the same store (the failure of a dry
// run that charged its overruns, then refused every call for hours once
// enforcement was switched on).
func TestDryRunBuildsNoDebt(t *testing.T) {
	c := newClock()
	store, _ := keyed.New(keyed.WithClock(c))
	dry := meterFixtureOn(t, store, c, tokensPerMinute, middleware.WithDryRun(true))
	var debts int
	for range 20 {
		ran, d, _, err := meteredUnary(dry.l, acmeCall, 30000, nil)
		if !ran || err != nil {
			t.Fatalf("dry run: ran %v, err %v; want every call run", ran, err)
		}
		if d.Reason == middleware.ReasonDebt {
			debts++
		}
		c.Advance(100 * time.Millisecond)
	}
	if debts == 0 {
		t.Error("the dry run never reported a call that enforcement would refuse for debt")
	}
	if got := dry.tally.counts().Debt; got != uint64(debts) {
		t.Errorf("counts().Debt = %d, want %d", got, debts)
	}
	if got := dry.tokens(); got != float64(tokensPerMinute.Burst) {
		t.Errorf("the enforced bucket holds %v after the dry run, want it full (%d)", got, tokensPerMinute.Burst)
	}
	enforce := meterFixtureOn(t, store, c, tokensPerMinute)
	for i := range 5 {
		if ran, d, _, err := meteredUnary(enforce.l, acmeCall, 1000, nil); !ran || err != nil {
			t.Fatalf("enforcement call %d: ran %v, err %v (%v); want the tenant admitted at once", i, ran, err, d.Reason)
		}
	}
}

// TestDryRunRefusedCallNotMetered: a call a dry run's quota refused runs,
// holds no reservation, and its reports charge nothing.
func TestDryRunRefusedCallNotMetered(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute, middleware.WithDryRun(true))
	if _, _, _, err := meteredUnary(f.l, acmeCall, 60000, nil); err != nil {
		t.Fatal(err)
	}
	key := "dry:t:acme:" + f.meter.ID
	owed := f.store.Tokens(key, f.meter.Limit)
	ctx, _ := acmeCall.context(llmGenerate)
	_, err := f.l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, func(ctx context.Context, _ any) (any, error) {
		if d, _ := middleware.FromContext(ctx); d.Allowed || d.Reason != middleware.ReasonDebt {
			t.Errorf("Decision = %+v, want a dry-run refusal for debt", d)
		}
		if middleware.ReportCost(ctx, 5000) {
			t.Error("ReportCost in a refused call = true")
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.store.Tokens(key, f.meter.Limit); got != owed {
		t.Errorf("the dry-run bucket holds %v after a refused call, want %v", got, owed)
	}
}

// TestMeteredRulesShareNoRoute: two services under one call limit (the
// tenant's default) with metered quotas in different units: each method
// meets its own.
func TestMeteredRulesShareNoRoute(t *testing.T) {
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{"acme": {
			Keys:    []string{hashKey(t, acmeKey)},
			Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000},
			Methods: map[string]tenant.MethodSpec{
				"/llm.v1.Completions/*": {Metered: &tokensPerMinute},
				"/files.v1.Files/*":     {Metered: &tenant.MeteredSpec{Unit: "bytes", Rate: 1 << 20, Burst: 1 << 20, Estimate: 100}},
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	store, _ := keyed.New()
	l, err := middleware.New(store, middleware.Static(tbl))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method string
		want   int64
	}{{llmGenerate, 4000}, {"/files.v1.Files/Get", 100}, {llmGenerate, 4000}} {
		if ran, d, _, _ := unary(l, acmeCall, tc.method); !ran || d.Reserved != tc.want || d.Rule.Meter == nil {
			t.Errorf("%s: ran %v, reserved %d, want %d", tc.method, ran, d.Reserved, tc.want)
		}
	}
}

// TestNewNeedsReserver: a table with metered quotas needs a store that
// settles.
func TestNewNeedsReserver(t *testing.T) {
	store, _ := keyed.New()
	_, err := middleware.New(takeOnly{store}, middleware.Static(meteredTable(t, tokensPerMinute)))
	if !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), "Reserver") {
		t.Errorf("New with a store that cannot settle = %v, want ErrInvalidOption naming Reserver", err)
	}
}

// takeOnly is a store that can only take.
type takeOnly struct{ s floodgate.Store }

func (s takeOnly) TakeN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	return s.s.TakeN(ctx, key, lim, n)
}

// TestCostAllocs enforces the allocation budget of metered calls through
// the tap handle and the interceptor: the context the tap handle makes,
// and for an admitted call the one that carries its meter, with its
// report and settle; the tap's alone for a rejection, for debt or for an
// invalid estimate.
func TestCostAllocs(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute, middleware.WithObserver(nil))
	icpt := f.l.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: llmGenerate}
	report := func(ctx context.Context, _ any) (any, error) {
		middleware.ReportCost(ctx, 1000)
		return nil, nil
	}
	// A transport that records nothing, as grpc-go's keeps the trailer.
	quiet := func(c call) context.Context {
		ctx, _ := c.context(llmGenerate)
		return grpc.NewContextWithServerTransportStream(ctx, nopStream{})
	}
	ctx := quiet(acmeCall)
	if got := testing.AllocsPerRun(200, func() {
		f.clock.Advance(time.Second) // more than the call costs comes back
		_, _ = icpt(tapped(f.l, ctx, llmGenerate, acmeCall.md), nil, info, report)
	}); got > 2 {
		t.Errorf("admitted metered call: %v allocations, want ≤ 2", got)
	}
	badCall := acmeCall.withMD("x-max-tokens", "many")
	bad := quiet(badCall)
	if got := testing.AllocsPerRun(200, func() { _, _ = icpt(tapped(f.l, bad, llmGenerate, badCall.md), nil, info, report) }); got != 1 {
		t.Errorf("invalid estimate: %v allocations, want 1", got)
	}
	overrun := func(ctx context.Context, _ any) (any, error) {
		middleware.ReportCost(ctx, 100000)
		return nil, nil
	}
	_, _ = icpt(ctx, nil, info, overrun)
	if got := testing.AllocsPerRun(200, func() { _, _ = icpt(tapped(f.l, ctx, llmGenerate, acmeCall.md), nil, info, report) }); got != 1 {
		t.Errorf("refused for debt: %v allocations, want 1", got)
	}
}

// TestUnrunCallRefunds: a metered call that the overload controller does
// not run (its context ended while it waited for a slot) gets its
// estimate back.
func TestUnrunCallRefunds(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	f := newMeterFixture(t, tokensPerMinute, middleware.WithOverload(ctrl))
	c := middleware.Call{Method: llmGenerate, Header: mdHeaderOf(apiKeyMD(acmeKey))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	a, err := f.l.Admit(ctx, c)
	if status.Code(err) != codes.Canceled {
		t.Fatalf("Admit with an ended context = %v, want CANCELED", err)
	}
	if d, ok := a.Decision(); !ok || d.Reserved != 4000 {
		t.Fatalf("Decision = %+v, %v; want the estimate reserved before the wait", d, ok)
	}
	if got, want := f.tokens(), 20000.0; got != want {
		t.Errorf("bucket holds %v, want %v: the estimate given back", got, want)
	}
	if middleware.ReportCost(a.Context(), 1000) {
		t.Error("ReportCost in a call that did not run = true")
	}
	a.Done()
	if got, want := f.tokens(), 20000.0; got != want {
		t.Errorf("after Done the bucket holds %v, want %v", got, want)
	}
}

// TestShedCallRefunds: a metered call that the overload controller sheds,
// after its quota reserved its estimate, gets the estimate back.
func TestShedCallRefunds(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	f := newMeterFixture(t, tokensPerMinute, middleware.WithOverload(ctrl))
	c := middleware.Call{Method: llmGenerate, Header: mdHeaderOf(apiKeyMD(acmeKey))}
	running, err := f.l.Admit(context.Background(), c) // holds the one slot
	if err != nil {
		t.Fatal(err)
	}
	defer running.Done()
	a, err := f.l.Admit(context.Background(), c)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Admit with every slot taken = %v, want UNAVAILABLE", err)
	}
	if d, ok := a.Decision(); !ok || d.Reason != middleware.ReasonOverload || d.Reserved != 4000 {
		t.Fatalf("Decision = %+v, %v; want shed by the controller after the estimate was reserved", d, ok)
	}
	if got, want := f.tally.counts().Shed, uint64(1); got != want {
		t.Fatalf("counts().Shed = %d, want %d", got, want)
	}
	if got, want := f.tokens(), 16000.0; got != want {
		t.Errorf("bucket holds %v, want %v: only the running call's estimate", got, want)
	}
	if middleware.ReportCost(a.Context(), 1000) {
		t.Error("ReportCost in a shed call = true")
	}
	a.Done()
	if got, want := f.tokens(), 16000.0; got != want {
		t.Errorf("after Done the bucket holds %v, want %v", got, want)
	}
}
