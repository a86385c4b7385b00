package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

var anon = call{addr: "203.0.113.7:5000"}

func TestAdmitsWithinQuota(t *testing.T) {
	f := newFixture(t)
	c := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}
	for i := range 5 {
		ran, d, ts, err := unary(f.l, c, methodGet)
		if err != nil || !ran {
			t.Fatalf("call %d: ran %v, err %v; want the handler to run", i, ran, err)
		}
		if got, want := d.Tenant, "acme"; got != want {
			t.Errorf("Decision.Tenant = %q, want %q", got, want)
		}
		if got, want := d.Tier, "gold"; got != want {
			t.Errorf("Decision.Tier = %q, want %q", got, want)
		}
		if !d.Allowed || d.Reason != middleware.ReasonAdmitted {
			t.Errorf("Decision = %+v, want admitted", d)
		}
		if got, want := d.Result.Remaining, 4-i; got != want {
			t.Errorf("call %d: Remaining = %d, want %d", i, got, want)
		}
		if ts.headerCalls != 0 || ts.trailer != nil {
			t.Errorf("accepted call set metadata: header %v, trailer %v", ts.header, ts.trailer)
		}
	}
}

func TestRejectsOverQuota(t *testing.T) {
	f := newFixture(t)
	for range 2 {
		if ran, _, _, err := unary(f.l, anon, methodGet); !ran || err != nil {
			t.Fatalf("burst call: ran %v, err %v", ran, err)
		}
	}
	ran, _, ts, err := unary(f.l, anon, methodGet)
	if ran {
		t.Fatal("handler ran on a rejected call")
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		t.Fatalf("err = %v, want RESOURCE_EXHAUSTED", err)
	}
	if got, want := st.Message(), "rate limit exceeded"; got != want {
		t.Errorf("message = %q, want %q", got, want)
	}
	if ts.headerCalls != 0 || len(ts.header) != 0 {
		t.Errorf("rejection set header metadata %v", ts.header)
	}
	// Anonymous 1/s with an empty bucket: the next token is 1 s away.
	if got, want := ts.trailer.Get(pushbackKey), []string{"1000"}; !cmp.Equal(got, want) {
		t.Errorf("pushback trailer = %q, want %q", got, want)
	}
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		default:
			t.Errorf("unexpected detail %T", d)
		}
	}
	if info == nil || info.Reason != middleware.ReasonQuota.ErrorReason() || info.Domain != defaultDomain {
		t.Errorf("ErrorInfo = %v, want reason %s domain %s", info, middleware.ReasonQuota.ErrorReason(), defaultDomain)
	}
	if retry == nil || retry.RetryDelay.AsDuration() != time.Second {
		t.Errorf("RetryInfo = %v, want 1s", retry)
	}
	if quota == nil || len(quota.Violations) != 1 {
		t.Errorf("QuotaFailure = %v, want one violation", quota)
	}
	if got, want := f.tally.counts(), (counts{Admitted: 2, Quota: 1}); got != want {
		t.Errorf("counts() = %+v, want %+v", got, want)
	}

	// Once the token is back the caller is admitted again.
	f.clock.Advance(time.Second)
	if ran, _, _, err := unary(f.l, anon, methodGet); !ran || err != nil {
		t.Errorf("after the wait: ran %v, err %v; want admitted", ran, err)
	}
}

func TestRulesUseSeparateBuckets(t *testing.T) {
	f := newFixture(t)
	c := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}
	if ran, _, _, _ := unary(f.l, c, methodPut); !ran {
		t.Fatal("first Put rejected")
	}
	if ran, _, _, _ := unary(f.l, c, methodPut); ran {
		t.Fatal("second Put admitted, want its burst of 1 spent")
	}
	ran, d, _, _ := unary(f.l, c, methodGet)
	if !ran {
		t.Fatal("Get rejected after Put drained its own bucket")
	}
	if d.Rule.ID == "" || d.Rule.Pattern != "default" {
		t.Errorf("Get's rule = %+v, want the default", d.Rule)
	}
	// Tenants do not share buckets either.
	if ran, _, _, _ := unary(f.l, call{addr: "203.0.113.7:5000", md: apiKeyMD(globexKey)}, methodPut); !ran {
		t.Error("globex's Put rejected after acme drained acme's")
	}
}

func TestPushback(t *testing.T) {
	zeroAnon, err := tenant.Compile(&tenant.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		opts     []middleware.Option
		tables   middleware.Tables
		deadline time.Duration
		want     string
	}{
		{name: "wait", want: "1000"},
		{name: "deadline too short", deadline: 100 * time.Millisecond, want: "-1"},
		{name: "deadline long enough", deadline: time.Minute, want: "1000"},
		{name: "over the cap", opts: []middleware.Option{middleware.WithMaxPushback(500 * time.Millisecond)}, want: "-1"},
		{name: "never", tables: middleware.Static(zeroAnon), want: "-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.opts...)
			l := f.l
			if tc.tables != nil {
				var err error
				if l, err = middleware.New(f.store, tc.tables, tc.opts...); err != nil {
					t.Fatal(err)
				}
			}
			var trailer metadata.MD
			for range 3 {
				ctx, ts := anon.context(methodGet)
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				_, err := l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop)
				if err != nil {
					trailer = ts.trailer
					break
				}
			}
			if got := trailer.Get(pushbackKey); !cmp.Equal(got, []string{tc.want}) {
				t.Errorf("pushback = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPushbackNeverZero(t *testing.T) {
	// A fast bucket: 1000/s leaves waits of 1 ms or less, which must round
	// up, never down to 0 ("retry at once").
	tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 3000, Burst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	l, err := middleware.New(f.store, middleware.Static(tbl), middleware.WithClock(f.clock))
	if err != nil {
		t.Fatal(err)
	}
	unary(l, anon, methodGet)
	_, _, ts, err := unary(l, anon, methodGet)
	if err == nil {
		t.Fatal("second call admitted")
	}
	ms, _ := strconv.Atoi(ts.trailer.Get(pushbackKey)[0])
	if ms < 1 {
		t.Errorf("pushback = %d ms, want ≥ 1", ms)
	}
}

var _ middleware.Gate = (*cpugate.Gate)(nil)

// fixedGate is a Gate of fixed scale: any gate plugs into WithGate.
type fixedGate struct {
	scale    float64
	shedding bool
}

func (g fixedGate) Scale() float64 { return g.scale }
func (g fixedGate) Shedding() bool { return g.shedding }

func TestCustomGate(t *testing.T) {
	f := newFixture(t, middleware.WithGate(fixedGate{scale: 0.5, shedding: true}))
	acme := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}
	ran, d, _, err := unary(f.l, acme, methodGet)
	if !ran || d.Result.Limit.Rate != 5 {
		t.Fatalf("first call: ran %v, limit %v, err %v; want admitted at the gold rate halved, 5/s", ran, d.Result.Limit, err)
	}
	for range 20 {
		if _, _, _, err = unary(f.l, acme, methodGet); err != nil {
			break
		}
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("interceptor under the gate: %v, want UNAVAILABLE", err)
	}
	ctx, _ := acme.context(methodGet)
	if _, err := f.l.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: acme.md}); status.Code(err) != codes.Unavailable {
		t.Errorf("tap while the gate sheds: %v, want UNAVAILABLE", err)
	}
}

// scriptedGate returns a Fixed gate driven by explicit readings.
func scriptedGate(t *testing.T) (*cpugate.Gate, func(cpu float64, at time.Time)) {
	t.Helper()
	var next float64
	g, err := cpugate.New(cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		return cpugate.Reading{CPU: next, Source: "script"}, nil
	}), cpugate.WithPolicy(cpugate.Fixed{}))
	if err != nil {
		t.Fatal(err)
	}
	return g, func(cpu float64, at time.Time) {
		next = cpu
		if err := g.SampleAt(at); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOverloadUnderGate(t *testing.T) {
	g, sample := scriptedGate(t)
	f := newFixture(t, middleware.WithGate(g))
	c := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}
	sample(0.95, f.clock.Now())
	if got := g.Scale(); got != cpugate.DefaultFactor {
		t.Fatalf("gate scale = %v, want %v", got, cpugate.DefaultFactor)
	}
	// gold is 10/s burst 5; at 0.2 it is 2/s burst 1.
	ran, d, _, _ := unary(f.l, c, methodGet)
	if !ran {
		t.Fatal("first call rejected")
	}
	if got, want := d.Result.Limit, floodgate.PerSecond(2, 1); got != want {
		t.Errorf("scaled limit = %v, want %v", got, want)
	}
	ran, _, ts, err := unary(f.l, c, methodGet)
	if ran || status.Code(err) != codes.Unavailable {
		t.Fatalf("second call: ran %v, err %v; want UNAVAILABLE", ran, err)
	}
	if got, want := ts.trailer.Get(pushbackKey), []string{"500"}; !cmp.Equal(got, want) {
		t.Errorf("pushback = %q, want %q", got, want)
	}
	st, _ := status.FromError(err)
	for _, det := range st.Details() {
		if info, ok := det.(*errdetails.ErrorInfo); ok && info.Reason != middleware.ReasonGate.ErrorReason() {
			t.Errorf("ErrorInfo.Reason = %q, want %q", info.Reason, middleware.ReasonGate.ErrorReason())
		}
		if _, ok := det.(*errdetails.QuotaFailure); ok {
			t.Error("overload rejection carries QuotaFailure")
		}
	}
	if st := f.tally.counts(); st.Gate != 1 || st.Overload != 0 {
		t.Errorf("counts() = %+v, want 1 gate refusal and no overload", st)
	}
}

func TestExempt(t *testing.T) {
	f := newFixture(t)
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics"} {
		for range 5 {
			ran, _, _, err := unary(f.l, anon, m)
			if !ran || err != nil {
				t.Fatalf("%s: ran %v, err %v; want exempt", m, ran, err)
			}
		}
	}
	if _, ok := middleware.FromContext(context.Background()); ok {
		t.Error("FromContext on a bare context reports a decision")
	}
	if got, want := f.tally.counts(), (counts{Exempt: 15}); got != want {
		t.Errorf("counts() = %+v, want %+v", got, want)
	}
	custom := newFixture(t, middleware.WithExemptions("/inventory.v1.Inventory/"))
	for range 5 {
		if ran, _, _, _ := unary(custom.l, anon, methodGet); !ran {
			t.Fatal("custom exemption not honoured")
		}
	}
	if ran, _, _, _ := unary(custom.l, anon, "/grpc.health.v1.Health/Check"); !ran {
		t.Fatal("health check rejected with budget left")
	}
}

func TestDryRun(t *testing.T) {
	var events []middleware.Event
	ty := &tally{}
	f := newFixture(t, middleware.WithDryRun(true), ty.option(func(e middleware.Event) { events = append(events, e) }))
	var last middleware.Decision
	for i := range 4 {
		ran, d, ts, err := unary(f.l, anon, methodGet)
		if !ran || err != nil {
			t.Fatalf("call %d: ran %v, err %v; dry run must admit", i, ran, err)
		}
		if ts.trailer != nil {
			t.Errorf("dry-run call %d set trailer %v", i, ts.trailer)
		}
		last = d
	}
	if last.Allowed || !last.DryRun || last.Reason != middleware.ReasonQuota {
		t.Errorf("last decision = %+v, want a dry-run quota rejection", last)
	}
	if got, want := ty.counts(), (counts{Admitted: 2, Quota: 2, DryRun: 2}); got != want {
		t.Errorf("counts() = %+v, want %+v", got, want)
	}
	// A dry-run refusal runs: its event carries no rejection.
	const subject = "a:203.0.113.7"
	want := []middleware.Event{
		{Decision: middleware.Decision{Reason: middleware.ReasonAdmitted, Allowed: true, DryRun: true, Subject: subject}, Method: methodGet},
		{Decision: middleware.Decision{Reason: middleware.ReasonAdmitted, Allowed: true, DryRun: true, Subject: subject}, Method: methodGet},
		{Decision: middleware.Decision{Reason: middleware.ReasonQuota, DryRun: true, Subject: subject}, Method: methodGet},
		{Decision: middleware.Decision{Reason: middleware.ReasonQuota, DryRun: true, Subject: subject}, Method: methodGet},
	}
	if diff := cmp.Diff(want, events, eventOpts); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

type failingStore struct{}

var errFailingStore = errors.New("redis: connection refused 10.1.2.3:6379")

func (failingStore) TakeN(context.Context, string, floodgate.Limit, int) (floodgate.Result, error) {
	return floodgate.Result{}, errFailingStore
}

func TestStoreError(t *testing.T) {
	for _, closed := range []bool{false, true} {
		ty := &tally{}
		l, err := middleware.New(failingStore{}, middleware.Static(testTable(t)), middleware.WithFailClosed(closed), ty.option(nil))
		if err != nil {
			t.Fatal(err)
		}
		ran, _, _, err := unary(l, anon, methodGet)
		if ran == closed {
			t.Errorf("fail closed %v: handler ran %v", closed, ran)
		}
		if closed {
			st, _ := status.FromError(err)
			if st.Code() != codes.Unavailable || st.Message() != "rate limiter unavailable" {
				t.Errorf("fail closed: err = %v, want UNAVAILABLE without the store's text", err)
			}
		}
		if got := ty.counts().StoreErrors; got != 1 {
			t.Errorf("StoreErrors = %d, want 1", got)
		}
	}
}

// tooLongStore refuses every key for its length, as redisstore does a key
// longer than its MaxKeyLen, before any I/O.
type tooLongStore struct{}

func (tooLongStore) TakeN(context.Context, string, floodgate.Limit, int) (floodgate.Result, error) {
	return floodgate.Result{}, fmt.Errorf("%w: redisstore: 2000 bytes, more than 1024", floodgate.ErrKeyTooLong)
}

// A key the store refuses for its length is refused, not failed open on:
// it would never fit, and its caller would go unlimited.
func TestKeyTooLongIsRefused(t *testing.T) {
	ty := &tally{}
	l, err := middleware.New(tooLongStore{}, middleware.Static(testTable(t)), ty.option(nil))
	if err != nil {
		t.Fatal(err)
	}
	ran, _, _, err := unary(l, anon, methodGet)
	if ran || status.Code(err) != codes.Unavailable {
		t.Errorf("handler ran %v, err %v; want refused with UNAVAILABLE", ran, err)
	}
	if got := ty.counts().StoreErrors; got != 1 {
		t.Errorf("StoreErrors = %d, want 1", got)
	}
}

func TestCodesAndPlainStatus(t *testing.T) {
	f := newFixture(t, middleware.WithCodes(codes.Unavailable, codes.ResourceExhausted), middleware.WithDetails(false), middleware.WithDomain("inventory.example.com"))
	var err error
	for range 3 {
		_, _, _, err = unary(f.l, anon, methodGet)
	}
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable || len(st.Details()) != 0 {
		t.Errorf("err = %v with %d details, want UNAVAILABLE without details", err, len(st.Details()))
	}
}

func TestRateLimitHeaders(t *testing.T) {
	f := newFixture(t, middleware.WithRateLimitHeaders(true))
	_, _, ts, _ := unary(f.l, anon, methodGet)
	want := metadata.MD{"ratelimit-limit": {"2"}, "ratelimit-remaining": {"1"}, "ratelimit-reset": {"1"}}
	if diff := cmp.Diff(want, ts.header); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	unary(f.l, anon, methodGet)
	_, _, ts, err := unary(f.l, anon, methodGet)
	if err == nil || len(ts.header) != 0 {
		t.Errorf("rejection: err %v, header %v; want no header metadata", err, ts.header)
	}
}

func TestNewValidates(t *testing.T) {
	store := failingStore{}
	tables := middleware.Static(testTable(t))
	for _, tc := range []struct {
		name   string
		store  floodgate.Store
		tables middleware.Tables
		opts   []middleware.Option
		want   string // in the message
	}{
		{name: "nil store", tables: tables, want: "nil store"},
		{name: "nil tables", store: store, want: "nil tables"},
		{name: "no table", store: store, tables: middleware.Static(nil), want: "no table"},
		{"v4 bits", store, tables, []middleware.Option{middleware.WithAddressBits(0, 64)}, "WithAddressBits"},
		{"client address header", store, tables, []middleware.Option{middleware.WithClientAddressHeader("x-client-ip")}, "WithClientAddressHeader"},
		{"v6 bits", store, tables, []middleware.Option{middleware.WithAddressBits(32, 129)}, "WithAddressBits"},
		{"OK code", store, tables, []middleware.Option{middleware.WithCodes(codes.OK, codes.Unavailable)}, "WithCodes"},
		{"pushback cap", store, tables, []middleware.Option{middleware.WithMaxPushback(2 * time.Hour)}, "WithMaxPushback"},
		{"pushback cap below the grid", store, tables, []middleware.Option{middleware.WithMaxPushback(500 * time.Microsecond)}, "WithMaxPushback"},
		{"domain", store, tables, []middleware.Option{middleware.WithDomain("")}, "WithDomain"},
		{"tap floor", store, tables, []middleware.Option{middleware.WithTapFloor(0)}, "WithTapFloor"},
		{"header case", store, tables, []middleware.Option{middleware.WithAPIKeyHeaders("X-Api-Key")}, "WithAPIKeyHeaders"},
		{"exemption", store, tables, []middleware.Option{middleware.WithExemptions("grpc.health")}, "WithExemptions"},
		{"trusted proxy", store, tables, []middleware.Option{middleware.WithTrustedProxies(netip.Prefix{})}, "WithTrustedProxies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := middleware.New(tc.store, tc.tables, tc.opts...)
			if l != nil || !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New() = %v, %v; want an invalid-option error naming %s", l, err, tc.want)
			}
		})
	}
}

func TestObserverLabels(t *testing.T) {
	var events []middleware.Event
	f := newFixture(t, middleware.WithObserver(func(e middleware.Event) { events = append(events, e) }))
	c := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}
	unary(f.l, c, methodPut)
	unary(f.l, c, methodPut)
	acme := middleware.Decision{Tier: "gold", Tenant: "acme", Subject: "t:acme"}
	admitted, refused := acme, acme
	admitted.Reason, admitted.Allowed = middleware.ReasonAdmitted, true
	refused.Reason = middleware.ReasonQuota
	want := []middleware.Event{
		{Decision: admitted, Method: methodPut, Source: floodgate.SourceMemory},
		{Decision: refused, Method: methodPut, Source: floodgate.SourceMemory,
			Rejection: &middleware.Rejection{Reason: middleware.ReasonQuota, Code: codes.ResourceExhausted, RetryAfter: time.Second}},
	}
	if diff := cmp.Diff(want, events, eventOpts); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// sourceStore decides as its result says, like a remote store reporting
// which of its parts decided.
type sourceStore struct{ res floodgate.Result }

func (s sourceStore) TakeN(_ context.Context, _ string, lim floodgate.Limit, _ int) (floodgate.Result, error) {
	r := s.res
	r.Limit = lim
	return r, nil
}

// TestObserverSource passes the store's deciding source on, with the
// tenant; anonymous callers and store errors name no tenant or source.
func TestObserverSource(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store floodgate.Store
		c     call
		want  middleware.Event
	}{
		{"lease", sourceStore{floodgate.Result{Allowed: true, Source: floodgate.SourceLease}}, call{addr: "203.0.113.7:1", md: apiKeyMD(acmeKey)},
			middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonAdmitted, Allowed: true},
				Method: methodGet, Source: floodgate.SourceLease}},
		{"fail closed", sourceStore{floodgate.Result{RetryAfter: time.Second, Source: floodgate.SourceFailClosed}}, call{addr: "203.0.113.7:1", md: apiKeyMD(globexKey)},
			middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "globex", Subject: "t:globex", Reason: middleware.ReasonQuota},
				Method: methodGet, Source: floodgate.SourceFailClosed,
				Rejection: &middleware.Rejection{Reason: middleware.ReasonQuota, Code: codes.ResourceExhausted, RetryAfter: time.Second}}},
		{"anonymous cache", sourceStore{floodgate.Result{RetryAfter: time.Second, Source: floodgate.SourceCache}}, call{addr: "203.0.113.7:1"},
			middleware.Event{Decision: middleware.Decision{Subject: "a:203.0.113.7", Reason: middleware.ReasonQuota},
				Method: methodGet, Source: floodgate.SourceCache,
				Rejection: &middleware.Rejection{Reason: middleware.ReasonQuota, Code: codes.ResourceExhausted, RetryAfter: time.Second}}},
		{"store error", failingStore{}, call{addr: "203.0.113.7:1", md: apiKeyMD(acmeKey)},
			middleware.Event{Decision: middleware.Decision{Tier: "gold", Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonStoreError, Allowed: true},
				Method: methodGet, Err: errFailingStore}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var events []middleware.Event
			l, err := middleware.New(tc.store, middleware.Static(testTable(t)), middleware.WithObserver(func(e middleware.Event) { events = append(events, e) }))
			if err != nil {
				t.Fatal(err)
			}
			unary(l, tc.c, methodGet)
			// The store's error is compared by errors.Is, not its rejection.
			equateErr := cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmpopts.EquateErrors())
			if diff := cmp.Diff([]middleware.Event{tc.want}, events, eventOpts, equateErr); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// serverStream is a fake grpc.ServerStream delivering n messages.
type serverStream struct {
	grpc.ServerStream
	ctx     context.Context
	n       int
	trailer metadata.MD
}

func (s *serverStream) Context() context.Context       { return s.ctx }
func (s *serverStream) SetHeader(md metadata.MD) error { return nil }
func (s *serverStream) SetTrailer(md metadata.MD)      { s.trailer = metadata.Join(s.trailer, md) }
func (s *serverStream) RecvMsg(any) error {
	if s.n == 0 {
		return errors.New("EOF")
	}
	s.n--
	return nil
}

// TestStreamFollowsReload: with WithPerMessage, an open stream's messages
// are limited by the tenant table in force. A reload that lowers the
// tenant's limit applies to the next message, and one that revokes its key
// makes the caller anonymous, as for a new call.
func TestStreamFollowsReload(t *testing.T) {
	mk := func(rate float64, burst int, keys ...string) *tenant.Table {
		tbl, err := tenant.Compile(&tenant.Config{
			Tenants:   map[string]tenant.TenantSpec{"acme": {Default: &tenant.LimitSpec{Rate: rate, Burst: burst}, Keys: keys}},
			Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 1}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}
	key := hashKey(t, acmeKey)
	for _, tc := range []struct {
		name        string
		next        *tenant.Table
		wantMsgs    int    // messages admitted after the reload
		wantSubject string // whose bucket the last message took from
	}{
		{"limit lowered", mk(1, 3, key), 3, "t:acme"},
		{"key revoked", mk(1000, 1000), 1, "a:203.0.113.7"},
		{"no reload", nil, 200, "t:acme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg, err := tenant.New(tenant.WithLogger(nil))
			if err != nil {
				t.Fatal(err)
			}
			reg.Set(mk(1000, 1000, key))
			f := newFixture(t)
			var last middleware.Event
			l, err := middleware.New(f.store, reg, middleware.WithPerMessage(true), middleware.WithClock(f.clock),
				middleware.WithObserver(func(e middleware.Event) { last = e }))
			if err != nil {
				t.Fatal(err)
			}
			ctx, _ := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}.context(methodGet)
			msgs := 0
			handler := func(_ any, s grpc.ServerStream) error {
				if tc.next != nil {
					reg.Set(tc.next)
				}
				for {
					if err := s.RecvMsg(nil); err != nil {
						return err
					}
					msgs++
				}
			}
			ss := &serverStream{ctx: ctx, n: 200}
			err = l.StreamServerInterceptor()(nil, ss, &grpc.StreamServerInfo{FullMethod: methodGet, IsClientStream: true}, handler)
			if msgs != tc.wantMsgs {
				t.Errorf("%d messages admitted after the reload (stream ended with %v), want %d", msgs, err, tc.wantMsgs)
			}
			if got := last.Tenant; (got == "") != (tc.wantSubject[0] == 'a') {
				t.Errorf("last message decided for tenant %q, want the bucket %s", got, tc.wantSubject)
			}
		})
	}
}

func TestStreamInterceptor(t *testing.T) {
	for _, perMessage := range []bool{false, true} {
		f := newFixture(t, middleware.WithPerMessage(perMessage))
		info := &grpc.StreamServerInfo{FullMethod: methodGet, IsClientStream: true}
		var recvErr error
		var got middleware.Decision
		handler := func(_ any, ss grpc.ServerStream) error {
			got, _ = middleware.FromContext(ss.Context())
			for {
				if recvErr = ss.RecvMsg(nil); recvErr != nil {
					return recvErr
				}
			}
		}
		ctx, _ := anon.context(methodGet)
		_ = f.l.StreamServerInterceptor()(nil, &serverStream{ctx: ctx, n: 3}, info, handler)
		if !got.Allowed {
			t.Errorf("per message %v: stream start not admitted: %+v", perMessage, got)
		}
		// Burst 2: the start takes one token; per message, the second
		// message finds the bucket empty.
		if code := status.Code(recvErr); perMessage != (code == codes.ResourceExhausted) {
			t.Errorf("per message %v: RecvMsg error %v", perMessage, recvErr)
		}
		// A stream opened with the bucket empty is rejected at its start.
		ran := false
		err := f.l.StreamServerInterceptor()(nil, &serverStream{ctx: ctx}, info, func(any, grpc.ServerStream) error { ran = true; return nil })
		if perMessage && (ran || status.Code(err) != codes.ResourceExhausted) {
			t.Errorf("stream on an empty bucket: ran %v, err %v", ran, err)
		}
	}
}

func TestLimitImplementsRatelimit(t *testing.T) {
	f := newFixture(t)
	ctx, ts := anon.context(methodGet)
	for range 2 {
		if err := f.l.Limit(ctx); err != nil {
			t.Fatalf("Limit() = %v within the burst", err)
		}
	}
	if err := f.l.Limit(ctx); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Limit() = %v, want RESOURCE_EXHAUSTED", err)
	}
	if ts.trailer.Get(pushbackKey) == nil {
		t.Error("Limit() rejection set no pushback trailer")
	}
	hctx, _ := anon.context("/grpc.health.v1.Health/Check")
	for range 5 {
		if err := f.l.Limit(hctx); err != nil {
			t.Fatalf("Limit() on an exempt method = %v", err)
		}
	}
}

// TestTapPassesWhomItCannotIdentify: a caller that shares its address with
// an anonymous neighbour under a retry delay is turned away at the tap only
// when the tap knows it is that neighbour. A tenant whose API key the tap has
// not seen yet, and any caller while a WithKeyFunc hook names tenants, pass to the
// interceptor, which admits them.
func TestTapPassesWhomItCannotIdentify(t *testing.T) {
	keyFunc := middleware.WithKeyFunc(func(ctx context.Context, _ string) (string, bool) {
		if v := metadata.ValueFromIncomingContext(ctx, "x-user"); len(v) == 1 {
			return v[0], true
		}
		return "", false
	})
	for _, tc := range []struct {
		name      string
		opts      []middleware.Option
		tenant    call
		neighbour bool // whether the tap can still turn the neighbour away
	}{
		{"uncached api key", nil, call{addr: "203.0.113.7:6000", md: apiKeyMD(acmeKey)}, true},
		{"key func", []middleware.Option{keyFunc}, call{addr: "203.0.113.7:6000", md: metadata.Pairs("x-user", "acme")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, sample := scriptedGate(t)
			f := newFixture(t, append(tc.opts, middleware.WithGate(g))...)
			tapCall := func(c call) error {
				ctx, _ := c.context(methodGet)
				_, err := f.l.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: c.md})
				return err
			}
			sample(0.95, f.clock.Now())
			neighbour := call{addr: "203.0.113.7:5000"}
			for range 5 { // past the anonymous burst: the gate's refusals
				unary(f.l, neighbour, methodGet)
			}
			if err := tapCall(neighbour); (status.Code(err) == codes.Unavailable) != tc.neighbour {
				t.Errorf("tap on the neighbour: %v; want rejected: %v", err, tc.neighbour)
			}
			for i := range 3 {
				if err := tapCall(tc.tenant); err != nil {
					t.Fatalf("tap attempt %d rejected tenant acme for its neighbour's retry delay: %v", i, err)
				}
			}
			if ran, d, _, err := unary(f.l, tc.tenant, methodGet); !ran || d.Tenant != "acme" {
				t.Errorf("interceptor: ran %v as %q (%v), want acme admitted", ran, d.Tenant, err)
			}
		})
	}
}

// TestTapSeesThroughMadeUpKeys: a caller under a retry delay cannot slip
// past the tap by sending an API key that names no tenant, fresh or the
// same each time.
func TestTapSeesThroughMadeUpKeys(t *testing.T) {
	g, sample := scriptedGate(t)
	f := newFixture(t, middleware.WithGate(g))
	sample(0.95, f.clock.Now())
	caller := call{addr: "198.51.100.9:5000"}
	for range 5 { // past the anonymous burst: the gate's refusals
		unary(f.l, caller, methodGet)
	}
	for _, key := range []string{"made-up-key-a", "made-up-key-a", "made-up-key-b"} {
		c := call{addr: caller.addr, md: apiKeyMD(key)}
		ctx, _ := c.context(methodGet)
		if _, err := f.l.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: c.md}); status.Code(err) != codes.Unavailable {
			t.Errorf("tap with the made-up key %q: %v, want UNAVAILABLE", key, err)
		}
	}
}

func TestTapHandle(t *testing.T) {
	g, sample := scriptedGate(t)
	var events []middleware.Event
	ty := &tally{}
	f := newFixture(t, middleware.WithGate(g), ty.option(func(e middleware.Event) {
		if e.Tap {
			events = append(events, e)
		}
	}))
	tapCall := func(c call, method string) error {
		ctx, _ := c.context(method)
		_, err := f.l.TapHandle(ctx, &tap.Info{FullMethodName: method, Header: c.md})
		return err
	}
	acme := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}

	// Open gate: the tap admits everyone, even a caller just rejected.
	for range 6 {
		unary(f.l, acme, methodGet)
	}
	if err := tapCall(acme, methodGet); err != nil {
		t.Fatalf("open gate: tap rejected: %v", err)
	}

	// At the floor: a caller inside its retry delay is turned away at the
	// tap, with the overload status and details; others pass.
	sample(0.95, f.clock.Now())
	if _, _, _, err := unary(f.l, acme, methodGet); status.Code(err) != codes.Unavailable {
		t.Fatalf("interceptor at the floor: %v, want UNAVAILABLE", err)
	}
	err := tapCall(acme, methodGet)
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable || len(st.Details()) == 0 {
		t.Errorf("tap at the floor: %v, want UNAVAILABLE with details", err)
	}
	if err := tapCall(call{addr: "203.0.113.7:5000", md: apiKeyMD(globexKey)}, methodGet); err != nil {
		t.Errorf("tap rejected globex, which was never told to wait: %v", err)
	}
	if err := tapCall(anon, methodGet); err != nil {
		t.Errorf("tap rejected an anonymous caller never told to wait: %v", err)
	}
	if err := tapCall(acme, "/grpc.health.v1.Health/Check"); err != nil {
		t.Errorf("tap rejected an exempt method: %v", err)
	}
	// The retry delay runs out: the tap lets the caller through again.
	f.clock.Advance(time.Second)
	if err := tapCall(acme, methodGet); err != nil {
		t.Errorf("tap after the retry delay: %v", err)
	}
	if got := ty.counts().Tap; got != 1 {
		t.Errorf("counts().Tap = %d, want 1", got)
	}
	// The tap's event names the caller as the tap resolved it, and the
	// gate's rejection it was given.
	want := []middleware.Event{{
		Decision: middleware.Decision{Reason: middleware.ReasonGate, Tenant: "acme", Tier: "gold", Subject: "t:acme"},
		Method:   methodGet, Tap: true,
		Rejection: &middleware.Rejection{Reason: middleware.ReasonGate, Code: codes.Unavailable, RetryAfter: 500 * time.Millisecond},
	}}
	if diff := cmp.Diff(want, events, eventOpts); diff != "" {
		t.Errorf("tap events (-want +got):\n%s", diff)
	}
}

// TestReasonNames pins the reasons' names, which label metrics, and the
// ErrorInfo reasons of their rejections, which clients match on.
func TestReasonNames(t *testing.T) {
	for _, tc := range []struct {
		r                 middleware.Reason
		name, errorReason string
	}{
		{middleware.ReasonAdmitted, "admitted", ""},
		{middleware.ReasonExempt, "exempt", ""},
		{middleware.ReasonQuota, "quota", "RATE_LIMITED"},
		{middleware.ReasonOverload, "overload", "OVERLOADED"},
		{middleware.ReasonStoreError, "store_error", "LIMITER_UNAVAILABLE"},
		{middleware.ReasonDebt, "debt", "IN_DEBT"},
		{middleware.ReasonInvalidEstimate, "invalid_estimate", "INVALID_COST_ESTIMATE"},
		{middleware.ReasonSettled, "settled", ""},
		{middleware.ReasonGate, "gate", "OVERLOADED"},
	} {
		if got := tc.r.String(); got != tc.name {
			t.Errorf("Reason(%d).String() = %q, want %q", tc.r, got, tc.name)
		}
		if got := tc.r.ErrorReason(); got != tc.errorReason {
			t.Errorf("%v.ErrorReason() = %q, want %q", tc.r, got, tc.errorReason)
		}
	}
}

// TestRetryGrid: retry delays round up, never down, onto a grid of
// milliseconds up to 1 s, tens of them up to 10 s, then seconds.
func TestRetryGrid(t *testing.T) {
	for _, tc := range []struct{ d, want time.Duration }{
		{0, time.Millisecond},
		{1, time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{999 * time.Millisecond, 999 * time.Millisecond},
		{time.Second, time.Second},
		{time.Second + 1, 1010 * time.Millisecond},
		{9999 * time.Millisecond, 10 * time.Second},
		{10 * time.Second, 10 * time.Second},
		{10*time.Second + 1, 11 * time.Second},
		{time.Minute, time.Minute},
		{time.Hour + 1, time.Hour + time.Second},
	} {
		if got := middleware.GridCeil(tc.d); got != tc.want {
			t.Errorf("GridCeil(%v) = %v, want %v", tc.d, got, tc.want)
		}
		if got := middleware.GridCeil(tc.want); got != tc.want {
			t.Errorf("GridCeil(%v) = %v, want it on the grid", tc.want, got)
		}
	}
}

// TestDecisionCarriesResult reads back, through FromContext, every field of
// the store's Result, for an admitted call and a dry-run rejection.
func TestDecisionCarriesResult(t *testing.T) {
	for _, tc := range []struct {
		name   string
		res    floodgate.Result
		dryRun bool
		want   middleware.Decision
	}{
		{"admitted", floodgate.Result{Allowed: true, Remaining: floodgate.MaxBurst - 1, ResetAfter: 3 * time.Second, Source: floodgate.SourceLease}, false,
			middleware.Decision{Allowed: true, Reason: middleware.ReasonAdmitted}},
		{"dry run", floodgate.Result{RetryAfter: floodgate.Never, ResetAfter: time.Hour, Source: floodgate.SourceFailClosed}, true,
			middleware.Decision{Reason: middleware.ReasonQuota, DryRun: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := middleware.New(sourceStore{tc.res}, middleware.Static(testTable(t)), middleware.WithDryRun(tc.dryRun))
			if err != nil {
				t.Fatal(err)
			}
			ran, d, _, err := unary(l, call{addr: "203.0.113.7:1", md: apiKeyMD(acmeKey)}, methodPut)
			if !ran || err != nil {
				t.Fatalf("ran %v, err %v", ran, err)
			}
			want := tc.want
			want.Tenant, want.Tier, want.Subject = "acme", "gold", "t:acme"
			want.Rule = d.Rule
			want.Result = tc.res
			want.Result.Limit = floodgate.PerSecond(1, 1)
			if diff := cmp.Diff(want, d); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if d.Rule.Pattern != methodPut || d.Rule.Limit != floodgate.PerSecond(1, 1) {
				t.Errorf("rule %+v, want the Put rule of 1/s burst 1", d.Rule)
			}
		})
	}
}

// TestExemptPrefixes checks Exempt against strings.HasPrefix over
// exemption lists and methods of every shape, short ones included.
func TestExemptPrefixes(t *testing.T) {
	methods := []string{"", "/", "/g", "/grpc.health.v1.Health/Check", "/grpc.x/Y", "/xds.service.orca.v3.S/M",
		"/inventory.v1.Inventory/Get", "/Inventory.v1.Inventory/Get", "/i", "x/y", "/\xff"}
	for _, prefixes := range [][]string{
		middleware.DefaultExemptions(),
		{"/"},
		{"/i"},
		{"/inventory.v1.Inventory/Get", "/\xff"},
		{},
	} {
		l, err := middleware.New(failingStore{}, middleware.Static(testTable(t)), middleware.WithExemptions(prefixes...))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range methods {
			want := false
			for _, p := range prefixes {
				want = want || strings.HasPrefix(m, p)
			}
			if got := middleware.Exempt(l, m); got != want {
				t.Errorf("exemptions %q: Exempt(%q) = %v, want %v", prefixes, m, got, want)
			}
		}
	}
}

// TestTapFloor: by default the tap turns away callers inside their retry
// delay whenever the gate sheds; WithTapFloor keeps it out of the way until
// the gate has cut limits to the floor given.
func TestTapFloor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []middleware.Option
		rejected bool
	}{
		{name: "default", rejected: true},
		{name: "floor 0.2", opts: []middleware.Option{middleware.WithTapFloor(0.2)}, rejected: false},
		{name: "floor 0.5", opts: []middleware.Option{middleware.WithTapFloor(0.5)}, rejected: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var next float64
			g, err := cpugate.New(cpugate.SamplerFunc(func() (cpugate.Reading, error) {
				return cpugate.Reading{CPU: next, Source: "script"}, nil
			}), cpugate.WithPolicy(cpugate.Fixed{Factor: 0.5}))
			if err != nil {
				t.Fatal(err)
			}
			f := newFixture(t, append([]middleware.Option{middleware.WithGate(g)}, tc.opts...)...)
			next = 0.95
			if err := g.SampleAt(f.clock.Now()); err != nil {
				t.Fatal(err)
			}
			if g.Scale() != 0.5 {
				t.Fatalf("gate scale = %v, want 0.5", g.Scale())
			}
			acme := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}
			var err2 error
			for range 20 {
				if _, _, _, err2 = unary(f.l, acme, methodGet); err2 != nil {
					break
				}
			}
			if status.Code(err2) != codes.Unavailable {
				t.Fatalf("interceptor while shedding: %v, want UNAVAILABLE", err2)
			}
			ctx, _ := acme.context(methodGet)
			_, err = f.l.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: acme.md})
			if got := status.Code(err) == codes.Unavailable; got != tc.rejected {
				t.Errorf("tap at scale 0.5: %v, want rejected %v", err, tc.rejected)
			}
		})
	}
}
