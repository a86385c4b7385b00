package middleware_test

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// priorities records the priority each call was admitted at.
type priorities struct {
	mu   sync.Mutex
	seen []floodgate.Priority
}

func (p *priorities) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	d, _ := middleware.FromContext(ctx)
	p.mu.Lock()
	p.seen = append(p.seen, d.Priority)
	p.mu.Unlock()
	return h(ctx, req)
}

func (p *priorities) last() floodgate.Priority {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		return floodgate.Priority(99)
	}
	return p.seen[len(p.seen)-1]
}

// openLimiter admits every caller without limit, at the default priority
// unless a trusted caller names another.
func openLimiter(t *testing.T, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: math.Inf(1)}}})
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := middleware.New(store, middleware.Static(tbl), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A two-hop chain over loopback: the front admits a critical and a
// sheddable tenant and calls the back for each with PropagatePriority; the
// back, trusting the front's address, admits each call at its tenant's
// priority. A back that trusts no one keeps its own.
func TestPriorityPropagates(t *testing.T) {
	for _, trust := range []bool{true, false} {
		var backOpts []middleware.Option
		if trust {
			backOpts = append(backOpts, middleware.WithPriorityFromPeers(netip.MustParsePrefix("127.0.0.0/8")))
		}
		var back priorities
		backLim := openLimiter(t, backOpts...)
		backCC, _ := serve(t, tcp(t), append(backLim.ServerOptions(), grpc.ChainUnaryInterceptor(back.interceptor)))

		tbl, err := tenant.Compile(&tenant.Config{
			Tenants: map[string]tenant.TenantSpec{
				"vip":  {Keys: []string{hashKey(t, acmeKey)}, Default: &tenant.LimitSpec{Rate: math.Inf(1)}, Priority: "critical"},
				"bulk": {Keys: []string{hashKey(t, globexKey)}, Default: &tenant.LimitSpec{Rate: math.Inf(1)}, Priority: "sheddable"},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		store, err := keyed.New()
		if err != nil {
			t.Fatal(err)
		}
		frontLim, err := middleware.New(store, middleware.Static(tbl), middleware.WithAPIKeyHeaders("x-api-key"))
		if err != nil {
			t.Fatal(err)
		}
		// The front's client to the back, as a handler would use it.
		down, err := grpc.NewClient(backCC.Target(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, middleware.PropagatePriority()...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { down.Close() })
		var front priorities
		callBack := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-explicit")) > 0 {
				// The handler names the downstream call's priority itself.
				ctx = metadata.AppendToOutgoingContext(ctx, middleware.PriorityHeader, "sheddable")
			}
			if err := invoke(ctx, down); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}
		frontCC, _ := serve(t, tcp(t), append(frontLim.ServerOptions(), grpc.ChainUnaryInterceptor(front.interceptor, callBack)))

		for _, tc := range []struct {
			key            string
			explicit       bool
			want, wantBack floodgate.Priority
		}{
			{acmeKey, false, floodgate.Critical, floodgate.Critical},
			{globexKey, false, floodgate.Sheddable, floodgate.Sheddable},
			{acmeKey, true, floodgate.Critical, floodgate.Sheddable},
		} {
			ctx := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", tc.key)
			if tc.explicit {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-explicit", "1")
			}
			if err := invoke(ctx, frontCC); err != nil {
				t.Fatal(err)
			}
			if got := front.last(); got != tc.want {
				t.Errorf("front admitted at %v, want %v", got, tc.want)
			}
			want := tc.wantBack
			if !trust {
				want = floodgate.Default
			}
			if got := back.last(); got != want {
				t.Errorf("trust %v: back admitted at %v, want %v", trust, got, want)
			}
		}
	}
}

// A header the server cannot trust, or cannot read as one priority, is
// ignored; a trusted tenant's is honoured.
func TestPriorityHeaderIsNotGuessedAt(t *testing.T) {
	var seen priorities
	l := openLimiter(t, middleware.WithPriorityFromPeers(netip.MustParsePrefix("127.0.0.0/8")))
	cc, _ := serve(t, tcp(t), append(l.ServerOptions(), grpc.ChainUnaryInterceptor(seen.interceptor)))
	for _, tc := range []struct {
		md   metadata.MD
		want floodgate.Priority
	}{
		{metadata.Pairs(middleware.PriorityHeader, "critical"), floodgate.Critical},
		{metadata.Pairs(middleware.PriorityHeader, "sheddable"), floodgate.Sheddable},
		{metadata.Pairs(middleware.PriorityHeader, "urgent"), floodgate.Default},
		{metadata.Pairs(middleware.PriorityHeader, "CRITICAL"), floodgate.Default},
		{metadata.Pairs(middleware.PriorityHeader, "critical", middleware.PriorityHeader, "sheddable"), floodgate.Default},
		{nil, floodgate.Default},
	} {
		if err := invoke(metadata.NewOutgoingContext(t.Context(), tc.md), cc); err != nil {
			t.Fatal(err)
		}
		if got := seen.last(); got != tc.want {
			t.Errorf("metadata %v: admitted at %v, want %v", tc.md, got, tc.want)
		}
	}

	// Trust by tenant: only the named tenant's header counts.
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{
			"front": {Keys: []string{hashKey(t, acmeKey)}, Default: &tenant.LimitSpec{Rate: math.Inf(1)}},
			"other": {Keys: []string{hashKey(t, globexKey)}, Default: &tenant.LimitSpec{Rate: math.Inf(1)}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	byTenant, err := middleware.New(store, middleware.Static(tbl), middleware.WithAPIKeyHeaders("x-api-key"), middleware.WithPriorityFromTenants("front"))
	if err != nil {
		t.Fatal(err)
	}
	var seen2 priorities
	cc2, _ := serve(t, tcp(t), append(byTenant.ServerOptions(), grpc.ChainUnaryInterceptor(seen2.interceptor)))
	for key, want := range map[string]floodgate.Priority{acmeKey: floodgate.Critical, globexKey: floodgate.Default} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", key, middleware.PriorityHeader, "critical")
		if err := invoke(ctx, cc2); err != nil {
			t.Fatal(err)
		}
		if got := seen2.last(); got != want {
			t.Errorf("key %s: admitted at %v, want %v", key, got, want)
		}
	}

	for _, opt := range []middleware.Option{middleware.WithPriorityFromPeers(netip.Prefix{}), middleware.WithPriorityFromTenants("")} {
		if _, err := middleware.New(store, middleware.Static(tbl), opt); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("New with an invalid trust: %v, want ErrInvalidOption", err)
		}
	}
}
