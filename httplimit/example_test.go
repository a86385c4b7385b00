package httplimit_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/floodgate-go/floodgate/httplimit"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// exampleLimiter returns a Limiter whose anonymous callers may make two
// requests, then one a minute.
func exampleLimiter() *middleware.Limiter {
	tbl, err := tenant.Parse("quotas.yaml", []byte(`
anonymous:
  default: {rate: 1, per: 1m, burst: 2}
`))
	if err != nil {
		log.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(tbl))
	if err != nil {
		log.Fatal(err)
	}
	return lim
}

// Limiting a plain net/http server: a client over its quota gets a 429,
// with Retry-After, the RateLimit fields and a google.rpc.Status body.
func ExampleNew() {
	hl, err := httplimit.New(exampleLimiter())
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") })
	srv := httptest.NewServer(hl.Handle(mux))
	defer srv.Close()

	for range 3 {
		resp, err := srv.Client().Get(srv.URL + "/hello")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Status)
		fmt.Println("  RateLimit-Policy:", resp.Header.Get("RateLimit-Policy"))
		fmt.Println("  RateLimit:", resp.Header.Get("RateLimit"))
		if resp.StatusCode == http.StatusTooManyRequests {
			var st struct {
				Code    int
				Message string
			}
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				log.Fatal(err)
			}
			fmt.Println("  Retry-After:", resp.Header.Get("Retry-After"))
			fmt.Printf("  body: code %d, %q\n", st.Code, st.Message)
		}
		resp.Body.Close()
	}
	// Output:
	// 200 OK
	//   RateLimit-Policy: "default";q=2;w=120
	//   RateLimit: "default";r=1;t=60
	// 200 OK
	//   RateLimit-Policy: "default";q=2;w=120
	//   RateLimit: "default";r=0;t=120
	// 429 Too Many Requests
	//   RateLimit-Policy: "default";q=2;w=120
	//   RateLimit: "default";r=0;t=120
	//   Retry-After: 60
	//   body: code 8, "rate limit exceeded"
}

// A handler behind the middleware reads the Limiter's decision from its
// request's context.
func ExampleMiddleware_Handle() {
	hl, err := httplimit.New(exampleLimiter())
	if err != nil {
		log.Fatal(err)
	}
	h := hl.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := middleware.FromContext(r.Context())
		fmt.Printf("tenant %q, rule %s, %d left\n", d.Tenant, d.Rule.Pattern, d.Result.Remaining)
	}))
	req := httptest.NewRequest("GET", "/inventory.v1.Inventory/GetStock", nil)
	h.ServeHTTP(httptest.NewRecorder(), req)
	// Output: tenant "", rule default, 1 left
}

// grpc-gateway serves gRPC methods on REST routes: naming each route's
// method lets the tenant file's per-method rules apply to both.
func ExampleWithMethod() {
	methods := map[string]string{
		"GET /v1/stock/{sku}":  "/inventory.v1.Inventory/GetStock",
		"POST /v1/allocations": "/inventory.v1.Inventory/Allocate",
	}
	hl, err := httplimit.New(exampleLimiter(), httplimit.WithMethod(func(r *http.Request) string {
		return methods[r.Pattern] // the ServeMux pattern that matched
	}))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	for pattern := range methods {
		mux.Handle(pattern, hl.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "the gateway's handler")
		})))
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/stock/sku-1", nil))
	fmt.Println(rec.Code)
	// Output: 200
}
