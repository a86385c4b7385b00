// Command retrystorm shows what client-side throttling (package throttle)
// does to a retry storm. It serves the inventory service's GetStock on
// loopback behind floodgate's interceptors, with a quota of -limit calls a
// second for everyone, and offers it three times that from clients that
// retry every rejection, twice over:
//
//   - naive: the application retries UNAVAILABLE and RESOURCE_EXHAUSTED up
//     to 3 attempts in all, after 20–50 ms, as most retry loops do;
//   - throttled: no application retries; the connection goes through
//     throttle.New(throttle.WithRetries(3)): calls the server has been
//     rejecting fail on the client, and rejected calls are retried after
//     the server's RetryInfo delay, within a budget of a tenth of the calls.
//
// For each it prints the calls offered, the attempts that reached the
// server (the wire), the calls served and the calls dropped on the client,
// per second. Both serve what the quota allows; the throttled clients put
// a fraction of the naive ones' attempts on the wire.
//
// Usage:
//
//	go run ./examples/retrystorm                 # 3 s per mode
//	go run ./examples/retrystorm -duration 10s -limit 500
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/tenant"
	"github.com/floodgate-go/floodgate/throttle"
)

func main() {
	cfg := config{}
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long each mode runs")
	flag.Float64Var(&cfg.limit, "limit", 200, "the server's quota, calls/s")
	flag.Float64Var(&cfg.overload, "overload", 3, "offered load as a multiple of the quota")
	flag.Parse()
	if err := run(os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "retrystorm:", err)
		os.Exit(1)
	}
}

type config struct {
	duration time.Duration
	limit    float64
	overload float64
}

// result is one mode's counts.
type result struct {
	mode                           string
	offered, wire, served, locally int64
	seconds                        float64
}

func run(w io.Writer, cfg config) error {
	if cfg.duration <= 0 || cfg.limit <= 0 || cfg.overload <= 0 {
		return errors.New("-duration, -limit and -overload must be positive")
	}
	addr, wire, stop, err := serve(cfg.limit)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(w, "quota %.0f calls/s, offered %.0f calls/s, %v per mode\n\n", cfg.limit, cfg.limit*cfg.overload, cfg.duration)
	fmt.Fprintf(w, "%-10s %10s %10s %10s %12s\n", "mode", "offered/s", "wire/s", "served/s", "dropped/s")
	var results []result
	for _, mode := range []string{"naive", "throttled"} {
		r, err := flood(addr, wire, mode, cfg)
		if err != nil {
			return err
		}
		results = append(results, r)
		per := func(n int64) float64 { return float64(n) / r.seconds }
		fmt.Fprintf(w, "%-10s %10.0f %10.0f %10.0f %12.0f\n", r.mode, per(r.offered), per(r.wire), per(r.served), per(r.locally))
	}
	rate := func(r result, n int64) float64 { return float64(n) / r.seconds }
	naive, throttled := results[0], results[1]
	fmt.Fprintf(w, "\nthe throttled clients sent %.1f× fewer attempts a second and were served %.0f%% as many calls as the naive ones\n",
		rate(naive, naive.wire)/max(rate(throttled, throttled.wire), 1e-9), 100*rate(throttled, throttled.served)/max(rate(naive, naive.served), 1e-9))
	return nil
}

type stockServer struct {
	inventoryv1.UnimplementedInventoryServer
}

func (stockServer) GetStock(context.Context, *inventoryv1.GetStockRequest) (*inventoryv1.GetStockResponse, error) {
	return &inventoryv1.GetStockResponse{Level: &inventoryv1.StockLevel{Available: 1}}, nil
}

// serve starts the server on a loopback port with a quota of limit calls
// a second for every caller. wire counts the attempts that reach it.
func serve(limit float64) (addr string, wire *atomic.Int64, stop func(), err error) {
	tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: limit, Burst: max(1, int(limit/10))}}})
	if err != nil {
		return "", nil, nil, err
	}
	store, err := keyed.New()
	if err != nil {
		return "", nil, nil, err
	}
	lim, err := middleware.New(store, middleware.Static(tbl))
	if err != nil {
		return "", nil, nil, err
	}
	wire = new(atomic.Int64)
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		wire.Add(1)
		return h(ctx, req)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(count, lim.UnaryServerInterceptor()))
	inventoryv1.RegisterInventoryServer(srv, stockServer{})
	go srv.Serve(lis)
	return lis.Addr().String(), wire, srv.Stop, nil
}

// flood offers calls at cfg.overload × cfg.limit a second, open loop, for
// cfg.duration, from clients of the given mode, and counts what happened.
func flood(addr string, wire *atomic.Int64, mode string, cfg config) (result, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if mode == "throttled" {
		th, err := throttle.New(throttle.WithRetries(3))
		if err != nil {
			return result{}, err
		}
		opts = append(opts, grpc.WithChainUnaryInterceptor(th.UnaryClientInterceptor()))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	client := inventoryv1.NewInventoryClient(conn)
	// Let the previous mode's bucket refill, then count from zero.
	time.Sleep(time.Second)
	startWire := wire.Load()
	r := result{mode: mode}
	var served, locally atomic.Int64
	var calls sync.WaitGroup
	gap := time.Duration(float64(time.Second) / (cfg.limit * cfg.overload))
	start := time.Now()
	tick := time.NewTicker(gap)
	for time.Since(start) < cfg.duration {
		<-tick.C
		r.offered++
		calls.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			var err error
			if mode == "naive" {
				err = callNaive(ctx, client)
			} else {
				_, err = client.GetStock(ctx, &inventoryv1.GetStockRequest{Sku: "sku-1"})
			}
			switch {
			case err == nil:
				served.Add(1)
			case errors.Is(err, throttle.ErrThrottled):
				locally.Add(1)
			}
		})
	}
	tick.Stop()
	calls.Wait()
	r.seconds = time.Since(start).Seconds()
	r.wire, r.served, r.locally = wire.Load()-startWire, served.Load(), locally.Load()
	return r, nil
}

// callNaive is a typical retry loop: up to 3 attempts, 20–50 ms apart,
// on UNAVAILABLE and RESOURCE_EXHAUSTED, within the deadline.
func callNaive(ctx context.Context, client inventoryv1.InventoryClient) error {
	for attempt := 1; ; attempt++ {
		_, err := client.GetStock(ctx, &inventoryv1.GetStockRequest{Sku: "sku-1"})
		code := status.Code(err)
		if attempt == 3 || (code != codes.Unavailable && code != codes.ResourceExhausted) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20*time.Millisecond + rand.N(30*time.Millisecond)):
		}
	}
}
