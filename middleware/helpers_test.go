package middleware_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	acmeKey   = "acme-0123456789abcdef"
	globexKey = "globex-0123456789abcdef"
	methodGet = "/inventory.v1.Inventory/Get"
	methodPut = "/inventory.v1.Inventory/Put"
)

func hashKey(t testing.TB, key string) string {
	t.Helper()
	h, err := tenant.HashKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// testTable: acme (gold: 10/s burst 5, Put its own bucket of 1/s burst 1),
// globex (same tier), anonymous callers 1/s burst 2.
func testTable(t testing.TB) *tenant.Table {
	t.Helper()
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{
			"gold": {
				Default: &tenant.LimitSpec{Rate: 10, Burst: 5},
				Methods: map[string]tenant.MethodSpec{methodPut: {Limit: &tenant.LimitSpec{Rate: 1, Burst: 1}}},
			},
		},
		Tenants: map[string]tenant.TenantSpec{
			"acme":   {Tier: "gold", Keys: []string{hashKey(t, acmeKey)}},
			"globex": {Tier: "gold", Keys: []string{hashKey(t, globexKey)}},
		},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// clock is a fake clock shared by a keyed.Map and a Limiter.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	l     *middleware.Limiter
	store *keyed.Map
	clock *clock
}

func newFixture(t testing.TB, opts ...middleware.Option) fixture {
	t.Helper()
	c := newClock()
	store, err := keyed.New(keyed.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	l, err := middleware.New(store, middleware.Static(testTable(t)), append([]middleware.Option{middleware.WithClock(c)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{l: l, store: store, clock: c}
}

// transportStream records what the interceptor sets, like grpc-go's.
type transportStream struct {
	method            string
	header, trailer   metadata.MD
	headerCalls, sent int
}

func (s *transportStream) Method() string { return s.method }
func (s *transportStream) SetHeader(md metadata.MD) error {
	s.headerCalls++
	s.header = metadata.Join(s.header, md)
	return nil
}
func (s *transportStream) SendHeader(md metadata.MD) error { s.sent++; return s.SetHeader(md) }
func (s *transportStream) SetTrailer(md metadata.MD) error {
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

// call describes the context of a direct interceptor call.
type call struct {
	addr string // "ip:port"; "" for no peer
	md   metadata.MD
}

func (c call) context(method string) (context.Context, *transportStream) {
	ctx := context.Background()
	if c.addr != "" {
		a, err := net.ResolveTCPAddr("tcp", c.addr)
		if err != nil {
			panic(err)
		}
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: a})
	}
	if c.md != nil {
		ctx = metadata.NewIncomingContext(ctx, c.md)
	}
	ts := &transportStream{method: method}
	return grpc.NewContextWithServerTransportStream(ctx, ts), ts
}

// tapped returns the context ctx of a call to method with headers md as
// the Limiter's tap handle returns it, as a server with ServerOptions
// gives it to the interceptors; ctx itself when the tap rejects the call.
func tapped(l *middleware.Limiter, ctx context.Context, method string, md metadata.MD) context.Context {
	tctx, err := l.TapHandle(ctx, &tap.Info{FullMethodName: method, Header: md})
	if err != nil {
		return ctx
	}
	return tctx
}

// unary calls the Limiter's unary interceptor directly with a fake handler
// and reports whether the handler ran, with the decision it saw.
func unary(l *middleware.Limiter, c call, method string) (ran bool, d middleware.Decision, ts *transportStream, err error) {
	ctx, ts := c.context(method)
	_, err = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
		ran = true
		d, _ = middleware.FromContext(ctx)
		return nil, nil
	})
	return ran, d, ts, err
}

func apiKeyMD(key string) metadata.MD { return metadata.Pairs("x-api-key", key) }
