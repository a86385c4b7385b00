package rlqsclient_test

import (
	"context"
	"errors"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/rls"
	"github.com/floodgate-go/floodgate/rls/rlqsclient"
	"github.com/floodgate-go/floodgate/tenant"
)

// fakeClock is the tests' controlled clock.
type fakeClock = fakeclock.Clock

// Every key is a bucket of its own with 100 a second, shared by the
// processes that report it.
const config = `
domain: svc
descriptors:
- key: key
  rate_limit: {unit: second, requests_per_unit: 100}
`

func newFakeClock() *fakeClock { return fakeclock.New(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) }

// env is a QuotaServer over bufconn on a fake clock, with a 1 s report
// interval (so a 4 s TTL).
type env struct {
	qs    *rls.QuotaServer
	clock *fakeClock
	lis   *bufconn.Listener
}

func newEnv(t *testing.T, opts ...rls.QuotaOption) *env {
	t.Helper()
	clock := newFakeClock()
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rls.ParseConfig("test.yaml", []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := rls.NewQuotaServer(svc, append([]rls.QuotaOption{rls.WithReportInterval(time.Second), rls.WithQuotaClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	qs.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { qs.Close(); gs.Stop() })
	// Past the server's learning window (one TTL from its start), when it
	// hands out no capacity that no subscriber has shown.
	clock.Advance(5 * time.Second)
	return &env{qs: qs, clock: clock, lis: lis}
}

// rpcs counts the RPCs started on a connection.
type rpcs struct{ unary, streams atomic.Int64 }

// client dials the server on a connection of its own, counting its RPCs,
// and returns a Client on it with its stream open.
func (e *env) client(t *testing.T, opts ...rlqsclient.Option) (*rlqsclient.Client, *rpcs) {
	t.Helper()
	n := &rpcs{}
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return e.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			n.unary.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			n.streams.Add(1)
			return streamer(ctx, desc, cc, method, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := rlqsclient.New(conn, "svc", append([]rlqsclient.Option{rlqsclient.WithClock(e.clock), rlqsclient.WithReportInterval(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// With no bucket, a report only opens the stream.
	if err := c.Report(context.Background()); err != nil {
		t.Fatalf("Report: %v", err)
	}
	return c, n
}

// wait waits until c has handled an event after seen.
func wait(t *testing.T, c *rlqsclient.Client, seen int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rlqsclient.WaitReceived(ctx, c, seen+1); err != nil {
		t.Fatalf("no answer from the server: %v", err)
	}
}

// report sends a report from each client and waits for the server's answers.
func report(t *testing.T, cs ...*rlqsclient.Client) {
	t.Helper()
	seen := make([]int, len(cs))
	for i, c := range cs {
		seen[i] = rlqsclient.Received(c)
		if err := c.Report(context.Background()); err != nil {
			t.Fatalf("Report: %v", err)
		}
	}
	for i, c := range cs {
		wait(t, c, seen[i])
	}
}

// subscribe takes one token of key from c, which subscribes it, and waits
// for its first assignment.
func subscribe(t *testing.T, c *rlqsclient.Client, key string, lim floodgate.Limit) floodgate.Result {
	t.Helper()
	seen := rlqsclient.Received(c)
	res, err := c.TakeN(context.Background(), key, lim, 1)
	if err != nil {
		t.Fatalf("TakeN: %v", err)
	}
	wait(t, c, seen)
	return res
}

var perInstance = floodgate.PerSecond(1000, 1000)

func TestSubscription(t *testing.T) {
	e := newEnv(t)
	c, _ := e.client(t)
	ctx := context.Background()
	// The first take is decided by the fallback, or by the lease if the
	// stream's goroutines were quicker than the take.
	if res := subscribe(t, c, "acme", perInstance); !res.Allowed {
		t.Errorf("first TakeN = %+v, want allowed", res)
	}
	got, ok := rlqsclient.Assigned(c, "acme")
	if !ok || got.Rate <= 0 || got.Rate > 100 || got.Burst < 1 {
		t.Fatalf("assignment = %v, %v; want a share of 100/s", got, ok)
	}
	res, err := c.TakeN(ctx, "acme", perInstance, 1)
	if err != nil || res.Source != floodgate.SourceLease || res.Limit != got {
		t.Errorf("TakeN after the assignment = %+v, %v; want decided by the lease under %v", res, err, got)
	}
	// A key the server does not limit: ALLOW_ALL, as is.
	c2, _ := e.client(t, rlqsclient.WithBucketID(func(key string, _ floodgate.Limit) map[string]string {
		return map[string]string{"other": key}
	}))
	subscribe(t, c2, "x", perInstance)
	if got, _ := rlqsclient.Assigned(c2, "x"); !got.IsInf() {
		t.Errorf("assignment of an unmatched bucket = %v, want Inf (ALLOW_ALL)", got)
	}
	for range 2000 {
		if res, _ := c2.TakeN(ctx, "x", perInstance, 1); !res.Allowed {
			t.Fatalf("TakeN under ALLOW_ALL = %+v, want allowed", res)
		}
	}
}

// TestShare runs two processes asking for one key's quota of 100 a
// second, one wanting 10 a second and the other 300, on a fake clock in
// steps of 10 ms with a report a second: the first gets what it wants with
// the headroom (11/s), the second the rest (87/s), and together they admit
// about the quota.
func TestShare(t *testing.T) {
	e := newEnv(t)
	cs := make([]*rlqsclient.Client, 2)
	for i := range cs {
		cs[i], _ = e.client(t)
	}
	ctx := context.Background()
	demands := []float64{10, 300}
	lim := floodgate.PerSecond(100, 100)
	for _, c := range cs {
		subscribe(t, c, "acme", lim)
	}
	const (
		step     = 10 * time.Millisecond
		duration = 20 * time.Second
		warm     = 10 * time.Second
	)
	owed := make([]float64, len(cs))
	admitted := make([]int, len(cs))
	for now := step; now <= duration; now += step {
		e.clock.Advance(step)
		for i, c := range cs {
			for owed[i] += demands[i] * step.Seconds(); owed[i] >= 1; owed[i]-- {
				res, err := c.TakeN(ctx, "acme", lim, 1)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed && now > warm {
					admitted[i]++
				}
			}
		}
		if now%time.Second == 0 {
			report(t, cs...)
			e.qs.Tick()
		}
	}
	window := (duration - warm).Seconds()
	wants := []struct{ lo, hi float64 }{{10, 12.5}, {82, 90}}
	total := 0.0
	for i, c := range cs {
		got, _ := rlqsclient.Assigned(c, "acme")
		rate := float64(admitted[i]) / window
		total += rate
		t.Logf("client %d: wants %.0f/s, assigned %v, admitted %.1f/s", i, demands[i], got, rate)
		if got.Rate < wants[i].lo || got.Rate > wants[i].hi {
			t.Errorf("client %d wanting %.0f/s: assigned %.1f/s, want in [%.1f, %.1f]", i, demands[i], got.Rate, wants[i].lo, wants[i].hi)
		}
		if rate < min(demands[i], wants[i].lo)*0.95 || rate > wants[i].hi*1.05 {
			t.Errorf("client %d wanting %.0f/s: admitted %.1f/s, want about %.0f–%.0f", i, demands[i], rate, wants[i].lo, wants[i].hi)
		}
	}
	if total > 100 {
		t.Errorf("the fleet admitted %.1f/s, over the quota of 100/s", total)
	}
}

// TestMiddleware runs middleware.New over a Client: calls are admitted by
// the assignment's bucket and rejected past it, with no RPC but the one
// stream.
func TestMiddleware(t *testing.T) {
	e := newEnv(t)
	c, n := e.client(t)
	tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 100, Burst: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(c, middleware.Static(tbl))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := middleware.Call{Method: "/svc.v1.Orders/Get"}
	seen := rlqsclient.Received(c)
	if _, err := lim.Admit(ctx, call); err != nil {
		t.Fatalf("first Admit: %v", err)
	}
	wait(t, c, seen)
	// A second of calls, 50 of them, and a report show the server a
	// demand: alone, the process is assigned the quota less the reserve,
	// and a second more fills its bucket. Then the clock stands still: the
	// calls admitted are the assigned burst.
	for range 50 {
		e.clock.Advance(20 * time.Millisecond)
		_, _ = lim.Admit(ctx, call)
	}
	report(t, c)
	e.clock.Advance(time.Second)
	admitted, rejected := 0, 0
	var assigned floodgate.Limit
	for range 200 {
		a, err := lim.Admit(ctx, call)
		if err != nil {
			rejected++
			continue
		}
		d, _ := a.Decision()
		if d.Result.Source != floodgate.SourceLease {
			t.Fatalf("call decided by %v, want lease", d.Result.Source)
		}
		assigned = d.Result.Limit
		admitted++
	}
	t.Logf("assigned %v", assigned)
	if assigned.Rate < 90 || admitted != assigned.Burst || rejected != 200-admitted {
		t.Errorf("admitted %d, rejected %d of 200 under %v; want the burst admitted", admitted, rejected, assigned)
	}
	if got, want := n.unary.Load(), int64(0); got != want {
		t.Errorf("unary RPCs = %d, want %d", got, want)
	}
	if got, want := n.streams.Load(), int64(1); got != want {
		t.Errorf("streams = %d, want %d", got, want)
	}
	// A second later the bucket holds a second of the share.
	e.clock.Advance(time.Second)
	admitted = 0
	for range 200 {
		if _, err := lim.Admit(ctx, call); err == nil {
			admitted++
		}
	}
	if want := min(assigned.Burst, int(assigned.Rate)); admitted != want {
		t.Errorf("a second later, admitted %d under %v, want %d", admitted, assigned, want)
	}
}

func TestExpiry(t *testing.T) {
	e := newEnv(t)
	c, _ := e.client(t)
	ctx := context.Background()
	lim := floodgate.PerSecond(100, 100)
	subscribe(t, c, "acme", lim)
	take := func() floodgate.Result {
		t.Helper()
		res, err := c.TakeN(ctx, "acme", lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := take(); res.Source != floodgate.SourceLease {
		t.Fatalf("TakeN = %+v, want a lease", res)
	}
	// The TTL is 4 s: unreported for 4 s, the key reverts to its limit.
	e.clock.Advance(4 * time.Second)
	if res := take(); res.Source != floodgate.SourceFallback || res.Limit != lim {
		t.Errorf("TakeN after the TTL = %+v, want the fallback under %v", res, lim)
	}
	report(t, c)
	if res := take(); res.Source != floodgate.SourceLease {
		t.Errorf("TakeN after a report = %+v, want a lease again", res)
	}
}

func TestAbandon(t *testing.T) {
	e := newEnv(t, rls.WithIdleAbandon(5*time.Second))
	c, _ := e.client(t)
	lim := floodgate.PerSecond(100, 100)
	subscribe(t, c, "acme", lim)
	// Idle, reported every second: abandoned after 5 s.
	for range 5 {
		e.clock.Advance(time.Second)
		report(t, c)
	}
	seen := rlqsclient.Received(c)
	e.qs.Tick()
	wait(t, c, seen)
	if got := rlqsclient.Subscribed(c); got != 0 {
		t.Fatalf("after an abandon, %d keys held, want 0", got)
	}
	// The next take subscribes the key again.
	if res := subscribe(t, c, "acme", lim); !res.Allowed {
		t.Errorf("TakeN after the abandon = %+v, want allowed", res)
	}
	if _, ok := rlqsclient.Assigned(c, "acme"); !ok {
		t.Error("no assignment after subscribing again")
	}
}

// TestUnreachable: with no server, takes are decided at once by the
// fallback, and Report fails without losing the counts.
func TestUnreachable(t *testing.T) {
	lis := bufconn.Listen(1 << 10)
	lis.Close()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := rlqsclient.New(conn, "svc")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lim := floodgate.PerSecond(1, 3)
	for i := range 4 {
		res, err := c.TakeN(context.Background(), "k", lim, 1)
		if err != nil || res.Allowed != (i < 3) || res.Source != floodgate.SourceFallback {
			t.Errorf("TakeN #%d = %+v, %v; want allowed %v by the fallback", i, res, err, i < 3)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Report(ctx); err == nil {
		t.Error("Report with no server = nil, want an error")
	}
}

func TestNoAssignment(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       func(floodgate.Limit) floodgate.Limit
		allowed int
	}{
		{"default", nil, 3},
		{"allow all", func(floodgate.Limit) floodgate.Limit { return floodgate.Inf }, 10},
		{"deny all", func(floodgate.Limit) floodgate.Limit { return floodgate.Limit{} }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := rlqsclient.New(&grpc.ClientConn{}, "svc", rlqsclient.WithNoAssignment(tc.f), rlqsclient.WithClock(newFakeClock()))
			if tc.f == nil {
				c, err = rlqsclient.New(&grpc.ClientConn{}, "svc", rlqsclient.WithClock(newFakeClock()))
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got := 0
			for range 10 {
				res, err := c.TakeN(context.Background(), "k", floodgate.PerSecond(1, 3), 1)
				if err != nil {
					t.Fatal(err)
				}
				if res.Allowed {
					got++
				} else if res.RetryAfter <= 0 || res.RetryAfter == floodgate.Never {
					t.Errorf("refused with RetryAfter %v, want a finite wait", res.RetryAfter)
				}
			}
			if got != tc.allowed {
				t.Errorf("allowed %d of 10, want %d", got, tc.allowed)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	cc := &grpc.ClientConn{}
	for _, tc := range []struct {
		name   string
		cc     grpc.ClientConnInterface
		domain string
		opt    rlqsclient.Option
	}{
		{"nil conn", nil, "svc", nil},
		{"empty domain", cc, "", nil},
		{"interval", cc, "svc", rlqsclient.WithReportInterval(0)},
		{"bucket id", cc, "svc", rlqsclient.WithBucketID(nil)},
		{"no assignment", cc, "svc", rlqsclient.WithNoAssignment(nil)},
		{"clock", cc, "svc", rlqsclient.WithClock(nil)},
		{"capacity", cc, "svc", rlqsclient.WithCapacity(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := rlqsclient.New(tc.cc, tc.domain, tc.opt); !errors.Is(err, floodgate.ErrInvalidOption) {
				t.Errorf("New = %v, want ErrInvalidOption", err)
			}
		})
	}
}

func TestTakeAllocs(t *testing.T) {
	e := newEnv(t)
	c, _ := e.client(t)
	subscribe(t, c, "acme", perInstance)
	ctx := context.Background()
	if allocs := testing.AllocsPerRun(1000, func() { _, _ = c.TakeN(ctx, "acme", perInstance, 1) }); allocs != 0 {
		t.Errorf("TakeN allocates %v times, want 0", allocs)
	}
}

func TestCloseIdempotent(t *testing.T) {
	e := newEnv(t)
	c, _ := e.client(t)
	subscribe(t, c, "acme", perInstance)
	for range 2 {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Report(context.Background()); !errors.Is(err, rlqsclient.ErrClosed) {
		t.Errorf("Report after Close = %v, want ErrClosed", err)
	}
	if err := c.Run(context.Background()); err != nil {
		t.Errorf("Run after Close = %v, want nil", err)
	}
	if res, err := c.TakeN(context.Background(), "acme", perInstance, 1); err != nil || math.IsNaN(res.Limit.Rate) {
		t.Errorf("TakeN after Close = %v, %v", res, err)
	}
}
