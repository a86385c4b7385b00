package middleware_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// connCall makes call contexts that share one peer, as the calls of one
// connection do in grpc-go.
type connCall struct {
	p *peer.Peer
}

func newConn(addr string) connCall {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		panic(err)
	}
	return connCall{p: &peer.Peer{Addr: a}}
}

func (c connCall) unary(l *middleware.Limiter, md metadata.MD, method string) (ran bool, d middleware.Decision, err error) {
	ctx := peer.NewContext(context.Background(), c.p)
	if md != nil {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	ctx = grpc.NewContextWithServerTransportStream(ctx, &transportStream{method: method})
	_, err = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, _ any) (any, error) {
		ran = true
		d, _ = middleware.FromContext(ctx)
		return nil, nil
	})
	return ran, d, err
}

// A trusted proxy's connection carries many clients: each call's forwarding
// headers pick the bucket, never a route cached for the connection.
func TestTrustedProxyConnectionNotCached(t *testing.T) {
	f := newFixture(t, middleware.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))
	proxy := newConn("10.0.0.1:4000")
	xff := func(ip string) metadata.MD { return metadata.Pairs("x-forwarded-for", ip) }
	for i, ip := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		for j := range 2 { // anonymous burst 2: both admitted in each client's own bucket
			if ran, _, err := proxy.unary(f.l, xff(ip), methodGet); !ran || err != nil {
				t.Fatalf("client %d call %d: ran %v, err %v; want its own bucket", i, j, ran, err)
			}
		}
	}
	if ran, _, _ := proxy.unary(f.l, xff("198.51.100.1"), methodGet); ran {
		t.Error("third call of client 1 admitted; want its bucket empty")
	}
}

// Calls on one connection share the connection's bucket, whichever string
// holds the method's name.
func TestConnectionSharesBucket(t *testing.T) {
	f := newFixture(t)
	conn := newConn("203.0.113.9:4000")
	other := newConn("203.0.113.10:4000")
	for i := range 2 {
		method := strings.Clone(methodGet)
		if ran, _, err := conn.unary(f.l, nil, method); !ran || err != nil {
			t.Fatalf("call %d: ran %v, err %v", i, ran, err)
		}
	}
	if ran, _, _ := conn.unary(f.l, nil, strings.Clone(methodGet)); ran {
		t.Error("third call admitted; want the connection's bucket of 2 empty")
	}
	if ran, _, _ := other.unary(f.l, nil, methodGet); !ran {
		t.Error("another connection's first call rejected; want its own bucket")
	}
}

// A reload that gives a method its own rule moves the method's calls to the
// new rule at once, for tenants and anonymous callers alike.
func TestReloadChangesCachedRoutes(t *testing.T) {
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	build := func(putLimit *tenant.LimitSpec) *tenant.Table {
		methods := map[string]tenant.MethodSpec{}
		if putLimit != nil {
			methods[methodGet] = tenant.MethodSpec{Limit: putLimit}
		}
		tbl, err := tenant.Compile(&tenant.Config{
			Tiers:     map[string]tenant.TierSpec{"gold": {Default: &tenant.LimitSpec{Rate: 10, Burst: 5}, Methods: methods}},
			Tenants:   map[string]tenant.TenantSpec{"acme": {Tier: "gold", Keys: []string{hashKey(t, acmeKey)}}},
			Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 2}, Methods: methods},
		})
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}
	reg.Set(build(nil))
	c := newClock()
	f := newFixture(t)
	l, err := middleware.New(f.store, reg, middleware.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	conn := newConn("203.0.113.11:4000")
	for _, md := range []metadata.MD{nil, apiKeyMD(acmeKey)} {
		_, d, err := conn.unary(l, md, methodGet)
		if err != nil || d.Rule.Pattern != "default" {
			t.Fatalf("before reload (key %v): rule %q, err %v; want default", md, d.Rule.Pattern, err)
		}
	}
	reg.Set(build(&tenant.LimitSpec{Rate: 3, Burst: 3}))
	for _, md := range []metadata.MD{nil, apiKeyMD(acmeKey)} {
		_, d, err := conn.unary(l, md, methodGet)
		if err != nil || d.Rule.Pattern != methodGet || d.Rule.Limit.Burst != 3 {
			t.Errorf("after reload (key %v): rule %+v, err %v; want the method's own rule", md, d.Rule, err)
		}
	}
}

// Keys that end alike each resolve their own tenant through the key cache,
// and a revoked key stops resolving.
func TestAPIKeysEndingAlike(t *testing.T) {
	keys := map[string]string{"acme": "acme-0123456789abcdef", "umbrella": "umbr-0123456789abcdef"}
	cfg := func(revoke string) *tenant.Table {
		tenants := map[string]tenant.TenantSpec{}
		for id, k := range keys {
			spec := tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000}}
			if id != revoke {
				spec.Keys = []string{hashKey(t, k)}
			}
			tenants[id] = spec
		}
		tbl, err := tenant.Compile(&tenant.Config{Tenants: tenants, Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1000, Burst: 1000}}})
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	reg.Set(cfg(""))
	f := newFixture(t)
	l, err := middleware.New(f.store, reg)
	if err != nil {
		t.Fatal(err)
	}
	conn := newConn("203.0.113.12:4000")
	for i := range 6 {
		for id, k := range keys {
			if _, d, err := conn.unary(l, apiKeyMD(k), methodGet); err != nil || d.Tenant != id {
				t.Fatalf("round %d, key of %s: tenant %q, err %v", i, id, d.Tenant, err)
			}
		}
	}
	reg.Set(cfg("umbrella"))
	if _, d, _ := conn.unary(l, apiKeyMD(keys["umbrella"]), methodGet); d.Tenant != "" {
		t.Errorf("revoked key resolves to %q, want anonymous", d.Tenant)
	}
	if _, d, _ := conn.unary(l, apiKeyMD(keys["acme"]), methodGet); d.Tenant != "acme" {
		t.Errorf("acme's key resolves to %q after the reload, want acme", d.Tenant)
	}
}

// More connections than the route cache holds: routes replace each other,
// and every connection still keeps to its own bucket.
func TestManyConnections(t *testing.T) {
	f := newFixture(t)
	conns := make([]connCall, 10000)
	for i := range conns {
		conns[i] = connCall{p: &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)), Port: 1}}}
	}
	for round := range 3 { // anonymous burst 2: the third call is over quota
		for i, c := range conns {
			if ran, _, _ := c.unary(f.l, nil, methodGet); ran != (round < 2) {
				t.Fatalf("round %d, connection %d: ran %v", round, i, ran)
			}
		}
	}
}
