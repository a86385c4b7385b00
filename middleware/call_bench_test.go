package middleware_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
)

// benchService is a unary method that answers its request at once:
// "/bench.v1.Svc/Get", not exempt.
var benchService = grpc.ServiceDesc{
	ServiceName: "bench.v1.Svc",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Get", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(emptypb.Empty)
		if err := dec(in); err != nil {
			return nil, err
		}
		if icpt == nil {
			return in, nil
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/bench.v1.Svc/Get"}, noop)
	}}},
}

// benchServer serves benchService and gRPC's health service over bufconn
// with opts, and returns a client connection to it.
func benchServer(b *testing.B, opts ...grpc.ServerOption) *grpc.ClientConn {
	b.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&benchService, struct{}{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return cc
}

// BenchmarkCall is one whole unary call over bufconn, client and server
// on one connection: on a server without the Limiter (bare), and through
// ServerOptions admitted (with and without an overload controller),
// rejected, and a health check, exempt, on the same server. floodgate's
// share of an admitted call is admitted less bare.
func BenchmarkCall(b *testing.B) {
	in, out := new(emptypb.Empty), new(emptypb.Empty)
	open := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "open-key-0123456789")
	closed := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "closed-key-0123456789")
	get := func(ctx context.Context, cc *grpc.ClientConn) error {
		return cc.Invoke(ctx, "/bench.v1.Svc/Get", in, out)
	}
	check := func(ctx context.Context, cc *grpc.ClientConn) error {
		return cc.Invoke(ctx, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, new(healthpb.HealthCheckResponse))
	}
	withCtl := func(b *testing.B) []middleware.Option {
		c, err := overload.New()
		if err != nil {
			b.Fatal(err)
		}
		return []middleware.Option{middleware.WithOverload(c)}
	}
	for _, bc := range []struct {
		name     string
		limiter  bool
		ctl      bool
		ctx      context.Context
		call     func(context.Context, *grpc.ClientConn) error
		rejected bool
	}{
		{name: "bare", ctx: open, call: get},
		{name: "admitted", limiter: true, ctx: open, call: get},
		{name: "admitted-overload", limiter: true, ctl: true, ctx: open, call: get},
		{name: "rejected", limiter: true, ctx: closed, call: get, rejected: true},
		{name: "health", limiter: true, ctx: open, call: check},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var opts []grpc.ServerOption
			if bc.limiter {
				var lopts []middleware.Option
				if bc.ctl {
					lopts = withCtl(b)
				}
				opts = benchLimiter(b, lopts...).ServerOptions()
			}
			cc := benchServer(b, opts...)
			_ = bc.call(bc.ctx, cc) // the closed tenant's one token
			if err := bc.call(bc.ctx, cc); (err != nil) != bc.rejected {
				b.Fatalf("fixture: %v, want rejected %v", err, bc.rejected)
			}
			b.ReportAllocs()
			reportCPU(b, func() {
				for b.Loop() {
					_ = bc.call(bc.ctx, cc)
				}
			})
		})
	}
}

// BenchmarkShare measures what the Limiter adds to a whole unary call over
// bufconn, by pairs of blocks of calls without and with it, alternating
// which goes first, so that both see the same machine (see pairs). admitted and admitted-overload compare an admitted call
// with the same call on a server without the Limiter; rejected compares a
// rejected call with a health check (exempt) on the same server, and
// rejected-nodetails the same without status details (WithDetails(false)).
func BenchmarkShare(b *testing.B) {
	in, out := new(emptypb.Empty), new(emptypb.Empty)
	open := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "open-key-0123456789")
	closed := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "closed-key-0123456789")
	get := func(ctx context.Context, cc *grpc.ClientConn) func() {
		return func() { _ = cc.Invoke(ctx, "/bench.v1.Svc/Get", in, out) }
	}
	check := func(cc *grpc.ClientConn) func() {
		req, resp := &healthpb.HealthCheckRequest{}, new(healthpb.HealthCheckResponse)
		return func() { _ = cc.Invoke(open, "/grpc.health.v1.Health/Check", req, resp) }
	}
	limited := func(b *testing.B, ctl bool, more ...middleware.Option) *grpc.ClientConn {
		opts := more
		if ctl {
			c, err := overload.New()
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, middleware.WithOverload(c))
		}
		return benchServer(b, benchLimiter(b, opts...).ServerOptions()...)
	}
	b.Run("admitted", func(b *testing.B) {
		pairs(b, get(open, benchServer(b)), get(open, limited(b, false)))
	})
	b.Run("admitted-overload", func(b *testing.B) {
		pairs(b, get(open, benchServer(b)), get(open, limited(b, true)))
	})
	for _, bc := range []struct {
		name    string
		details bool
	}{{"rejected", true}, {"rejected-nodetails", false}} {
		b.Run(bc.name, func(b *testing.B) {
			cc := limited(b, false, middleware.WithDetails(bc.details))
			reject := get(closed, cc)
			reject() // the closed tenant's one token
			pairs(b, check(cc), reject)
		})
	}
}

// pairs runs b's loop through without and with in pairs of blocks of
// calls, and reports over the pairs the median difference per call in
// the process's CPU time (share-cpu-ns/op) and in wall time
// (share-ns/op), and the median ratio of CPU times (ratio).
func pairs(b *testing.B, without, with func()) {
	const block = 32
	without()
	with()
	var diffs, cpuDiffs, ratios []float64
	calls := 0
	b.ReportAllocs()
	for b.Loop() {
		if calls%block == 0 {
			var took, cpu [2]time.Duration
			first := len(diffs) % 2
			for _, i := range [2]int{first, 1 - first} {
				f := without
				if i == 1 {
					f = with
				}
				start, startCPU := time.Now(), processCPU()
				for range block {
					f()
				}
				took[i], cpu[i] = time.Since(start), processCPU()-startCPU
			}
			diffs = append(diffs, float64(took[1]-took[0])/block)
			cpuDiffs = append(cpuDiffs, float64(cpu[1]-cpu[0])/block)
			ratios = append(ratios, float64(cpu[1])/float64(cpu[0]))
		}
		calls++
	}
	for _, s := range [][]float64{diffs, cpuDiffs, ratios} {
		slices.Sort(s)
	}
	b.ReportMetric(diffs[len(diffs)/2], "share-ns/op")
	b.ReportMetric(cpuDiffs[len(cpuDiffs)/2], "share-cpu-ns/op")
	b.ReportMetric(ratios[len(ratios)/2], "ratio")
}

// BenchmarkPath is the Limiter's part of an admitted and a rejected call as
// ServerOptions installs it, without the transport: the tap handle, then
// the unary interceptor on the context the tap returned, with and without
// an overload controller.
func BenchmarkPath(b *testing.B) {
	for _, bc := range []struct {
		name, key string
		ctl       bool
	}{{"admitted", "open-key-0123456789", false}, {"admitted-overload", "open-key-0123456789", true}, {"rejected", "closed-key-0123456789", false}} {
		b.Run(bc.name, func(b *testing.B) {
			var opts []middleware.Option
			if bc.ctl {
				c, err := overload.New()
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, middleware.WithOverload(c))
			}
			l := benchLimiter(b, opts...)
			icpt := l.UnaryServerInterceptor()
			md := apiKeyMD(bc.key)
			base := benchCtx(md)
			info := &tap.Info{FullMethodName: methodGet, Header: md}
			uinfo := &grpc.UnaryServerInfo{FullMethod: methodGet}
			call := func() error {
				ctx, err := l.TapHandle(base, info)
				if err != nil {
					return err
				}
				cctx, cancel := context.WithCancel(ctx) // as the transport's stream context ends
				_, err = icpt(cctx, nil, uinfo, noop)
				cancel()
				return err
			}
			_ = call()
			if err := call(); (err != nil) != (bc.key != "open-key-0123456789") {
				b.Fatalf("fixture: %v", err)
			}
			b.ReportAllocs()
			reportCPU(b, func() {
				for b.Loop() {
					_ = call()
				}
			})
		})
	}
}
