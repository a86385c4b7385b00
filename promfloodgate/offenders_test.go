package promfloodgate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
)

func TestNewOffendersValidates(t *testing.T) {
	for _, tc := range []struct {
		name, option string
		opt          OffendersOption
	}{
		{"zero capacity", "WithCapacity", WithCapacity(0)},
		{"huge capacity", "WithCapacity", WithCapacity(10001)},
		{"short secret", "WithHashSecret", WithHashSecret([]byte("short"))},
	} {
		if _, err := NewOffenders(tc.opt); !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), tc.option) {
			t.Errorf("%s: NewOffenders() error = %v, want floodgate.ErrInvalidOption naming %s", tc.name, err, tc.option)
		}
	}
}

func TestOffendersHashesAddresses(t *testing.T) {
	f, err := NewOffenders(WithCapacity(2))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a:203.0.113.7", "a:198.51.100.1", "a:203.0.113.7", "", "a:203.0.113.7"} {
		f.RecordSubject(s)
	}
	want := []Offender{{Key: "a:" + f.HashKey("203.0.113.7"), Rejections: 3}, {Key: "a:" + f.HashKey("198.51.100.1"), Rejections: 1}}
	if diff := cmp.Diff(want, f.Top(0)); diff != "" {
		t.Errorf("Top (-want +got):\n%s", diff)
	}
	if got := f.HashKey("203.0.113.7"); len(got) != HashedKeyLen || strings.Contains(got, "203") {
		t.Errorf("HashKey = %q", got)
	}
	if f.Total() != 4 {
		t.Errorf("Total() = %d, want 4", f.Total())
	}

	raw, _ := NewOffenders(WithRawKeys(true))
	raw.RecordSubject("a:10.0.0.1")
	if got := raw.Top(1); len(got) != 1 || got[0].Key != "a:10.0.0.1" {
		t.Errorf("raw Top = %v", got)
	}
}

// TestCollectorRecordsOffenders runs a real Limiter whose observer is a
// collector's with WithOffenders: each rejection is recorded once, by the
// subject the Limiter charged, streams' included, and nothing else is.
func TestCollectorRecordsOffenders(t *testing.T) {
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewOffenders(WithRawKeys(true))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(WithOffenders(f))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	unary := func(key string, h grpc.UnaryHandler) {
		_, _ = lim.UnaryServerInterceptor()(callCtx(key), nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, h)
	}
	for range 5 {
		unary(freeKey, noop) // burst 2: three rejections
	}
	unary("", noop) // anonymous, admitted
	// The handler's own RESOURCE_EXHAUSTED is not the limiter's.
	unary(proKey, func(context.Context, any) (any, error) {
		return nil, status.Error(codes.ResourceExhausted, "out of stock")
	})
	info := &grpc.StreamServerInfo{FullMethod: methodGet, IsServerStream: true}
	for range 2 {
		_ = lim.StreamServerInterceptor()(nil, ctxStream{ctx: callCtx(freeKey)}, info, func(any, grpc.ServerStream) error { return nil })
	}
	// The events of the tap handle and of dry-run rejections, fed alike.
	obs := c.Observer()
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonGate, Subject: "a:198.51.100.1"}, Tap: true})
	obs(middleware.Event{Decision: middleware.Decision{Reason: middleware.ReasonQuota, DryRun: true, Subject: "t:p"}})
	want := []Offender{{Key: "t:f", Rejections: 5}, {Key: "a:198.51.100.1", Rejections: 1}}
	if diff := cmp.Diff(want, f.Top(0)); diff != "" {
		t.Errorf("Top (-want +got):\n%s", diff)
	}
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

func TestHandler(t *testing.T) {
	f, _ := NewOffenders(WithCapacity(3))
	for range 3 {
		f.RecordSubject("a:a")
	}
	f.RecordSubject("a:b")
	h := f.Handler()

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/floodgate/offenders?n=1", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var body struct {
		Total     uint64
		Capacity  int
		Hashed    bool
		Offenders []Offender
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	want := []Offender{{Key: "a:" + f.HashKey("a"), Rejections: 3}}
	if body.Total != 4 || body.Capacity != 3 || !body.Hashed || !cmp.Equal(want, body.Offenders) {
		t.Errorf("body = %+v, want total 4, capacity 3, hashed, offenders %v", body, want)
	}

	for _, tc := range []struct {
		method, target string
		code           int
	}{
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/?n=-1", http.StatusBadRequest},
		{http.MethodGet, "/?n=2x", http.StatusBadRequest},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, nil))
		if rec.Code != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.target, rec.Code, tc.code)
		}
	}
}

// TestOffendersHashSecret: hashed keys are keyed by a secret, random per
// Offenders unless given: a plain hash of an address would be undone by
// hashing every address.
func TestOffendersHashSecret(t *testing.T) {
	a, _ := NewOffenders()
	b, _ := NewOffenders()
	plain := sha256.Sum256([]byte("203.0.113.7"))
	if got := a.HashKey("203.0.113.7"); got == hex.EncodeToString(plain[:HashedKeyLen/2]) {
		t.Errorf("HashKey = %s, the plain SHA-256 prefix", got)
	}
	if a.HashKey("203.0.113.7") == b.HashKey("203.0.113.7") {
		t.Error("two Offenders without a shared secret hash alike")
	}
	secret := []byte("0123456789abcdef0123")
	c, err := NewOffenders(WithHashSecret(secret))
	if err != nil {
		t.Fatal(err)
	}
	d, _ := NewOffenders(WithHashSecret(secret))
	if c.HashKey("203.0.113.7") != d.HashKey("203.0.113.7") {
		t.Error("two Offenders with one secret hash differently")
	}
}

// TestRawKeysNotUTF8: raw subjects that are not valid UTF-8 stay distinct
// in the summary's JSON.
func TestRawKeysNotUTF8(t *testing.T) {
	f, _ := NewOffenders(WithRawKeys(true))
	f.RecordSubject("a:a\xffb")
	f.RecordSubject("a:a\xfeb")
	rec := httptest.NewRecorder()
	f.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	var body struct{ Offenders []Offender }
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if len(body.Offenders) != 2 || body.Offenders[0].Key == body.Offenders[1].Key {
		t.Errorf("offenders %+v, want two distinct keys", body.Offenders)
	}
}

// TestRecordAllocs: recording a rejection of a subject already listed
// allocates nothing, its address hashed or not.
func TestRecordAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	f, _ := NewOffenders()
	for _, subject := range []string{"a:203.0.113.7", "t:acme"} {
		f.RecordSubject(subject)
		if n := testing.AllocsPerRun(200, func() { f.RecordSubject(subject) }); n != 0 {
			t.Errorf("RecordSubject(%q) allocates %v times, want 0", subject, n)
		}
	}
}

func TestRecordSubject(t *testing.T) {
	f, err := NewOffenders()
	if err != nil {
		t.Fatal(err)
	}
	buf := []byte("a:203.0.113.7")
	for range 3 {
		f.RecordSubject(string(buf))
	}
	f.RecordSubject("t:acme")
	f.RecordSubject("")
	want := []Offender{{Key: "a:" + f.HashKey("203.0.113.7"), Rejections: 3}, {Key: "t:acme", Rejections: 1}}
	if diff := cmp.Diff(want, f.Top(0)); diff != "" {
		t.Errorf("Top (-want +got):\n%s", diff)
	}
	raw, _ := NewOffenders(WithRawKeys(true))
	raw.RecordSubject("a:203.0.113.7")
	if diff := cmp.Diff([]Offender{{Key: "a:203.0.113.7", Rejections: 1}}, raw.Top(0)); diff != "" {
		t.Errorf("raw Top (-want +got):\n%s", diff)
	}
}

func TestRecordCost(t *testing.T) {
	f, err := NewOffenders(WithCapacity(2))
	if err != nil {
		t.Fatal(err)
	}
	f.RecordCost("t:acme", "tokens", 3000)
	f.RecordCost("a:203.0.113.7", "tokens", 500)
	f.RecordCost("t:acme", "tokens", 1000)
	f.RecordCost("t:bigco", "bytes", 1<<20)
	// Ignored: no cost, no subject, no unit.
	f.RecordCost("t:acme", "tokens", 0)
	f.RecordCost("t:acme", "tokens", -5)
	f.RecordCost("", "tokens", 10)
	f.RecordCost("t:acme", "", 10)
	want := []CostOffender{{Key: "t:acme", Cost: 4000}, {Key: "a:" + f.HashKey("203.0.113.7"), Cost: 500}}
	if diff := cmp.Diff(want, f.TopCost("tokens", 0)); diff != "" {
		t.Errorf("TopCost(tokens) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[:1], f.TopCost("tokens", 1)); diff != "" {
		t.Errorf("TopCost(tokens, 1) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]CostOffender{{Key: "t:bigco", Cost: 1 << 20}}, f.TopCost("bytes", 0)); diff != "" {
		t.Errorf("TopCost(bytes) (-want +got):\n%s", diff)
	}
	if got := f.TopCost("rows", 0); got == nil || len(got) != 0 {
		t.Errorf("TopCost(rows) = %#v, want an empty list", got)
	}
	if got, want := f.CostTotal("tokens"), uint64(4500); got != want {
		t.Errorf("CostTotal(tokens) = %d, want %d", got, want)
	}
	if diff := cmp.Diff([]string{"bytes", "tokens"}, f.CostUnits()); diff != "" {
		t.Errorf("CostUnits (-want +got):\n%s", diff)
	}
	// The rejections are counted apart.
	if got := f.Total(); got != 0 {
		t.Errorf("Total() = %d, want 0 rejections", got)
	}
	// A third subject in a ranking of two replaces the least, Space-Saving.
	f.RecordCost("t:zeta", "tokens", 100)
	if diff := cmp.Diff([]CostOffender{{Key: "t:acme", Cost: 4000}, {Key: "t:zeta", Cost: 600, Err: 500}}, f.TopCost("tokens", 0)); diff != "" {
		t.Errorf("TopCost after a third subject (-want +got):\n%s", diff)
	}
}

func TestRecordCostUnitsCapped(t *testing.T) {
	f, _ := NewOffenders(WithRawKeys(true))
	for i := range MaxCostUnits + 3 {
		f.RecordCost("a:203.0.113.7", "unit"+strconv.Itoa(i), 1)
	}
	if got := len(f.CostUnits()); got != MaxCostUnits {
		t.Errorf("%d units ranked, want %d", got, MaxCostUnits)
	}
	if got := f.TopCost("unit"+strconv.Itoa(MaxCostUnits), 0); len(got) != 0 {
		t.Errorf("TopCost of a unit past the cap = %v, want none", got)
	}
	if diff := cmp.Diff([]CostOffender{{Key: "a:203.0.113.7", Cost: 1}}, f.TopCost("unit0", 0)); diff != "" {
		t.Errorf("raw TopCost (-want +got):\n%s", diff)
	}
}

// TestHandlerCosts: the cost rankings are in the handler's JSON, by unit,
// once a cost is recorded, and n limits each list.
func TestHandlerCosts(t *testing.T) {
	f, _ := NewOffenders()
	get := func(target string) map[string]json.RawMessage {
		t.Helper()
		rec := httptest.NewRecorder()
		f.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
		var body map[string]json.RawMessage
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		return body
	}
	if _, ok := get("/")["costs"]; ok {
		t.Error(`"costs" in the JSON before any cost was recorded`)
	}
	f.RecordCost("t:acme", "tokens", 3000)
	f.RecordCost("t:bigco", "tokens", 1000)
	var costs map[string]struct {
		Total     uint64
		Offenders []CostOffender
	}
	if err := json.Unmarshal(get("/?n=1")["costs"], &costs); err != nil {
		t.Fatal(err)
	}
	tokens := costs["tokens"]
	if diff := cmp.Diff([]CostOffender{{Key: "t:acme", Cost: 3000}}, tokens.Offenders); diff != "" || tokens.Total != 4000 {
		t.Errorf("costs.tokens = total %d, offenders (-want +got):\n%s", tokens.Total, diff)
	}
}
