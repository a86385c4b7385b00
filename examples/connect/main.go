// Command connect serves the inventory service's GetStock over Connect
// (connectrpc.com/connect, without generated Connect code) behind
// floodgate's net/http middleware, httplimit, and floods it from loopback
// clients that ignore every rejection: a tenant with an API key, and an
// anonymous caller. At the end it prints, per caller, the calls admitted
// against what the quota allows, and the rejections with the Connect
// codes, Retry-After values and RateLimit fields they carried.
//
// The tenant table is the one a gRPC server would use: the Connect
// procedure "/inventory.v1.Inventory/GetStock" is the gRPC method's name,
// so its per-method rule applies to both.
//
// Usage:
//
//	go run ./examples/connect                  # 3 s of flooding
//	go run ./examples/connect -duration 10s -senders 16
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/floodgate-go/floodgate/httplimit"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/tenant"
)

const (
	getStock = inventoryv1.Inventory_GetStock_FullMethodName
	acmeKey  = "acme-connect-demo-0123456789"
)

// The quotas: acme may call GetStock 50 times a second after a burst of
// 20; anonymous callers, 5 a second after 5.
var (
	acmeQuota = tenant.LimitSpec{Rate: 50, Burst: 20}
	anonQuota = tenant.LimitSpec{Rate: 5, Burst: 5}
)

func main() {
	cfg := config{}
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long the clients flood the server")
	flag.IntVar(&cfg.senders, "senders", 4, "concurrent senders per caller")
	flag.Parse()
	sum, err := run(context.Background(), cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	if !sum.ok() {
		os.Exit(1)
	}
}

type config struct {
	duration time.Duration
	senders  int
}

// tally is what one caller's senders saw.
type tally struct {
	name     string
	quota    tenant.LimitSpec
	admitted int
	// rejected counts rejections by Connect code, retryAfter by the
	// Retry-After value they carried.
	rejected, retryAfter map[string]int
	// Other calls that failed: the server or the network, not the limiter.
	failed    int
	rateLimit string // the RateLimit field of the last answer
	detail    string // a rejection's ErrorInfo and RetryInfo
}

type summary struct {
	elapsed time.Duration
	callers []*tally
}

// allowed returns the most calls a quota admits in d: the burst, and the
// rate for the rest.
func allowed(q tenant.LimitSpec, d time.Duration) int {
	return q.Burst + int(q.Rate*d.Seconds())
}

// ok reports whether every caller was admitted about as often as its quota
// allows, no more, and was rejected with RESOURCE_EXHAUSTED only.
func (s summary) ok() bool {
	for _, t := range s.callers {
		most := allowed(t.quota, s.elapsed) + 1
		if t.admitted > most || t.admitted < t.quota.Burst || t.failed > 0 || len(t.rejected) != 1 || t.rejected["resource_exhausted"] == 0 {
			return false
		}
	}
	return true
}

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	if cfg.duration <= 0 || cfg.senders < 1 {
		return summary{}, errors.New("want a positive -duration and -senders")
	}
	url, stop, err := serve()
	if err != nil {
		return summary{}, err
	}
	defer stop()

	transport := &http.Transport{MaxIdleConnsPerHost: 2 * cfg.senders}
	defer transport.CloseIdleConnections()
	client := connect.NewClient[inventoryv1.GetStockRequest, inventoryv1.GetStockResponse](
		&http.Client{Transport: transport}, url+getStock)
	callers := []*tally{
		{name: "acme (API key)", quota: acmeQuota},
		{name: "anonymous", quota: anonQuota},
	}
	keys := []string{acmeKey, ""}

	fmt.Fprintf(out, "flooding %s%s for %v with %d senders per caller\n", url, getStock, cfg.duration, cfg.senders)
	ctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for i, t := range callers {
		var mu sync.Mutex
		t.rejected, t.retryAfter = map[string]int{}, map[string]int{}
		for range cfg.senders {
			wg.Go(func() {
				for ctx.Err() == nil {
					flood(ctx, client, keys[i], t, &mu)
				}
			})
		}
	}
	wg.Wait()
	sum := summary{elapsed: time.Since(start), callers: callers}
	report(out, sum)
	return sum, nil
}

// serve starts the Connect service behind httplimit on a loopback port
// and returns its URL and a function that stops it.
func serve() (string, func(), error) {
	h, err := tenant.HashKey(acmeKey)
	if err != nil {
		return "", nil, err
	}
	tbl, err := tenant.Compile(&tenant.Config{
		// Other methods fall under each caller's default.
		Tenants: map[string]tenant.TenantSpec{"acme": {
			Keys:    []string{h},
			Default: &tenant.LimitSpec{Rate: 100, Burst: 100},
			Methods: map[string]tenant.MethodSpec{getStock: {Limit: &acmeQuota}},
		}},
		Anonymous: &tenant.TenantSpec{
			Default: &tenant.LimitSpec{Rate: 1, Burst: 1},
			Methods: map[string]tenant.MethodSpec{getStock: {Limit: &anonQuota}},
		},
	})
	if err != nil {
		return "", nil, err
	}
	store, err := keyed.New()
	if err != nil {
		return "", nil, err
	}
	lim, err := middleware.New(store, middleware.Static(tbl))
	if err != nil {
		return "", nil, err
	}
	hl, err := httplimit.New(lim)
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(getStock, connect.NewUnaryHandler(getStock, func(ctx context.Context, req *connect.Request[inventoryv1.GetStockRequest]) (*connect.Response[inventoryv1.GetStockResponse], error) {
		return connect.NewResponse(&inventoryv1.GetStockResponse{Level: &inventoryv1.StockLevel{Sku: req.Msg.GetSku(), Available: 42}}), nil
	}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: hl.Handle(mux), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	stop := func() {
		_ = srv.Close()
		<-done
	}
	return "http://" + lis.Addr().String(), stop, nil
}

// flood makes one call for the caller whose tally t is, and counts what
// came back.
func flood(ctx context.Context, client *connect.Client[inventoryv1.GetStockRequest, inventoryv1.GetStockResponse], key string, t *tally, mu *sync.Mutex) {
	req := connect.NewRequest(&inventoryv1.GetStockRequest{Sku: "sku-1"})
	if key != "" {
		req.Header().Set("X-Api-Key", key)
	}
	res, err := client.CallUnary(ctx, req)
	if ctx.Err() != nil {
		return // the run ended while the call was out: count nothing
	}
	mu.Lock()
	defer mu.Unlock()
	var ce *connect.Error
	switch {
	case err == nil:
		t.admitted++
		t.rateLimit = res.Header().Get("RateLimit")
	case errors.As(err, &ce) && ce.Meta().Get("RateLimit") != "":
		t.rejected[ce.Code().String()]++
		t.retryAfter[ce.Meta().Get("Retry-After")+"s"]++
		t.rateLimit = ce.Meta().Get("RateLimit")
		if t.detail == "" {
			t.detail = describe(ce)
		}
	default:
		t.failed++
	}
}

// describe names a rejection's ErrorInfo reason and RetryInfo delay, as a
// Connect client decodes them.
func describe(ce *connect.Error) string {
	var parts []string
	for _, d := range ce.Details() {
		switch v, _ := d.Value(); v := v.(type) {
		case *errdetails.ErrorInfo:
			parts = append(parts, "ErrorInfo "+v.GetReason())
		case *errdetails.RetryInfo:
			parts = append(parts, "RetryInfo "+v.GetRetryDelay().AsDuration().String())
		}
	}
	return strings.Join(parts, ", ")
}

func report(out io.Writer, s summary) {
	fmt.Fprintf(out, "\nin %v:\n", s.elapsed.Round(time.Millisecond))
	for _, t := range s.callers {
		fmt.Fprintf(out, "%s, quota %g/s burst %d:\n", t.name, t.quota.Rate, t.quota.Burst)
		fmt.Fprintf(out, "  admitted  %6d (the quota allows %d)\n", t.admitted, allowed(t.quota, s.elapsed))
		for _, code := range slices.Sorted(maps.Keys(t.rejected)) {
			fmt.Fprintf(out, "  rejected  %6d %s\n", t.rejected[code], code)
		}
		if t.failed > 0 {
			fmt.Fprintf(out, "  failed    %6d otherwise\n", t.failed)
		}
		var ra []string
		for _, v := range slices.Sorted(maps.Keys(t.retryAfter)) {
			ra = append(ra, fmt.Sprintf("%s ×%d", v, t.retryAfter[v]))
		}
		if len(ra) > 0 {
			fmt.Fprintf(out, "  Retry-After seen: %s\n", strings.Join(ra, ", "))
		}
		if t.detail != "" {
			fmt.Fprintf(out, "  details: %s\n", t.detail)
		}
		fmt.Fprintf(out, "  last RateLimit: %s\n", t.rateLimit)
	}
}
