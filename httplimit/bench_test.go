package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/floodgate-go/floodgate/httplimit"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// discard is a ResponseWriter that keeps its header map between requests,
// so that the benchmark measures the middleware, not the recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// handling is a Middleware for acme alone, with limit and the RateLimit
// fields on or off, around a handler that does nothing; served is set by
// the handler, so a caller can tell an admitted request from a rejected
// one.
type handling struct {
	h      http.Handler
	req    *http.Request
	w      *discard
	served bool
}

func newHandling(tb testing.TB, limit tenant.LimitSpec, headers bool) *handling {
	tb.Helper()
	digest, err := tenant.HashKey(acmeKey)
	if err != nil {
		tb.Fatal(err)
	}
	tbl, err := tenant.Compile(&tenant.Config{Tenants: map[string]tenant.TenantSpec{"acme": {Default: &limit, Keys: []string{digest}}}})
	if err != nil {
		tb.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		tb.Fatal(err)
	}
	l, err := middleware.New(store, middleware.Static(tbl))
	if err != nil {
		tb.Fatal(err)
	}
	m, err := httplimit.New(l, httplimit.WithRateLimitHeaders(headers))
	if err != nil {
		tb.Fatal(err)
	}
	hd := &handling{req: httptest.NewRequest("POST", getStock, nil), w: &discard{h: http.Header{}}}
	hd.req.Header.Set("X-Api-Key", acmeKey)
	hd.h = m.Handle(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hd.served = true }))
	return hd
}

// serve handles the request once and reports whether the handler ran.
func (hd *handling) serve() bool {
	hd.served = false
	hd.h.ServeHTTP(hd.w, hd.req)
	return hd.served
}

// BenchmarkHandle is the middleware's own work per request, the handler
// doing nothing: an admitted tenant (with and without the RateLimit
// fields) and a rejected one, whose body is built once.
func BenchmarkHandle(b *testing.B) {
	for _, bc := range []struct {
		name    string
		limit   tenant.LimitSpec
		headers bool
		served  bool
	}{
		{"admitted", tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, false, true},
		{"admitted+ratelimit", tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, true, true},
		{"rejected", tenant.LimitSpec{Rate: 1e-9, Burst: 1}, true, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			hd := newHandling(b, bc.limit, bc.headers)
			hd.serve()
			if hd.serve() != bc.served {
				b.Fatalf("fixture: the handler ran %v, want %v", !bc.served, bc.served)
			}
			b.ReportAllocs()
			for b.Loop() {
				hd.serve()
			}
		})
	}
}

// The RateLimit fields of an admitted request cost two allocations: one
// string for both fields and one slice for their values.
func TestRateLimitFieldsAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector say nothing of a normal build")
	}
	allocs := map[bool]float64{}
	for _, headers := range []bool{false, true} {
		hd := newHandling(t, tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, headers)
		if !hd.serve() {
			t.Fatal("fixture: an admitted request did not reach the handler")
		}
		allocs[headers] = testing.AllocsPerRun(200, func() { hd.serve() })
	}
	if d := allocs[true] - allocs[false]; d > 2 {
		t.Errorf("the RateLimit fields cost %v allocations (%v with, %v without), want at most 2", d, allocs[true], allocs[false])
	}
}
