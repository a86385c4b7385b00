package middleware_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
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
