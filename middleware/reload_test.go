package middleware_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// TestRegistryReload: a reload applies at the next call, with no sweep: a
// revoked key stops resolving at once even though its digest is cached, and
// a new limit applies to existing buckets.
func TestRegistryReload(t *testing.T) {
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	l, err := middleware.New(f.store, reg, middleware.WithClock(f.clock))
	if err != nil {
		t.Fatal(err)
	}
	c := call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}
	// Before any config: everyone is anonymous and admitted nothing.
	if ran, d, _, _ := unary(l, c, methodGet); ran || d.Tenant != "" {
		t.Fatalf("empty registry: ran %v", ran)
	}
	reg.Set(testTable(t))
	if ran, d, _, _ := unary(l, c, methodGet); !ran || d.Tenant != "acme" {
		t.Fatalf("after Set: ran %v, tenant %q", ran, d.Tenant)
	}
	// Revoke acme's key: the cached digest no longer resolves.
	revoked, err := tenant.Compile(&tenant.Config{
		Tiers:     map[string]tenant.TierSpec{"gold": {Default: &tenant.LimitSpec{Rate: 10, Burst: 5}}},
		Tenants:   map[string]tenant.TenantSpec{"acme": {Tier: "gold"}},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	reg.Set(revoked)
	if _, d, _, _ := unary(l, c, methodGet); d.Tenant != "" {
		t.Errorf("revoked key still resolves to %q", d.Tenant)
	}
}

// TestAllocations enforces the allocation budget of a call through the
// tap handle and the interceptor, as ServerOptions installs them: one
// object per call, the context the tap handle makes, admitted or
// rejected, whatever the identity, plain or with details.
func TestAllocations(t *testing.T) {
	f := newFixture(t)
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	icpt := f.l.UnaryServerInterceptor()
	open := func(ctx context.Context, _ any) (any, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		c    call
		want float64
	}{
		{"anonymous ipv4", call{addr: "203.0.113.7:1"}, 1},
		{"anonymous ipv6", call{addr: "[2001:db8::1]:1"}, 1},
		{"api key", call{addr: "203.0.113.7:1", md: apiKeyMD(acmeKey)}, 1},
		{"no peer", call{}, 1},
	} {
		ctx, _ := tc.c.context(methodGet)
		got := testing.AllocsPerRun(200, func() {
			f.clock.Advance(1e9) // keep the buckets full
			_, _ = icpt(tapped(f.l, ctx, methodGet, tc.c.md), nil, info, open)
		})
		if got > tc.want {
			t.Errorf("%s: %v allocations per call, want ≤ %v", tc.name, got, tc.want)
		}
	}
	// Connections without an IP address (a Unix socket, an in-memory pipe
	// naming itself by a string) are rejected without allocating too.
	for _, addr := range []net.Addr{&net.TCPAddr{IP: net.IPv4(203, 0, 113, 8), Port: 1}, &net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, pipeAddr("bufconn")} {
		for _, details := range []bool{false, true} {
			rf := newFixture(t, middleware.WithDetails(details))
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
			ctx = grpc.NewContextWithServerTransportStream(ctx, nopStream{})
			ricpt := rf.l.UnaryServerInterceptor()
			for range 3 {
				_, _ = ricpt(ctx, nil, info, open)
			}
			if got := testing.AllocsPerRun(200, func() { _, _ = ricpt(tapped(rf.l, ctx, methodGet, nil), nil, info, open) }); got != 1 {
				t.Errorf("rejection from %v (details %v): %v allocations per call, want 1", addr, details, got)
			}
		}
	}
}

// pipeAddr is an address that names itself by a string, as bufconn's does.
type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

// TestConcurrent runs interceptors, the tap handle and reloads at once,
// for the race detector, and checks the counters add up.
func TestConcurrent(t *testing.T) {
	g, sample := scriptedGate(t)
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	reg.Set(testTable(t))
	f := newFixture(t)
	ty := &tally{}
	l, err := middleware.New(f.store, reg, middleware.WithGate(g), middleware.WithClock(f.clock), ty.option(nil))
	if err != nil {
		t.Fatal(err)
	}
	sample(0.99, f.clock.Now())
	tbl := testTable(t)
	const workers, calls = 4, 300
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := []string{acmeKey, globexKey, "made-up-" + string(rune('a'+w))}
			for i := range calls {
				c := call{addr: "203.0.113." + string(rune('1'+w)) + ":1", md: apiKeyMD(keys[i%len(keys)])}
				unary(l, c, methodGet)
				ctx, _ := c.context(methodGet)
				_, _ = l.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: c.md})
				if i%10 == 0 {
					reg.Set(tbl)
				}
			}
		}()
	}
	wg.Wait()
	// The interceptors' decisions; the tap handle's rejections, also
	// counted in Gate, are in Tap.
	st := ty.counts()
	if got := st.Admitted + st.Quota + st.Gate - st.Tap; got != workers*calls {
		t.Errorf("decisions counted = %d, want %d", got, workers*calls)
	}
}
