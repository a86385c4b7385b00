package bench

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/floodgate-go/floodgate/bench/internal/peers"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// The server interceptors side by side: floodgate's middleware and
// go-grpc-middleware's ratelimit interceptor over the usual hand-written
// limiter, a map[string]*rate.Limiter keyed by the peer's IP behind a mutex.
// Both are called directly with a fake handler, for anonymous callers spread
// over 1024 addresses, on the accepted path (limits never reached) and on
// the rejected path (every bucket empty).

type nopTransportStream struct{}

func (nopTransportStream) Method() string               { return "/bench.v1.Svc/Get" }
func (nopTransportStream) SetHeader(metadata.MD) error  { return nil }
func (nopTransportStream) SendHeader(metadata.MD) error { return nil }
func (nopTransportStream) SetTrailer(metadata.MD) error { return nil }

var icptSink any

func peerContexts(n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 1, byte(i>>8), byte(i)), Port: 40000 + i}})
		ctxs[i] = grpc.NewContextWithServerTransportStream(ctx, nopTransportStream{})
	}
	return ctxs
}

func floodgateInterceptor(b *testing.B, r float64, burst int) grpc.UnaryServerInterceptor {
	tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: r, Burst: burst}}})
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
	return l.UnaryServerInterceptor()
}

func ratelimitInterceptor(r float64, burst int) grpc.UnaryServerInterceptor {
	return peers.RatelimitInterceptor(r, burst)
}

func BenchmarkInterceptor(b *testing.B) {
	const peers = 1024
	ctxs := peerContexts(peers)
	info := &grpc.UnaryServerInfo{FullMethod: "/bench.v1.Svc/Get"}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	for _, path := range []struct {
		name  string
		rate  float64
		burst int
	}{
		{"accepted", 1e9, 1e9},
		{"rejected", 1e-9, 1},
	} {
		for _, im := range []struct {
			name string
			new  func() grpc.UnaryServerInterceptor
		}{
			{"floodgate", func() grpc.UnaryServerInterceptor { return floodgateInterceptor(b, path.rate, path.burst) }},
			{"ggm-ratelimit-map", func() grpc.UnaryServerInterceptor { return ratelimitInterceptor(path.rate, path.burst) }},
		} {
			b.Run(path.name+"/"+im.name, func(b *testing.B) {
				icpt := im.new()
				// Warm every peer's bucket, and drain it on the rejected path;
				// then check the path is the one measured.
				for _, ctx := range ctxs {
					_, _ = icpt(ctx, nil, info, handler)
				}
				wantErr := path.name == "rejected"
				for i, ctx := range ctxs {
					if _, err := icpt(ctx, nil, info, handler); (err != nil) != wantErr {
						b.Fatalf("peer %d: err = %v on the %s path", i, err, path.name)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						icptSink, _ = icpt(ctxs[i&(peers-1)], nil, info, handler)
						i++
					}
				})
			})
		}
	}
}

func TestInterceptorsAgree(t *testing.T) {
	ctxs := peerContexts(16)
	info := &grpc.UnaryServerInfo{FullMethod: "/bench.v1.Svc/Get"}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	for name, icpt := range map[string]grpc.UnaryServerInterceptor{
		"floodgate": func() grpc.UnaryServerInterceptor {
			tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1e-9, Burst: 3}}})
			if err != nil {
				t.Fatal(err)
			}
			store, _ := keyed.New()
			l, err := middleware.New(store, middleware.Static(tbl))
			if err != nil {
				t.Fatal(err)
			}
			return l.UnaryServerInterceptor()
		}(),
		"ggm-ratelimit-map": ratelimitInterceptor(1e-9, 3),
	} {
		for i, ctx := range ctxs {
			ok := 0
			for range 5 {
				if _, err := icpt(ctx, nil, info, handler); err == nil {
					ok++
				}
			}
			if ok != 3 {
				t.Errorf("%s: peer %d admitted %d of 5, want its burst of 3", name, i, ok)
			}
		}
	}
}
