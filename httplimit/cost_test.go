package httplimit_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/httplimit"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

const (
	generate = "/llm.v1.Completions/Generate"
	download = "/files.v1.Files/Download"
)

// metered is a Limiter on which acme's Completions are metered in tokens
// (100,000 a minute, bursts of 20,000, estimate 4,000 or x-max-tokens)
// and its Files in bytes (10,000 a second, bursts of 10,000, reserved 1,000
// at a time), on a clock that never moves, with the Map to read the
// buckets from.
func metered(t *testing.T, opts ...middleware.Option) (*middleware.Limiter, *keyed.Map, *tenant.Table) {
	t.Helper()
	return meteredOn(t, nil, opts...)
}

// meteredOn is metered on the store wrap returns around the Map, or on the
// Map for wrap nil.
func meteredOn(t *testing.T, wrap func(*keyed.Map) floodgate.Store, opts ...middleware.Option) (*middleware.Limiter, *keyed.Map, *tenant.Table) {
	t.Helper()
	h, err := tenant.HashKey(acmeKey)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{"acme": {
			Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000},
			Keys:    []string{h},
			Methods: map[string]tenant.MethodSpec{
				"/llm.v1.Completions/*": {Metered: &tenant.MeteredSpec{Unit: "tokens", Rate: 100000, Per: time.Minute,
					Burst: 20000, Estimate: 4000, EstimateHeader: "x-max-tokens"}},
				"/files.v1.Files/*": {Metered: &tenant.MeteredSpec{Unit: "bytes", Rate: 10000, Burst: 10000, Estimate: 1000}},
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	store, err := keyed.New(keyed.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	var st floodgate.Store = store
	if wrap != nil {
		st = wrap(store)
	}
	l, err := middleware.New(st, middleware.Static(tbl), append([]middleware.Option{middleware.WithClock(c)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l, store, tbl
}

// bucket returns what acme's metered bucket of method holds.
func bucket(store *keyed.Map, tbl *tenant.Table, method string) float64 {
	acme, _ := tbl.TenantByID("acme")
	m := acme.Rule(method).Meter
	return store.Tokens("t:acme:"+m.ID, m.Limit)
}

// TestMeteredRequest: a request reserves its estimate (the header's, or
// the function's from the request) and settles at what its handler
// reported through the request's context when the handler returns.
func TestMeteredRequest(t *testing.T) {
	l, store, tbl := metered(t, middleware.WithCostEstimate(func(_ context.Context, _ string, req any) (int64, bool) {
		r, ok := req.(*http.Request)
		if !ok || r.URL.Query().Get("estimate") == "" {
			return 0, false
		}
		n, err := strconv.ParseInt(r.URL.Query().Get("estimate"), 10, 64)
		return n, err == nil
	}))
	var reserved int64
	ts := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := middleware.FromContext(r.Context())
		reserved = d.Reserved
		// Written before the cost is reported: a Write after a report past
		// the reservation must reserve the difference first.
		if _, err := io.WriteString(w, "ok"); err != nil {
			t.Errorf("Write: %v", err)
		}
		n, _ := strconv.ParseInt(r.URL.Query().Get("cost"), 10, 64)
		if !middleware.ReportCost(r.Context(), n) {
			t.Error("ReportCost in a metered request = false")
		}
	}))
	hdr := http.Header{"X-Api-Key": {acmeKey}, "X-Max-Tokens": {"3000"}}
	if r := do(t, ts, http.MethodPost, generate+"?cost=1000", hdr); r.code != http.StatusOK || reserved != 3000 {
		t.Fatalf("status %d, reserved %d; want 200 and the header's 3000", r.code, reserved)
	}
	if got, want := bucket(store, tbl, generate), 19000.0; got != want {
		t.Errorf("bucket holds %v after the settle, want %v", got, want)
	}
	if r := do(t, ts, http.MethodPost, generate+"?cost=500&estimate=700", hdr); r.code != http.StatusOK || reserved != 700 {
		t.Fatalf("status %d, reserved %d; want 200 and the function's 700", r.code, reserved)
	}
	// Into debt: refused with 429, the Connect or gRPC status as usual, and
	// Retry-After the time until the debt is repaid.
	if r := do(t, ts, http.MethodPost, generate+"?cost=40000", hdr); r.code != http.StatusOK {
		t.Fatalf("status %d, want 200", r.code)
	}
	r := do(t, ts, http.MethodPost, generate, hdr)
	if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") != "14" {
		t.Errorf("in debt: status %d, Retry-After %q; want 429 and 14 (the debt limit of 20,000 owed and 3,000 to reserve: 13.8 s)", r.code, r.header.Get("Retry-After"))
	}
	// An estimate header that is no whole number: 400, nothing taken.
	before := bucket(store, tbl, generate)
	hdr.Set("X-Max-Tokens", "NaN")
	if r := do(t, ts, http.MethodPost, generate, hdr); r.code != http.StatusBadRequest || r.header.Get("Ratelimit") != "" {
		t.Errorf("invalid estimate: status %d, RateLimit %q; want 400 without the fields", r.code, r.header.Get("Ratelimit"))
	}
	if got := bucket(store, tbl, generate); got != before {
		t.Errorf("an invalid estimate took tokens: %v → %v", before, got)
	}
}

// TestMeteredWrites: a streamed response reserves its quota in chunks as
// it is written, and a Write its reservations cannot cover fails with the
// rejection, writing nothing.
func TestMeteredWrites(t *testing.T) {
	bytesOf := func(_ context.Context, _ string, resp any) (int64, bool) {
		p, ok := resp.([]byte)
		return int64(len(p)), ok
	}
	l, store, tbl := metered(t, middleware.WithActualCost(bytesOf))
	m, err := httplimit.New(l)
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	h := m.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			t.Error("the metered ResponseWriter is no http.Flusher")
		}
		chunk := make([]byte, 600)
		for {
			if _, werr = w.Write(chunk); werr != nil {
				return
			}
		}
	}))
	req := httptest.NewRequest(http.MethodGet, download, nil)
	req.Header.Set("X-Api-Key", acmeKey)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if st, _ := status.FromError(werr); st.Code() != codes.ResourceExhausted {
		t.Fatalf("the last Write failed with %v, want RESOURCE_EXHAUSTED", werr)
	}
	// 10,000 bytes reserved, 1,000 at a time: 16 writes of 600.
	if got, want := rec.Body.Len(), 9600; got != want {
		t.Errorf("%d bytes written, want %d", got, want)
	}
	if got, want := bucket(store, tbl, download), 400.0; got != want {
		t.Errorf("bucket holds %v after the response, want %v: what was not written given back", got, want)
	}
}

// TestMeteredFirstWriteRefused: a Write refused before anything of the
// response went out answers the request with the rejection, 429 with
// Retry-After, not an empty 200; the handler's later WriteHeader and
// Write change nothing and return the same error.
func TestMeteredFirstWriteRefused(t *testing.T) {
	bytesOf := func(_ context.Context, _ string, resp any) (int64, bool) {
		p, ok := resp.([]byte)
		return int64(len(p)), ok
	}
	l, _, _ := metered(t, middleware.WithActualCost(bytesOf))
	var first, later error
	ts := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		if _, first = w.Write(make([]byte, n)); first != nil {
			w.WriteHeader(http.StatusInternalServerError)
			_, later = io.WriteString(w, "oops")
		}
	}))
	hdr := http.Header{"X-Api-Key": {acmeKey}}
	// 8,000 of the 10,000 bytes written: 2,000 left, 1,000 of which the
	// next request reserves as it is admitted.
	if r := do(t, ts, http.MethodGet, download+"?n=8000", hdr); r.code != http.StatusOK || len(r.body) != 8000 {
		t.Fatalf("status %d, %d bytes; want 200 and 8000", r.code, len(r.body))
	}
	r := do(t, ts, http.MethodGet, download+"?n=3000", hdr)
	if st, _ := status.FromError(first); st.Code() != codes.ResourceExhausted {
		t.Fatalf("the first Write failed with %v, want RESOURCE_EXHAUSTED", first)
	}
	if later != first {
		t.Errorf("a Write after the refused one returned %v, want %v", later, first)
	}
	// 2,000 more bytes at 10,000 a second: back in 0.2 s, 1 s rounded up.
	if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
		t.Errorf("status %d, Retry-After %q; want 429 and 1", r.code, r.header.Get("Retry-After"))
	}
	if got, want := r.header.Get("Content-Type"), "application/json"; got != want {
		t.Errorf("Content-Type %q, want %q", got, want)
	}
	if !strings.Contains(string(r.body), `"code":8`) {
		t.Errorf("body %s, want the RESOURCE_EXHAUSTED status", r.body)
	}
}

// failing is a Map whose reservations fail once fail is set.
type failing struct {
	*keyed.Map
	fail atomic.Bool
}

func (s *failing) ReserveN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Reservation, error) {
	if s.fail.Load() {
		return floodgate.Reservation{}, errors.New("store down")
	}
	return s.Map.ReserveN(ctx, key, lim, n)
}

// TestMeteredFirstWriteRefusedByReason: a refused first Write is answered
// by its rejection's reason, whatever its status says: 429 for the
// caller's quota or debt, 503 for the server's state, with the rejection's
// retry delay, if any, as Retry-After.
func TestMeteredFirstWriteRefusedByReason(t *testing.T) {
	bytesOf := func(_ context.Context, _ string, resp any) (int64, bool) {
		p, ok := resp.([]byte)
		return int64(len(p)), ok
	}
	for _, tc := range []struct {
		name string
		opts []middleware.Option
		// before runs in the handler of the request under test, before its
		// Write of n bytes: h serves another request of acme's.
		before         func(t *testing.T, h http.Handler)
		n              int
		reason         middleware.Reason
		code           int
		retry          string
		grpcCode       codes.Code
		storeFailsThen bool
	}{
		// Without details, and with the quota's status code changed: the
		// answer is the reason's all the same. 1,000 reserved, 6,000 more
		// taken by another request: 3,000 left of the 5,000 to reserve,
		// back in 0.2 s.
		{name: "quota without details", n: 6000,
			opts: []middleware.Option{middleware.WithDetails(false), middleware.WithCodes(codes.Unavailable, codes.Unavailable)},
			before: func(t *testing.T, h http.Handler) {
				if code := serveAcme(h, download+"?n=6000"); code != http.StatusOK {
					t.Fatalf("the other request: status %d, want 200", code)
				}
			},
			reason: middleware.ReasonQuota, code: http.StatusTooManyRequests, retry: "1", grpcCode: codes.Unavailable},
		// Another request settles 15,000 bytes: 6,000 owed.
		{name: "debt", n: 2000,
			before: func(t *testing.T, h http.Handler) {
				if code := serveAcme(h, download+"?report=15000"); code != http.StatusOK {
					t.Fatalf("the other request: status %d, want 200", code)
				}
			},
			reason: middleware.ReasonDebt, code: http.StatusTooManyRequests, retry: "1", grpcCode: codes.ResourceExhausted},
		// The gate halves the burst: 4,000 left of the 5,000 to reserve,
		// back in 0.2 s at half the rate.
		{name: "gate", n: 6000, opts: []middleware.Option{middleware.WithGate(gate{0.5})},
			reason: middleware.ReasonGate, code: http.StatusServiceUnavailable, retry: "1", grpcCode: codes.Unavailable},
		{name: "store failure", n: 2000, opts: []middleware.Option{middleware.WithFailClosed(true)}, storeFailsThen: true,
			reason: middleware.ReasonStoreError, code: http.StatusServiceUnavailable, grpcCode: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var store *failing
			l, _, _ := meteredOn(t, func(m *keyed.Map) floodgate.Store {
				store = &failing{Map: m}
				return store
			}, append([]middleware.Option{middleware.WithActualCost(bytesOf)}, tc.opts...)...)
			mw, err := httplimit.New(l)
			if err != nil {
				t.Fatal(err)
			}
			var h http.Handler
			var werr error
			h = mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				q := r.URL.Query()
				if n, _ := strconv.ParseInt(q.Get("report"), 10, 64); n > 0 {
					middleware.ReportCost(r.Context(), n)
					return
				}
				n, _ := strconv.Atoi(q.Get("n"))
				if q.Get("test") == "" {
					_, _ = w.Write(make([]byte, n))
					return
				}
				if tc.before != nil {
					tc.before(t, h)
				}
				store.fail.Store(tc.storeFailsThen)
				_, werr = w.Write(make([]byte, n))
			}))
			req := httptest.NewRequest(http.MethodGet, download+"?test=1&n="+strconv.Itoa(tc.n), nil)
			req.Header.Set("X-Api-Key", acmeKey)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rej, ok := errors.AsType[*middleware.Rejection](werr); !ok || rej.Reason != tc.reason {
				t.Fatalf("the Write failed with %v, want a rejection for %v", werr, tc.reason)
			}
			if got, want := rec.Code, tc.code; got != want {
				t.Errorf("status %d, want %d", got, want)
			}
			if got, want := rec.Header().Get("Retry-After"), tc.retry; got != want {
				t.Errorf("Retry-After %q, want %q", got, want)
			}
			if got, want := codes.Code(statusOf(t, rec.Body.Bytes()).GetCode()), tc.grpcCode; got != want {
				t.Errorf("body's status code %v, want %v", got, want)
			}
		})
	}
}

// serveAcme serves a GET of path from acme with h, and returns the status.
func serveAcme(h http.Handler, path string) int {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("X-Api-Key", acmeKey)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// TestMeteredLargeWrite: a Write longer than the burst, which no
// reservation could cover at once, writes the chunks its reservations
// cover and says how much.
func TestMeteredLargeWrite(t *testing.T) {
	bytesOf := func(_ context.Context, _ string, resp any) (int64, bool) {
		p, ok := resp.([]byte)
		return int64(len(p)), ok
	}
	l, store, tbl := metered(t, middleware.WithActualCost(bytesOf))
	var n int64
	var werr error
	ts := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// io.Copy's buffer, 32 KiB, against a burst of 10,000.
		n, werr = io.Copy(w, io.LimitReader(zeros{}, 32<<10))
	}))
	r := do(t, ts, http.MethodGet, download, http.Header{"X-Api-Key": {acmeKey}})
	if st, _ := status.FromError(werr); st.Code() != codes.ResourceExhausted {
		t.Fatalf("io.Copy failed with %v, want RESOURCE_EXHAUSTED", werr)
	}
	if n != 10000 || r.code != http.StatusOK || len(r.body) != 10000 {
		t.Errorf("io.Copy wrote %d bytes, the client got status %d and %d; want 10000, 200 and 10000", n, r.code, len(r.body))
	}
	if got := bucket(store, tbl, download); got != 0 {
		t.Errorf("bucket holds %v after the response, want 0", got)
	}
}

// zeros reads zeros, and is no io.WriterTo: io.Copy writes its buffer.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestMeteredResponseController: a metered request's ResponseWriter is an
// http.Flusher, and http.ResponseController reaches the server's through
// it; it is neither an http.Hijacker nor an io.ReaderFrom, so that every
// byte is covered. A Flush begins the response: a Write refused after it
// cuts the response short.
func TestMeteredResponseController(t *testing.T) {
	l, _, _ := metered(t)
	var errs []string
	ts := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Flusher); !ok {
			errs = append(errs, "no http.Flusher")
		}
		if _, ok := w.(http.Hijacker); ok {
			errs = append(errs, "an http.Hijacker")
		}
		if _, ok := w.(io.ReaderFrom); ok {
			errs = append(errs, "an io.ReaderFrom")
		}
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Hour)); err != nil {
			errs = append(errs, "SetWriteDeadline: "+err.Error())
		}
		if err := rc.Flush(); err != nil {
			errs = append(errs, "Flush: "+err.Error())
		}
		// Reported past what the request reserved and the bucket holds.
		middleware.ReportCost(r.Context(), 20000)
		if _, err := io.WriteString(w, "late"); err == nil {
			errs = append(errs, "a Write past the quota succeeded")
		}
	}))
	r := do(t, ts, http.MethodGet, download, http.Header{"X-Api-Key": {acmeKey}})
	if r.code != http.StatusOK || len(r.body) != 0 {
		t.Errorf("status %d, body %q; want 200 (flushed) and nothing", r.code, r.body)
	}
	if len(errs) > 0 {
		t.Errorf("the handler found: %s", strings.Join(errs, "; "))
	}
}
