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

// BenchmarkHandle is the middleware's own work per request, the handler
// doing nothing: an admitted tenant (with and without the RateLimit
// fields) and a rejected one, whose body is built once.
func BenchmarkHandle(b *testing.B) {
	h, err := tenant.HashKey(acmeKey)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name    string
		limit   tenant.LimitSpec
		headers bool
		want    int
	}{
		{"admitted", tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, false, http.StatusOK},
		{"admitted+ratelimit", tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, true, http.StatusOK},
		{"rejected", tenant.LimitSpec{Rate: 1e-9, Burst: 1}, true, http.StatusTooManyRequests},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tbl, err := tenant.Compile(&tenant.Config{Tenants: map[string]tenant.TenantSpec{"acme": {Default: &bc.limit, Keys: []string{h}}}})
			if err != nil {
				b.Fatal(err)
			}
			store, err := keyed.New()
			if err != nil {
				b.Fatal(err)
			}
			l, err := middleware.New(store, middleware.Static(tbl))
			if err != nil {
				b.Fatal(err)
			}
			m, err := httplimit.New(l, httplimit.WithRateLimitHeaders(bc.headers))
			if err != nil {
				b.Fatal(err)
			}
			code := 0
			hd := m.Handle(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { code = http.StatusOK }))
			req := httptest.NewRequest("POST", getStock, nil)
			req.Header.Set("X-Api-Key", acmeKey)
			w := &discard{h: http.Header{}}
			for range 2 {
				code = http.StatusTooManyRequests
				hd.ServeHTTP(w, req)
			}
			if code != bc.want {
				b.Fatalf("fixture answers %d, want %d", code, bc.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				hd.ServeHTTP(w, req)
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
	h, err := tenant.HashKey(acmeKey)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := tenant.Compile(&tenant.Config{Tenants: map[string]tenant.TenantSpec{"acme": {Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, Keys: []string{h}}}})
	if err != nil {
		t.Fatal(err)
	}
	allocs := map[bool]float64{}
	for _, headers := range []bool{false, true} {
		store, err := keyed.New()
		if err != nil {
			t.Fatal(err)
		}
		l, err := middleware.New(store, middleware.Static(tbl))
		if err != nil {
			t.Fatal(err)
		}
		m, err := httplimit.New(l, httplimit.WithRateLimitHeaders(headers))
		if err != nil {
			t.Fatal(err)
		}
		hd := m.Handle(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		req := httptest.NewRequest("POST", getStock, nil)
		req.Header.Set("X-Api-Key", acmeKey)
		w := &discard{h: http.Header{}}
		hd.ServeHTTP(w, req)
		allocs[headers] = testing.AllocsPerRun(200, func() { hd.ServeHTTP(w, req) })
	}
	if d := allocs[true] - allocs[false]; d > 2 {
		t.Errorf("the RateLimit fields cost %v allocations (%v with, %v without), want at most 2", d, allocs[true], allocs[false])
	}
}
