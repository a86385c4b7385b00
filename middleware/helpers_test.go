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

	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	// pushbackKey is the gRFC A6 trailer of a rejection's retry delay.
	pushbackKey = "grpc-retry-pushback-ms"
	// defaultDomain is the ErrorInfo domain of rejections without
	// WithDomain.
	defaultDomain = "floodgate.dev"

	acmeKey   = "acme-0123456789abcdef"
	globexKey = "globex-0123456789abcdef"
	methodGet = "/inventory.v1.Inventory/Get"
	methodPut = "/inventory.v1.Inventory/Put"
	// methodStream is a server-streaming method.
	methodStream = "/inventory.v1.Inventory/Watch"
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
type clock = fakeclock.Clock

func newClock() *clock { return fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) }

type fixture struct {
	l     *middleware.Limiter
	store *keyed.Map
	clock *clock
	tally *tally // counts the Limiter's events, unless an option replaced its observer
}

func newFixture(t testing.TB, opts ...middleware.Option) fixture {
	t.Helper()
	c := newClock()
	store, err := keyed.New(keyed.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	ty := &tally{}
	l, err := middleware.New(store, middleware.Static(testTable(t)), append([]middleware.Option{middleware.WithClock(c), ty.option(nil)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{l: l, store: store, clock: c, tally: ty}
}

// counts are a Limiter's decisions as its events tell them, by kind.
// Admitted counts the calls their quota admitted, those the overload
// controller then shed included; StoreErrors the store's failures, those
// failing open that the controller then admitted (reported as store
// errors, allowed) or shed (reported as sheds, with Err) included; Gate the quota's refusals while the CPU gate
// scales limits down, and the tap handle's while the gate sheds; Overload
// the controller's, Shed and its refusals at the tap included; Tap the tap
// handle's rejections, of either reason.
type counts struct {
	Admitted, Exempt, Quota, Gate, Overload, Shed, StoreErrors, DryRun, Tap uint64
	RepeatedKeys, LongKeys, Debt, InvalidEstimates                          uint64
	Settled, SettleErrors, Uncharged, InvalidCosts                          uint64
}

// tally counts events into counts, and keeps the last; it is safe for
// concurrent use.
type tally struct {
	mu    sync.Mutex
	c     counts
	n     int
	lastE middleware.Event
}

// last returns the last event.
func (t *tally) last() middleware.Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastE
}

// len returns the events seen.
func (t *tally) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// option returns the observer option that counts each event, then passes
// it to next, if not nil.
func (t *tally) option(next func(middleware.Event)) middleware.Option {
	return middleware.WithObserver(func(e middleware.Event) {
		t.observe(e)
		if next != nil {
			next(e)
		}
	})
}

func (t *tally) observe(e middleware.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	t.lastE = e
	c := &t.c
	if e.Reason == middleware.ReasonSettled {
		c.Settled++
		if e.Err != nil {
			c.SettleErrors++
		}
		c.Uncharged += uint64(e.Uncharged)
		c.InvalidCosts += uint64(e.InvalidCosts)
		return
	}
	c.InvalidCosts += uint64(e.InvalidCosts) // each reported once
	switch e.KeyIgnored {
	case "repeated":
		c.RepeatedKeys++
	case "too_long":
		c.LongKeys++
	}
	if e.Tap {
		c.Tap++
	}
	if e.DryRun && !e.Allowed {
		c.DryRun++
	}
	switch e.Reason {
	case middleware.ReasonAdmitted:
		c.Admitted++
	case middleware.ReasonExempt:
		c.Exempt++
	case middleware.ReasonQuota:
		c.Quota++
	case middleware.ReasonGate:
		c.Gate++
	case middleware.ReasonOverload:
		c.Overload++
		if e.Shed {
			c.Shed++
			if e.Err != nil { // failed open, then shed
				c.StoreErrors++
			} else {
				c.Admitted++
			}
		}
	case middleware.ReasonStoreError:
		c.StoreErrors++
	case middleware.ReasonDebt:
		c.Debt++
	case middleware.ReasonInvalidEstimate:
		c.InvalidEstimates++
	}
}

// counts returns the counts so far.
func (t *tally) counts() counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.c
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
