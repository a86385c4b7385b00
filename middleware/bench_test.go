package middleware_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

var (
	sink    any
	sinkRes floodgate.Result
)

func noop(ctx context.Context, req any) (any, error) { return req, nil }

// benchTable admits everything for "open" (accepted path) and nothing more
// than one call in a very long time for "closed" (rejected path).
func benchTable(b *testing.B) *tenant.Table {
	b.Helper()
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{
			"open":   {Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, Keys: []string{hashKey(b, "open-key-0123456789")}},
			"closed": {Default: &tenant.LimitSpec{Rate: 1e-6, Burst: 1}, Keys: []string{hashKey(b, "closed-key-0123456789")}},
		},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}},
	})
	if err != nil {
		b.Fatal(err)
	}
	return tbl
}

func benchCtx(md metadata.MD) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 4242}})
	if md != nil {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	return grpc.NewContextWithServerTransportStream(ctx, nopStream{})
}

type nopStream struct{}

func (nopStream) Method() string                  { return methodGet }
func (nopStream) SetHeader(metadata.MD) error     { return nil }
func (nopStream) SendHeader(metadata.MD) error    { return nil }
func (nopStream) SetTrailer(md metadata.MD) error { return nil }

func benchLimiter(b *testing.B, opts ...middleware.Option) *middleware.Limiter {
	b.Helper()
	store, err := keyed.New()
	if err != nil {
		b.Fatal(err)
	}
	l, err := middleware.New(store, middleware.Static(benchTable(b)), opts...)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkHandler is the baseline: the fake handler called directly.
func BenchmarkHandler(b *testing.B) {
	ctx := benchCtx(apiKeyMD("open-key-0123456789"))
	b.ReportAllocs()
	reportCPU(b, func() {
		for b.Loop() {
			sink, _ = noop(ctx, nil)
		}
	})
}

// BenchmarkAccepted is the accepted path, by identity.
func BenchmarkAccepted(b *testing.B) {
	for _, bc := range []struct {
		name string
		md   metadata.MD
	}{
		{"anonymous", nil},
		{"apikey", apiKeyMD("open-key-0123456789")},
		{"bearer", metadata.Pairs("authorization", "Bearer open-key-0123456789")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := benchLimiter(b)
			icpt := l.UnaryServerInterceptor()
			ctx := benchCtx(bc.md)
			info := &grpc.UnaryServerInfo{FullMethod: methodGet}
			if _, err := icpt(ctx, nil, info, noop); err != nil {
				b.Fatalf("fixture rejects: %v", err)
			}
			b.ReportAllocs()
			reportCPU(b, func() {
				for b.Loop() {
					sink, _ = icpt(ctx, nil, info, noop)
				}
			})
		})
	}
}

// BenchmarkAcceptedParallel is the accepted path from every core at once,
// anonymous callers spread over 1024 addresses.
func BenchmarkAcceptedParallel(b *testing.B) {
	l := benchLimiter(b)
	icpt := l.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	ctxs := make([]context.Context, 1024)
	for i := range ctxs {
		ctxs[i] = grpc.NewContextWithServerTransportStream(peer.NewContext(context.Background(),
			&peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, byte(i>>8), byte(i)), Port: 1}}), nopStream{})
	}
	b.ReportAllocs()
	reportCPU(b, func() {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				sink, _ = icpt(ctxs[i&1023], nil, info, noop)
				i++
			}
		})
	})
}

// BenchmarkRejected is the rejected path, with and without details; the
// handler never runs.
func BenchmarkRejected(b *testing.B) {
	for _, bc := range []struct {
		name    string
		details bool
	}{{"details", true}, {"plain", false}} {
		b.Run(bc.name, func(b *testing.B) {
			l := benchLimiter(b, middleware.WithDetails(bc.details))
			icpt := l.UnaryServerInterceptor()
			ctx := benchCtx(apiKeyMD("closed-key-0123456789"))
			info := &grpc.UnaryServerInfo{FullMethod: methodGet}
			_, _ = icpt(ctx, nil, info, noop) // drain the burst of 1
			ran := false
			handler := func(context.Context, any) (any, error) { ran = true; return nil, nil }
			if _, err := icpt(ctx, nil, info, handler); err == nil || ran {
				b.Fatal("fixture admits")
			}
			b.ReportAllocs()
			reportCPU(b, func() {
				for b.Loop() {
					sink, _ = icpt(ctx, nil, info, handler)
				}
			})
		})
	}
}

// BenchmarkTapOpen is the tap handle with the gate open: what every call
// pays for installing it.
func BenchmarkTapOpen(b *testing.B) {
	l := benchLimiter(b)
	ctx := benchCtx(nil)
	b.ReportAllocs()
	reportCPU(b, func() {
		for b.Loop() {
			sink, _ = l.TapHandle(ctx, &tap.Info{FullMethodName: methodGet})
		}
	})
}

var _ floodgate.Store = (*keyed.Map)(nil)

// BenchmarkStoreTake is the store's share of the accepted path: one take on
// a known key, as the interceptor makes it.
func BenchmarkStoreTake(b *testing.B) {
	store, err := keyed.New()
	if err != nil {
		b.Fatal(err)
	}
	lim := floodgate.PerSecond(1e9, 1e9)
	ctx := context.Background()
	b.ReportAllocs()
	reportCPU(b, func() {
		for b.Loop() {
			res, _ := store.TakeN(ctx, "t:open:0123abcd", lim, 1)
			sinkRes = res
		}
	})
}

// BenchmarkTapFloor is the tap handle while the gate sheds at its floor:
// the caller's subject is resolved and its penalty looked up.
func BenchmarkTapFloor(b *testing.B) {
	g, err := cpugate.New(cpugate.SamplerFunc(func() (cpugate.Reading, error) { return cpugate.Reading{CPU: 1}, nil }), cpugate.WithPolicy(cpugate.Fixed{}))
	if err != nil {
		b.Fatal(err)
	}
	if err := g.SampleAt(time.Now()); err != nil || g.State() != cpugate.Shedding {
		b.Fatalf("gate not shedding: %v", err)
	}
	l := benchLimiter(b, middleware.WithGate(g))
	md := apiKeyMD("closed-key-0123456789")
	ctx := benchCtx(md)
	icpt := l.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	for range 2 {
		_, _ = icpt(ctx, nil, info, noop) // drain and get a penalty
	}
	tinfo := &tap.Info{FullMethodName: methodGet, Header: md}
	if _, err := l.TapHandle(ctx, tinfo); err == nil {
		b.Fatal("tap admits a penalized caller at the floor")
	}
	b.ReportAllocs()
	reportCPU(b, func() {
		for b.Loop() {
			sink, _ = l.TapHandle(ctx, tinfo)
		}
	})
}

// BenchmarkMetered is an admitted call with a metered quota, reserved and
// settled at the cost its handler reports, beside the same call without
// one, through the interceptor.
func BenchmarkMetered(b *testing.B) {
	key := "open-key-0123456789"
	huge := tenant.MeteredSpec{Unit: "tokens", Rate: 1e12, Burst: 1e9, Estimate: 4000}
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{"open": {
			Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, Keys: []string{hashKey(b, key)},
			Methods: map[string]tenant.MethodSpec{"/llm.v1.Completions/*": {Metered: &huge}},
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	report := func(ctx context.Context, req any) (any, error) {
		middleware.ReportCost(ctx, 1000)
		return req, nil
	}
	for _, bc := range []struct {
		name, method string
	}{{"plain", methodGet}, {"metered", "/llm.v1.Completions/Generate"}} {
		b.Run(bc.name, func(b *testing.B) {
			store, err := keyed.New()
			if err != nil {
				b.Fatal(err)
			}
			l, err := middleware.New(store, middleware.Static(tbl))
			if err != nil {
				b.Fatal(err)
			}
			// The fixture's check runs on a twin that counts its events,
			// so that the benchmarked Limiter has no observer.
			ty := &tally{}
			twin, err := middleware.New(store, middleware.Static(tbl), ty.option(nil))
			if err != nil {
				b.Fatal(err)
			}
			icpt := l.UnaryServerInterceptor()
			ctx := benchCtx(apiKeyMD(key))
			info := &grpc.UnaryServerInfo{FullMethod: bc.method}
			if _, err := twin.UnaryServerInterceptor()(ctx, nil, info, report); err != nil {
				b.Fatalf("fixture rejects: %v", err)
			}
			if _, err := icpt(ctx, nil, info, report); err != nil {
				b.Fatalf("fixture rejects: %v", err)
			}
			if got, want := ty.counts().Settled > 0, bc.method != methodGet; got != want {
				b.Fatalf("settled a call: %v, want %v", got, want)
			}
			b.ReportAllocs()
			reportCPU(b, func() {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						sink, _ = icpt(ctx, nil, info, report)
					}
				})
			})
		})
	}
}
