package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/loadreport"
	"github.com/floodgate-go/floodgate/middleware"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/tenant"
)

// replicaConfig is one server of the experiment.
type replicaConfig struct {
	Addr string
	// Pool and Hold make a blocking handler: each call holds one of Pool
	// connections for Hold, so the capacity is Pool/Hold calls a second
	// whatever the CPU does. HalveAfter takes half the pool away that long
	// after the server starts (0: never).
	Pool       int
	Hold       time.Duration
	HalveAfter time.Duration
	// Reports turns on ORCA load reports (package loadreport).
	Reports bool
	// Unlimited serves without floodgate, to measure the capacity.
	Unlimited bool
	// Forward makes a front: Allocate calls the same method at this
	// address, with the caller's context; Propagate carries the priority
	// the front admitted the call at (middleware.PropagatePriority).
	Forward   string
	Propagate bool
	// TrustPriority honours the priority that loopback callers send.
	TrustPriority bool
}

// The tenants of the two-hop chain, by API key (x-api-key). The front knows
// them; the back sees only the front.
const (
	noisyKey = "fleet-demo-noisy"
	quietKey = "fleet-demo-quiet"
)

func replicaCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet replica", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c replicaConfig
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:0", "listen `address`")
	fs.IntVar(&c.Pool, "pool", 12, "connections of the blocking handler's pool")
	fs.DurationVar(&c.Hold, "hold", 20*time.Millisecond, "how long a call holds a connection")
	fs.DurationVar(&c.HalveAfter, "halve-after", 0, "take half the pool away this long after the start; 0 never")
	fs.BoolVar(&c.Reports, "reports", true, "send ORCA load reports")
	fs.BoolVar(&c.Unlimited, "unlimited", false, "serve without floodgate (to measure the capacity)")
	fs.StringVar(&c.Forward, "forward", "", "forward every call to this `address` instead of serving it (a front)")
	fs.BoolVar(&c.Propagate, "propagate", false, "with -forward, carry the call's priority downstream")
	fs.BoolVar(&c.TrustPriority, "trust-priority", false, "honour the priority loopback callers send")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.Forward == "" && (c.Pool < 2 || c.Hold <= 0) {
		return errors.New("-pool must be at least 2 and -hold positive")
	}
	return serveReplica(ctx, c, func(addr string) { fmt.Fprintf(stdout, "listening %s\n", addr) })
}

// serveReplica serves c until ctx ends, calling ready with its address once
// it listens.
func serveReplica(ctx context.Context, c replicaConfig, ready func(addr string)) error {
	var sopts []grpc.ServerOption
	if !c.Unlimited {
		var err error
		if sopts, err = limiterOptions(c); err != nil {
			return err
		}
	}
	srv := grpc.NewServer(sopts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var svc inventoryv1.InventoryServer
	if c.Forward != "" {
		dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if c.Propagate {
			dial = append(dial, middleware.PropagatePriority()...)
		}
		cc, err := grpc.NewClient(c.Forward, dial...)
		if err != nil {
			return err
		}
		defer cc.Close()
		svc = &forwarder{next: inventoryv1.NewInventoryClient(cc)}
	} else {
		p := newPool(c.Pool, c.Hold)
		if c.HalveAfter > 0 {
			time.AfterFunc(c.HalveAfter, p.halve)
		}
		svc = p
	}
	inventoryv1.RegisterInventoryServer(srv, svc)
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	ready(ln.Addr().String())
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// limiterOptions returns the server options of c's Limiter: the front's,
// or NewOverload with its load reports.
func limiterOptions(c replicaConfig) ([]grpc.ServerOption, error) {
	var opts []middleware.Option
	if c.TrustPriority {
		opts = append(opts, middleware.WithPriorityFromPeers(netip.MustParsePrefix("127.0.0.0/8")))
	}
	if c.Forward != "" {
		lim, err := frontLimiter(opts...)
		if err != nil {
			return nil, err
		}
		return lim.ServerOptions(), nil
	}
	lim, err := middleware.NewOverload(opts...)
	if err != nil {
		return nil, err
	}
	sopts := lim.ServerOptions()
	if c.Reports {
		rep, err := loadreport.New(lim.Overload())
		if err != nil {
			return nil, err
		}
		sopts = append(sopts, rep.ServerOptions()...)
	}
	return sopts, nil
}

// frontLimiter is the front's Limiter: the two tenants by API key, the
// noisy one sheddable and the quiet one critical, and no quota or
// controller of its own: it passes everything on, so that the back alone
// decides what is shed.
func frontLimiter(opts ...middleware.Option) (*middleware.Limiter, error) {
	unlimited := &tenant.LimitSpec{Rate: math.Inf(1)}
	noisy, err := tenant.HashKey(noisyKey)
	if err != nil {
		return nil, err
	}
	quiet, err := tenant.HashKey(quietKey)
	if err != nil {
		return nil, err
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{
			"noisy": {Keys: []string{noisy}, Default: unlimited, Priority: "sheddable"},
			"quiet": {Keys: []string{quiet}, Default: unlimited, Priority: "critical"},
		},
		Anonymous: &tenant.TenantSpec{Default: unlimited},
	})
	if err != nil {
		return nil, err
	}
	store, err := keyed.New()
	if err != nil {
		return nil, err
	}
	return middleware.New(store, middleware.Static(tbl), append(opts, middleware.WithAPIKeyHeaders("x-api-key"))...)
}

// pool is the blocking handler: a call holds one of a few connections.
type pool struct {
	inventoryv1.UnimplementedInventoryServer
	conns chan struct{}
	hold  time.Duration
}

func newPool(n int, hold time.Duration) *pool {
	return &pool{conns: make(chan struct{}, n), hold: hold}
}

// halve takes half the connections for good, as a dependency that loses
// half its capacity would.
func (p *pool) halve() {
	go func() {
		for range cap(p.conns) / 2 {
			p.conns <- struct{}{}
		}
	}()
}

func (p *pool) Allocate(ctx context.Context, _ *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	select {
	case p.conns <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	time.Sleep(p.hold)
	<-p.conns
	return &inventoryv1.AllocateResponse{}, nil
}

// forwarder is the front's handler: the back does the work.
type forwarder struct {
	inventoryv1.UnimplementedInventoryServer
	next inventoryv1.InventoryClient
}

func (f *forwarder) Allocate(ctx context.Context, req *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	return f.next.Allocate(ctx, req)
}
