package middleware_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// blocker holds the handlers of calls that carry "block" metadata until
// the test releases them, so that a test decides how long the server is
// busy.
type blocker struct{ release chan struct{} }

func (b *blocker) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("block")) > 0 {
		select {
		case <-b.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return h(ctx, req)
}

// openAcme returns an in-memory store and a table in which acme (acmeKey)
// has no quota: only the overload controller sheds its calls.
func openAcme(t *testing.T) (*keyed.Map, *tenant.Table) {
	t.Helper()
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers:   map[string]tenant.TierSpec{"open": {Default: &tenant.LimitSpec{Rate: math.Inf(1)}}},
		Tenants: map[string]tenant.TenantSpec{"acme": {Tier: "open", Keys: []string{hashKey(t, acmeKey)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return store, tbl
}

// A noisy tenant holds every slot and fills the queue; a quiet tenant's
// call still gets the next slot, over a real listener, and the noisy
// tenant's extra calls are shed with the overload status and a retry
// delay.
func TestOverloadShedsTheNoisyTenantFirst(t *testing.T) {
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{"open": {Default: &tenant.LimitSpec{Rate: math.Inf(1)}}},
		Tenants: map[string]tenant.TenantSpec{
			"acme":   {Tier: "open", Keys: []string{hashKey(t, acmeKey)}},
			"globex": {Tier: "open", Keys: []string{hashKey(t, globexKey)}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The limit is pinned at 4, so that a busy machine's latencies do not
	// move it while the test counts slots. Before any call completes, the
	// controller lets four calls a slot wait: 16. A queue target of a
	// second keeps a slow machine's scheduling from timing out a call
	// the test is about to release.
	ctrl, err := overload.New(overload.WithLimits(4, 4), overload.WithQueueTarget(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	subjects := map[string]int{}
	ty := &tally{}
	l, err := middleware.New(store, middleware.Static(tbl), middleware.WithOverload(ctrl),
		ty.option(func(e middleware.Event) {
			if e.Allowed || e.DryRun {
				return
			}
			mu.Lock()
			subjects[strings.Clone(e.Subject)]++
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	b := &blocker{release: make(chan struct{})}
	cc, e := serve(t, networks[1], []grpc.ServerOption{
		grpc.InTapHandle(l.TapHandle),
		grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor(), b.interceptor),
	})
	acme := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", acmeKey)
	globex := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", globexKey)
	blocking := metadata.AppendToOutgoingContext(globex, "block", "1")

	const n = 4 + 16
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- invoke(blocking, cc) }()
		want := min(i+1, 4)
		waitFor(t, func() bool {
			s := ctrl.Snapshot()
			return s.Inflight == want && s.Inflight+s.Queued == i+1
		}, "globex's calls to take the slots, then queue")
	}
	// The server holds all it can: globex's next call is shed at the tap,
	// with the overload status and its details.
	err = invoke(globex, cc)
	s, _ := status.FromError(err)
	if s.Code() != codes.Unavailable {
		t.Fatalf("globex over its share: %v, want UNAVAILABLE", err)
	}
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range s.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	if info == nil || info.Reason != middleware.ReasonOverload.ErrorReason() || retry == nil || retry.RetryDelay.AsDuration() <= 0 {
		t.Errorf("details %v, want ErrorInfo %s and a RetryInfo", s.Details(), middleware.ReasonOverload.ErrorReason())
	}
	// Turned away at the tap: the controller counts it as its own.
	if snap := ctrl.Snapshot(); snap.ShedBy(overload.ShedTap) != 1 || ty.counts().Tap != 1 {
		t.Errorf("tap sheds: controller %d, limiter %d, want 1 and 1", snap.ShedBy(overload.ShedTap), ty.counts().Tap)
	}

	// acme, under its share, displaces globex's oldest waiting call and
	// gets the next slot.
	acmeDone := make(chan error, 1)
	go func() { acmeDone <- invoke(acme, cc) }()
	if err := <-errs; status.Code(err) != codes.Unavailable {
		t.Fatalf("globex's displaced call: %v, want UNAVAILABLE", err)
	}
	waitFor(t, func() bool { return ctrl.Snapshot().Queued == n-4 }, "acme's call to wait in the place of globex's")
	ran := e.calls.Load()
	b.release <- struct{}{}
	if err := <-acmeDone; err != nil {
		t.Fatalf("acme under its share: %v", err)
	}
	if e.calls.Load() < ran+1 {
		t.Error("acme's call did not run")
	}
	// Let globex's other calls finish.
	for range n - 2 {
		b.release <- struct{}{}
	}
	for range n - 2 {
		if err := <-errs; err != nil {
			t.Errorf("globex's waiting call: %v", err)
		}
	}
	st := ty.counts()
	if st.Shed+st.Tap < 2 || st.Overload != st.Shed+st.Tap {
		t.Errorf("counts() = %+v, want the two shed calls counted, as overload rejections", st)
	}
	// Both sheds, at the tap and in the interceptor, are charged to the
	// tenant, for the offenders list.
	mu.Lock()
	if subjects["t:globex"] != 2 || len(subjects) != 1 {
		t.Errorf("rejected subjects %v, want t:globex twice", subjects)
	}
	mu.Unlock()
	// A client has its reply before the server's interceptor returns.
	waitFor(t, func() bool {
		snap := ctrl.Snapshot()
		return snap.Inflight == 0 && snap.Queued == 0 && snap.Inside == 0
	}, "every slot and place to come back")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// The tap handle counts every call into the overload controller, but turns
// away only the calls of a method the unary interceptor has seen: a
// method it does not know may be a stream's, which the controller does not
// hold. So from the server's first call on, a stream is never turned away
// at the tap, and once the stream interceptor has seen its method, its
// calls are no longer counted in.
func TestTapShedsKnownUnaryMethods(t *testing.T) {
	// One slot and, until the controller's first control step, a queue of
	// 4: five places.
	ctrl, err := overload.New(overload.WithLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	store, tbl := openAcme(t)
	l, err := middleware.New(store, middleware.Static(tbl), middleware.WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	md := metadata.Pairs("x-api-key", acmeKey)
	var cancels []context.CancelFunc
	t.Cleanup(func() {
		for _, cancel := range cancels {
			cancel()
		}
	})
	tapped := func(method string) (context.Context, error) {
		ctx, cancel := context.WithCancel(benchCtx(md))
		cancels = append(cancels, cancel)
		return l.TapHandle(ctx, &tap.Info{FullMethodName: method, Header: md})
	}
	inside := func() int { return ctrl.Snapshot().Inside }

	// The server's first call, of a method the tap does not know yet:
	// counted in at the tap, held by the interceptor.
	ctx, err := tapped(methodGet)
	if err != nil || inside() != 1 {
		t.Fatalf("tap of a new method: err %v, inside %d; want nil and 1", err, inside())
	}
	during := -1
	_, err = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet},
		func(context.Context, any) (any, error) { during = inside(); return nil, nil })
	if err != nil || during != 1 || inside() != 0 {
		t.Fatalf("first unary call: err %v, inside while it ran %d, after %d; want nil, 1, 0", err, during, inside())
	}

	// Known now: the tap turns acme away once the server holds all it
	// can run and queue, all of it acme's.
	shed := false
	for range 10 {
		if _, err := tapped(methodGet); err != nil {
			shed = true
			break
		}
	}
	if !shed || inside() != 5 {
		t.Fatalf("tap of a known unary method: shed %v with %d inside; want shed at 5", shed, inside())
	}

	// A stream while the server is full: counted in, not turned away; the
	// stream interceptor gives its place back at once.
	sctx, err := tapped(methodStream)
	if err != nil || inside() != 6 {
		t.Fatalf("tap of a new method while the server is full: err %v, inside %d; want nil and 6", err, inside())
	}
	during = -1
	err = l.StreamServerInterceptor()(nil, &serverStream{ctx: sctx}, &grpc.StreamServerInfo{FullMethod: methodStream},
		func(any, grpc.ServerStream) error { during = inside(); return nil })
	if err != nil || during != 5 {
		t.Errorf("stream: err %v, inside while it ran %d; want nil and 5", err, during)
	}
	// The stream method is known now: its calls are not counted in.
	if _, err := tapped(methodStream); err != nil || inside() != 5 {
		t.Errorf("the method's second stream: err %v, inside %d; want nil and 5", err, inside())
	}
	if s := ctrl.Snapshot(); s.Untapped != 0 {
		t.Errorf("untapped = %d, want 0: every call went through the tap", s.Untapped)
	}
	// The calls that never reached an interceptor give their places back
	// when their contexts end.
	for _, cancel := range cancels {
		cancel()
	}
	waitFor(t, func() bool { return inside() == 0 }, "every place to come back")
}
