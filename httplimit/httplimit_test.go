package httplimit_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/httplimit"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	acmeKey   = "acme-0123456789abcdef"
	getStock  = "/inventory.v1.Inventory/GetStock"
	loopbacks = "127.0.0.0/8"
)

// clock is a fake clock, shared by the store and the Limiter, that never
// moves unless told: no bucket refills while a test runs.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// table: acme 1/s burst 3 (GetStock 1/s burst 1), anonymous callers
// burst 1 that never refills in a test.
func table(t testing.TB) *tenant.Table {
	t.Helper()
	h, err := tenant.HashKey(acmeKey)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{"acme": {
			Default: &tenant.LimitSpec{Rate: 1, Burst: 3},
			Methods: map[string]tenant.MethodSpec{getStock: {Limit: &tenant.LimitSpec{Rate: 1, Burst: 1}}},
			Keys:    []string{h},
		}},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1e-6, Burst: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func newLimiter(t testing.TB, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	store, err := keyed.New(keyed.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	l, err := middleware.New(store, middleware.Static(table(t)), append([]middleware.Option{middleware.WithClock(c)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// seen is what the handler behind the middleware saw.
type seen struct {
	mu        sync.Mutex
	decisions []middleware.Decision
}

func (s *seen) handler(w http.ResponseWriter, r *http.Request) {
	d, _ := middleware.FromContext(r.Context())
	s.mu.Lock()
	s.decisions = append(s.decisions, d)
	s.mu.Unlock()
	_, _ = io.WriteString(w, "ok")
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.decisions)
}

func (s *seen) last() middleware.Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.decisions) == 0 {
		return middleware.Decision{}
	}
	return s.decisions[len(s.decisions)-1]
}

// serve serves h behind a Middleware of l on a loopback listener.
func serve(t *testing.T, l *middleware.Limiter, h http.Handler, opts ...httplimit.Option) *httptest.Server {
	t.Helper()
	m, err := httplimit.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(m.Handle(h))
	t.Cleanup(ts.Close)
	return ts
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

func do(t *testing.T, ts *httptest.Server, method, path string, header http.Header) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, body}
}

// statusOf parses a google.rpc.Status JSON body, as grpc-gateway clients do.
func statusOf(t *testing.T, body []byte) *spb.Status {
	t.Helper()
	st := new(spb.Status)
	if err := protojson.Unmarshal(body, st); err != nil {
		t.Fatalf("body %s is not a google.rpc.Status: %v", body, err)
	}
	return st
}

// details returns the ErrorInfo reason and RetryInfo delay of a status,
// and whether it has a QuotaFailure.
func details(t *testing.T, st *spb.Status) (reason string, retry time.Duration, quota bool) {
	t.Helper()
	for _, a := range st.GetDetails() {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *errdetails.ErrorInfo:
			reason = m.GetReason()
		case *errdetails.RetryInfo:
			retry = m.GetRetryDelay().AsDuration()
		case *errdetails.QuotaFailure:
			quota = true
		}
	}
	return reason, retry, quota
}

func TestQuotaRejection(t *testing.T) {
	var s seen
	ts := serve(t, newLimiter(t), http.HandlerFunc(s.handler))
	key := http.Header{"X-Api-Key": {acmeKey}}
	for i := range 3 {
		r := do(t, ts, "GET", "/v1/items", key)
		if r.code != http.StatusOK {
			t.Fatalf("request #%d: %d %s", i, r.code, r.body)
		}
		if d := s.last(); d.Tenant != "acme" || !d.Allowed || d.Result.Remaining != 2-i {
			t.Errorf("request #%d: handler saw %+v, want acme admitted, %d left", i, d, 2-i)
		}
		want := http.Header{
			"Ratelimit-Policy": {`"default";q=3;w=3`},
			"Ratelimit":        {`"default";r=` + string(rune('2'-i)) + `;t=` + string(rune('1'+i))},
		}
		if diff := cmp.Diff(want, pick(r.header, "Ratelimit-Policy", "Ratelimit")); diff != "" {
			t.Errorf("request #%d: headers (-want +got):\n%s", i, diff)
		}
	}
	r := do(t, ts, "GET", "/v1/items", key)
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("request over quota: %d %s, want 429", r.code, r.body)
	}
	want := http.Header{
		"Content-Type":     {"application/json"},
		"Retry-After":      {"1"},
		"Ratelimit-Policy": {`"default";q=3;w=3`},
		"Ratelimit":        {`"default";r=0;t=3`},
	}
	if diff := cmp.Diff(want, pick(r.header, "Content-Type", "Retry-After", "Ratelimit-Policy", "Ratelimit")); diff != "" {
		t.Errorf("429 headers (-want +got):\n%s", diff)
	}
	st := statusOf(t, r.body)
	if st.GetCode() != 8 || st.GetMessage() != "rate limit exceeded" {
		t.Errorf("status %d %q, want 8 (RESOURCE_EXHAUSTED) and the quota message", st.GetCode(), st.GetMessage())
	}
	if reason, retry, quota := details(t, st); reason != middleware.ReasonQuota.ErrorReason() || retry != time.Second || !quota {
		t.Errorf("details: reason %q, retry %v, quota failure %v; want %s, 1s, true", reason, retry, quota, middleware.ReasonQuota.ErrorReason())
	}
	// The body is built once per shared rejection, and stays the same.
	if again := do(t, ts, "GET", "/v1/items", key); string(again.body) != string(r.body) {
		t.Errorf("second rejection's body %s, want %s", again.body, r.body)
	}
}

func pick(h http.Header, keys ...string) http.Header {
	out := http.Header{}
	for _, k := range keys {
		if v, ok := h[k]; ok {
			out[k] = v
		}
	}
	return out
}

func TestRateLimitHeadersOff(t *testing.T) {
	var s seen
	ts := serve(t, newLimiter(t), http.HandlerFunc(s.handler), httplimit.WithRateLimitHeaders(false))
	for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		r := do(t, ts, "GET", "/", nil)
		if r.code != want || r.header.Get("Ratelimit") != "" || r.header.Get("Ratelimit-Policy") != "" {
			t.Errorf("got %d with RateLimit %q, policy %q; want %d without them", r.code, r.header.Get("Ratelimit"), r.header.Get("Ratelimit-Policy"), want)
		}
	}
}

// gate is a scripted middleware.Gate.
type gate struct{ scale float64 }

func (g gate) Scale() float64 { return g.scale }
func (g gate) Shedding() bool { return g.scale < 1 }

// Under overload, a request over its quota as the gate scales it, or shed
// by the overload controller, gets a 503.
func TestOverloadRejection(t *testing.T) {
	t.Run("gate", func(t *testing.T) {
		var s seen
		// acme's burst of 3 at scale 0.5 is 1.
		ts := serve(t, newLimiter(t, middleware.WithGate(gate{0.5})), http.HandlerFunc(s.handler))
		key := http.Header{"Authorization": {"Bearer " + acmeKey}}
		if r := do(t, ts, "GET", "/", key); r.code != http.StatusOK {
			t.Fatalf("first request: %d", r.code)
		}
		r := do(t, ts, "GET", "/", key)
		if r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "2" {
			t.Fatalf("over the scaled quota: %d, Retry-After %q; want 503 and 2 (0.5/s)", r.code, r.header.Get("Retry-After"))
		}
		st := statusOf(t, r.body)
		if reason, _, _ := details(t, st); st.GetCode() != 14 || reason != middleware.ReasonGate.ErrorReason() {
			t.Errorf("status %d, reason %q; want 14 (UNAVAILABLE), %s", st.GetCode(), reason, middleware.ReasonGate.ErrorReason())
		}
		// The policy is the rule's; the bucket is the scaled one.
		if got, want := r.header.Get("Ratelimit-Policy"), `"default";q=3;w=3`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
	})
	t.Run("controller", func(t *testing.T) {
		ctrl, err := overload.New(overload.WithQueueTarget(time.Millisecond/2), overload.WithRetryAfter(1500*time.Millisecond),
			overload.WithClock(&clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}),
			overload.WithLimits(1, 1))
		if err != nil {
			t.Fatal(err)
		}
		entered, release := make(chan struct{}), make(chan struct{})
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				entered <- struct{}{}
				<-release
			}
		})
		ts := serve(t, newLimiter(t, middleware.WithOverload(ctrl)), h)
		key := http.Header{"X-Api-Key": {acmeKey}}
		slow := make(chan response, 1)
		go func() { slow <- do(t, ts, "GET", "/slow", key) }()
		<-entered // the slow request holds the only slot
		r := do(t, ts, "GET", "/fast", key)
		if r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "2" {
			t.Errorf("while the slot is held: %d, Retry-After %q; want 503 and 2", r.code, r.header.Get("Retry-After"))
		}
		if reason, retry, _ := details(t, statusOf(t, r.body)); reason != middleware.ReasonOverload.ErrorReason() || retry != 1500*time.Millisecond {
			t.Errorf("details: %q, %v; want %s, 1.5s", reason, retry, middleware.ReasonOverload.ErrorReason())
		}
		// The shed request's quota was not exhausted: its bucket says so.
		if got, want := r.header.Get("Ratelimit"), `"default";r=1;t=2`; got != want {
			t.Errorf("RateLimit %q, want %q", got, want)
		}
		close(release)
		if r := <-slow; r.code != http.StatusOK {
			t.Errorf("slow request: %d", r.code)
		}
		if s := ctrl.Snapshot(); s.Inflight != 0 {
			t.Errorf("controller in flight after the handler returned: %d", s.Inflight)
		}
	})
}

// A handler that panics still gives its slot back.
func TestPanickingHandlerReleasesItsSlot(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(1, 1),
		overload.WithClock(&clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}))
	if err != nil {
		t.Fatal(err)
	}
	m, err := httplimit.New(newLimiter(t, middleware.WithOverload(ctrl)))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handle(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler") }))
	func() {
		defer func() { _ = recover() }()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Api-Key", acmeKey)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	if s := ctrl.Snapshot(); s.Inflight != 0 {
		t.Errorf("controller in flight after a panic: %d", s.Inflight)
	}
}

func TestAPIKeyTenant(t *testing.T) {
	var s seen
	ts := serve(t, newLimiter(t), http.HandlerFunc(s.handler))
	// Either header names acme, and both take from its one bucket.
	for i, h := range []http.Header{
		{"X-Api-Key": {acmeKey}},
		{"Authorization": {"Bearer " + acmeKey}},
		{"Authorization": {"bearer  " + acmeKey}},
	} {
		if r := do(t, ts, "GET", "/", h); r.code != http.StatusOK || s.last().Tenant != "acme" {
			t.Fatalf("request #%d: %d, tenant %q; want 200 for acme", i, r.code, s.last().Tenant)
		}
	}
	if r := do(t, ts, "GET", "/", http.Header{"X-Api-Key": {acmeKey}}); r.code != http.StatusTooManyRequests {
		t.Errorf("acme's fourth request: %d, want 429", r.code)
	}
	// An unknown key is anonymous, keyed by address.
	if r := do(t, ts, "GET", "/", http.Header{"X-Api-Key": {"made-up-0123456789abcdef"}}); r.code != http.StatusOK || s.last().Tenant != "" {
		t.Errorf("unknown key: %d, tenant %q; want 200, anonymous", r.code, s.last().Tenant)
	}
}

// Forwarding headers name the client only when the peer is a trusted
// proxy; anyone else's are ignored.
func TestForwardingHeaders(t *testing.T) {
	trusted := middleware.WithTrustedProxies(netip.MustParsePrefix(loopbacks))
	for _, tc := range []struct {
		name string
		opts []middleware.Option
		// Each request's header, and whether it is admitted: anonymous
		// callers have a burst of 1 per address.
		steps []step
	}{
		{name: "spoofed x-forwarded-for", steps: []step{
			{"X-Forwarded-For", "198.51.100.1", http.StatusOK},
			{"X-Forwarded-For", "198.51.100.2", http.StatusTooManyRequests},
		}},
		{name: "spoofed forwarded", steps: []step{
			{"Forwarded", "for=198.51.100.1", http.StatusOK},
			{"Forwarded", "for=198.51.100.2", http.StatusTooManyRequests},
		}},
		{name: "spoofed x-real-ip", steps: []step{
			{"X-Real-Ip", "198.51.100.1", http.StatusOK},
			{"X-Real-Ip", "198.51.100.2", http.StatusTooManyRequests},
		}},
		{name: "trusted x-forwarded-for", opts: []middleware.Option{trusted}, steps: []step{
			{"X-Forwarded-For", "198.51.100.1", http.StatusOK},
			{"X-Forwarded-For", "203.0.113.9, 198.51.100.2", http.StatusOK},
			{"X-Forwarded-For", "198.51.100.1, 127.0.0.2", http.StatusTooManyRequests},
		}},
		{name: "trusted forwarded", opts: []middleware.Option{trusted}, steps: []step{
			{"Forwarded", "for=198.51.100.1;proto=https", http.StatusOK},
			{"Forwarded", `for="[2001:db8::1]:4711"`, http.StatusOK},
			{"Forwarded", `for=203.0.113.9, for="198.51.100.1:80";by=127.0.0.1`, http.StatusTooManyRequests},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s seen
			ts := serve(t, newLimiter(t, tc.opts...), http.HandlerFunc(s.handler))
			for i, st := range tc.steps {
				if r := do(t, ts, "GET", "/", http.Header{st.key: {st.value}}); r.code != st.want {
					t.Errorf("request #%d (%s: %s): %d, want %d", i, st.key, st.value, r.code, st.want)
				}
			}
		})
	}
}

type step struct {
	key, value string
	want       int
}

// Hostile headers never reject a request: they are ignored, and the
// caller is anonymous, charged to its address.
func TestHostileHeadersFallBackToTheAddress(t *testing.T) {
	trusted := middleware.WithTrustedProxies(netip.MustParsePrefix(loopbacks))
	for _, tc := range []struct {
		name   string
		header http.Header
	}{
		{"huge api key", http.Header{"X-Api-Key": {strings.Repeat("k", 64<<10)}}},
		{"huge bearer", http.Header{"Authorization": {"Bearer " + strings.Repeat("k", 64<<10)}}},
		{"repeated api key", http.Header{"X-Api-Key": {acmeKey, acmeKey}}},
		{"non-ascii api key", http.Header{"X-Api-Key": {"ключ-ключ-ключ-ключ"}}},
		{"non-ascii bearer", http.Header{"Authorization": {"Bearer \xff\xfe" + acmeKey}}},
		{"unknown scheme", http.Header{"Authorization": {"Basic " + acmeKey}}},
		{"malformed forwarded", http.Header{"Forwarded": {`for="[2001:db8::1`}}},
		{"forwarded junk", http.Header{"Forwarded": {";;=,,for=;for==,for=unknown"}}},
		{"forwarded obfuscated", http.Header{"Forwarded": {"for=_hidden"}}},
		{"non-ascii forwarded", http.Header{"Forwarded": {"for=\xc3\xa9"}}},
		{"huge x-forwarded-for", http.Header{"X-Forwarded-For": {strings.Repeat("x", 200<<10)}}},
		{"repeated x-forwarded-for", http.Header{"X-Forwarded-For": strings.Split(strings.Repeat("junk,", 2000), ",")}},
		{"huge forwarded", http.Header{"Forwarded": {strings.Repeat("for=1.1.1.1;", 20<<10)}}},
		{"x-real-ip junk", http.Header{"X-Real-Ip": {"not-an-address"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s seen
			ts := serve(t, newLimiter(t, trusted), http.HandlerFunc(s.handler))
			if r := do(t, ts, "GET", "/", tc.header); r.code != http.StatusOK || s.last().Tenant != "" {
				t.Fatalf("hostile request: %d %s, tenant %q; want 200, anonymous", r.code, r.body, s.last().Tenant)
			}
			// It took the peer's one token.
			if r := do(t, ts, "GET", "/", nil); r.code != http.StatusTooManyRequests {
				t.Errorf("plain request from the same peer: %d, want 429", r.code)
			}
		})
	}
}

// The path names the method: Connect, gRPC-Web and gRPC paths are the
// gRPC method's, so the method's own rule applies.
func TestPathIsTheMethod(t *testing.T) {
	var s seen
	ts := serve(t, newLimiter(t), http.HandlerFunc(s.handler))
	key := http.Header{"X-Api-Key": {acmeKey}}
	r := do(t, ts, "POST", getStock, key)
	if r.code != http.StatusOK || s.last().Rule.Pattern != getStock {
		t.Fatalf("GetStock: %d, rule %q; want 200 under %s", r.code, s.last().Rule.Pattern, getStock)
	}
	if got, want := r.header.Get("Ratelimit-Policy"), `"`+getStock+`";q=1;w=1`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if r := do(t, ts, "POST", getStock, key); r.code != http.StatusTooManyRequests {
		t.Errorf("GetStock's second call: %d, want 429 (burst 1)", r.code)
	}
	// Health checks are exempt, and carry no decision.
	for range 3 {
		if r := do(t, ts, "POST", "/grpc.health.v1.Health/Check", nil); r.code != http.StatusOK || r.header.Get("Ratelimit") != "" {
			t.Fatalf("health check: %d, RateLimit %q; want 200 without", r.code, r.header.Get("Ratelimit"))
		}
	}
}

// WithMethod maps routes to gRPC methods, as grpc-gateway users do.
func TestWithMethod(t *testing.T) {
	var s seen
	l := newLimiter(t)
	m, err := httplimit.New(l, httplimit.WithMethod(func(r *http.Request) string {
		return map[string]string{"GET /v1/stock/{sku}": getStock}[r.Pattern]
	}))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /v1/stock/{sku}", m.Handle(http.HandlerFunc(s.handler)))
	mux.Handle("GET /v1/other", m.Handle(http.HandlerFunc(s.handler)))
	ts := httptest.NewServer(mux)
	defer ts.Close()
	key := http.Header{"X-Api-Key": {acmeKey}}
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if r := do(t, ts, "GET", "/v1/stock/sku-"+string(rune('a'+i)), key); r.code != want {
			t.Errorf("stock request #%d: %d, want %d", i, r.code, want)
		}
	}
	// A route the function does not name is limited by its path.
	if r := do(t, ts, "GET", "/v1/other", key); r.code != http.StatusOK || s.last().Rule.Pattern != "default" {
		t.Errorf("other route: %d, rule %q; want 200 under the default rule", r.code, s.last().Rule.Pattern)
	}
}

func TestConnectRejections(t *testing.T) {
	var s seen
	ts := serve(t, newLimiter(t), http.HandlerFunc(s.handler))
	key := http.Header{"X-Api-Key": {acmeKey}}
	if r := do(t, ts, "POST", getStock, key); r.code != http.StatusOK {
		t.Fatalf("first call: %d", r.code)
	}
	t.Run("unary", func(t *testing.T) {
		for _, tc := range []struct {
			method, path string
			header       http.Header
		}{
			{"POST", getStock, http.Header{"Connect-Protocol-Version": {"1"}, "Content-Type": {"application/json"}}},
			{"GET", getStock + "?connect=v1&encoding=json&message=%7B%7D", nil},
		} {
			h := tc.header.Clone()
			if h == nil {
				h = http.Header{}
			}
			h.Set("X-Api-Key", acmeKey)
			r := do(t, ts, tc.method, tc.path, h)
			if r.code != http.StatusTooManyRequests || r.header.Get("Content-Type") != "application/json" || r.header.Get("Retry-After") != "1" {
				t.Fatalf("%s: %d %s, %v; want 429 JSON with Retry-After 1", tc.method, r.code, r.body, r.header)
			}
			checkConnectError(t, r.body)
		}
	})
	t.Run("stream", func(t *testing.T) {
		h := http.Header{"X-Api-Key": {acmeKey}, "Content-Type": {"application/connect+proto"}, "Connect-Protocol-Version": {"1"}}
		r := do(t, ts, "POST", getStock, h)
		if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/connect+proto" {
			t.Fatalf("stream: %d, %q; want 200 application/connect+proto", r.code, r.header.Get("Content-Type"))
		}
		if len(r.body) < 5 || r.body[0] != 0x02 || int(binary.BigEndian.Uint32(r.body[1:5])) != len(r.body)-5 {
			t.Fatalf("stream body %q is not one end-of-stream envelope", r.body)
		}
		var end struct {
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(r.body[5:], &end); err != nil {
			t.Fatal(err)
		}
		checkConnectError(t, end.Error)
	})
}

// checkConnectError checks a Connect error JSON for a quota rejection
// whose details decode.
func checkConnectError(t *testing.T, body []byte) {
	t.Helper()
	var ce struct {
		Code, Message string
		Details       []struct{ Type, Value string }
	}
	if err := json.Unmarshal(body, &ce); err != nil {
		t.Fatalf("Connect error %s: %v", body, err)
	}
	if ce.Code != "resource_exhausted" || ce.Message != "rate limit exceeded" {
		t.Errorf("Connect error code %q, message %q", ce.Code, ce.Message)
	}
	var types []string
	for _, d := range ce.Details {
		types = append(types, d.Type)
		b, err := base64.RawStdEncoding.DecodeString(d.Value)
		if err != nil {
			t.Fatalf("detail %s: %v", d.Type, err)
		}
		if d.Type == "google.rpc.RetryInfo" {
			var ri errdetails.RetryInfo
			if err := proto.Unmarshal(b, &ri); err != nil || ri.GetRetryDelay().AsDuration() != time.Second {
				t.Errorf("RetryInfo %v, %v; want 1s", &ri, err)
			}
		}
	}
	if diff := cmp.Diff([]string{"google.rpc.ErrorInfo", "google.rpc.RetryInfo", "google.rpc.QuotaFailure"}, types); diff != "" {
		t.Errorf("detail types (-want +got):\n%s", diff)
	}
}

// gRPC-Web over HTTP/1.1 gets the status in the headers of a 200.
func TestGRPCWebRejection(t *testing.T) {
	var s seen
	ts := serve(t, newLimiter(t), http.HandlerFunc(s.handler))
	h := http.Header{"X-Api-Key": {acmeKey}, "Content-Type": {"application/grpc-web+proto"}}
	if r := do(t, ts, "POST", getStock, h); r.code != http.StatusOK || s.count() != 1 {
		t.Fatalf("first call: %d", r.code)
	}
	r := do(t, ts, "POST", getStock, h)
	if r.code != http.StatusOK || len(r.body) != 0 || s.count() != 1 {
		t.Fatalf("rejected call: %d, body %q, handler ran %d times; want an empty 200, once", r.code, r.body, s.count())
	}
	want := http.Header{
		"Content-Type": {"application/grpc-web+proto"},
		"Grpc-Status":  {"8"},
		"Grpc-Message": {"rate limit exceeded"},
	}
	if diff := cmp.Diff(want, pick(r.header, "Content-Type", "Grpc-Status", "Grpc-Message")); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	bin, err := base64.RawStdEncoding.DecodeString(r.header.Get("Grpc-Status-Details-Bin"))
	if err != nil {
		t.Fatal(err)
	}
	st := new(spb.Status)
	if err := proto.Unmarshal(bin, st); err != nil {
		t.Fatal(err)
	}
	if reason, retry, _ := details(t, st); st.GetCode() != 8 || reason != middleware.ReasonQuota.ErrorReason() || retry != time.Second {
		t.Errorf("grpc-status-details-bin: code %d, %q, %v", st.GetCode(), reason, retry)
	}
}

func TestNewValidates(t *testing.T) {
	l := newLimiter(t)
	for _, tc := range []struct {
		name string
		l    *middleware.Limiter
		opts []httplimit.Option
		want string
	}{
		{"nil limiter", nil, nil, "nil Limiter"},
		{"nil method", l, []httplimit.Option{httplimit.WithMethod(nil)}, "WithMethod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := httplimit.New(tc.l, tc.opts...)
			if m != nil || !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New() = %v, %v; want an invalid-option error naming %s", m, err, tc.want)
			}
		})
	}
	if _, err := httplimit.New(l, nil, httplimit.WithMethod(func(*http.Request) string { return "" })); err != nil {
		t.Errorf("New with a nil option and a method func: %v", err)
	}
}

// A client that gives up while its request waits for a slot is not
// answered as a rejection of the Limiter.
func TestEndedContextIsNotARejection(t *testing.T) {
	ctrl, err := overload.New(overload.WithQueueTarget(time.Minute), overload.WithLimits(1, 1),
		overload.WithClock(&clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}))
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, middleware.WithOverload(ctrl))
	held, err := l.Admit(t.Context(), middleware.Call{Method: "/", Header: http.Header{"X-Api-Key": {acmeKey}}})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Done()
	m, err := httplimit.New(l)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req := httptest.NewRequestWithContext(ctx, "GET", "/", nil)
	req.Header.Set("X-Api-Key", acmeKey)
	rec := httptest.NewRecorder()
	m.Handle(http.NotFoundHandler()).ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "" {
		t.Errorf("ended context: %d, Retry-After %q; want 503 without a wait", rec.Code, rec.Header().Get("Retry-After"))
	}
	if st := statusOf(t, rec.Body.Bytes()); st.GetCode() != 1 {
		t.Errorf("status code %d, want 1 (CANCELLED)", st.GetCode())
	}
}

// Under overload, HTTP gets the law gRPC gets: every request is counted as
// it enters (none reaches the controller untapped), the ones beyond what
// the server runs and queues are shed before the handler, and every place
// comes back.
func TestOverloadShedsAsRequestsEnter(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	})
	l, err := middleware.NewOverload(middleware.WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	ts := serve(t, l, h)
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	key := http.Header{"X-Api-Key": {acmeKey}}
	const n = 12
	codes := make(chan int, n)
	go func() { codes <- do(t, ts, "GET", "/", key).code }()
	<-entered // one request holds the only slot
	for range n - 1 {
		go func() { codes <- do(t, ts, "GET", "/", key).code }()
	}
	// One slot and, before any request has completed, four places a
	// slot: five requests inside, the rest shed as they enter.
	for deadline := time.Now().Add(10 * time.Second); ctrl.Snapshot().ShedBy(overload.ShedTap) < n-5; {
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %+v: want %d shed as they entered", ctrl.Snapshot(), n-5)
		}
		time.Sleep(time.Millisecond)
	}
	unblock()
	var ok, shed int
	for range n {
		switch c := <-codes; c {
		case http.StatusOK:
			ok++
		case http.StatusServiceUnavailable:
			shed++
		default:
			t.Errorf("status %d, want 200 or 503", c)
		}
	}
	s := ctrl.Snapshot()
	if s.Untapped != 0 || s.Inside != 0 || s.Inflight != 0 {
		t.Errorf("untapped %d, inside %d, in flight %d; want 0, 0, 0", s.Untapped, s.Inside, s.Inflight)
	}
	if ok < 1 || shed < n-5 {
		t.Errorf("%d served and %d shed, want at least 1 and %d", ok, shed, n-5)
	}
}

// With WithCORS, a browser on an allowed origin can read a gRPC-Web
// rejection's status; another origin gets no CORS fields; a preflight
// reaches the wrapped handler unlimited.
func TestGRPCWebCORS(t *testing.T) {
	var s seen
	ts := serve(t, newLimiter(t), http.HandlerFunc(s.handler), httplimit.WithCORS("https://app.example.com"))
	h := http.Header{"X-Api-Key": {acmeKey}, "Content-Type": {"application/grpc-web+proto"}, "Origin": {"https://app.example.com"}}
	r := do(t, ts, "POST", getStock, h)
	// Admitted: the wrapped handler's CORS layer does not know the
	// RateLimit fields, so the Middleware exposes them.
	if got := strings.Join(r.header.Values("Access-Control-Expose-Headers"), ","); !strings.Contains(got, "RateLimit") {
		t.Errorf("admitted call: Access-Control-Expose-Headers %q lacks RateLimit", got)
	}
	for range 3 { // acme's burst is 3
		r = do(t, ts, "POST", getStock, h)
	}
	if r.header.Get("Grpc-Status") != "8" {
		t.Fatalf("fourth call: grpc-status %q, want 8", r.header.Get("Grpc-Status"))
	}
	if got := r.header.Get("Access-Control-Allow-Origin"); got != "https://app.example.com" {
		t.Errorf("Access-Control-Allow-Origin %q, want the request's origin", got)
	}
	exposed := strings.Join(r.header.Values("Access-Control-Expose-Headers"), ",")
	for _, f := range []string{"Grpc-Status", "Grpc-Message", "Grpc-Status-Details-Bin", "Retry-After", "RateLimit"} {
		if !strings.Contains(exposed, f) {
			t.Errorf("Access-Control-Expose-Headers %q lacks %s", exposed, f)
		}
	}
	if !slices.Contains(r.header.Values("Vary"), "Origin") {
		t.Errorf("Vary %q, want Origin", r.header.Values("Vary"))
	}
	// Another origin: no CORS fields.
	h.Set("Origin", "https://evil.example")
	if r := do(t, ts, "POST", getStock, h); r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("another origin got Access-Control-Allow-Origin %q", r.header.Get("Access-Control-Allow-Origin"))
	}
	// A preflight passes, over the quota, to the handler.
	ran := s.count()
	pre := http.Header{"Origin": {"https://app.example.com"}, "Access-Control-Request-Method": {"POST"}}
	for range 5 {
		if r := do(t, ts, "OPTIONS", getStock, pre); r.code != http.StatusOK {
			t.Fatalf("preflight: %d", r.code)
		}
	}
	if s.count() != ran+5 {
		t.Errorf("the handler saw %d preflights, want 5", s.count()-ran)
	}
	for _, bad := range []string{"", "app.example.com", "https://app.example.com/path", "https://u@app.example.com"} {
		if _, err := httplimit.New(newLimiter(t), httplimit.WithCORS(bad)); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("WithCORS(%q): %v, want ErrInvalidOption", bad, err)
		}
	}
}
