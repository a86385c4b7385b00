package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// refusing is a store that refuses every take with the same RetryAfter.
func refusing(retry time.Duration) floodgate.Store {
	return sourceStore{floodgate.Result{RetryAfter: retry}}
}

// TestInvalidOptionsWrapErrInvalidOption: option errors wrap
// floodgate.ErrInvalidOption, as documented, so that errors.Is finds it.
func TestInvalidOptionsWrapErrInvalidOption(t *testing.T) {
	_, err := middleware.New(nil, nil)
	if err == nil || !errors.Is(err, floodgate.ErrInvalidOption) {
		t.Errorf("New(nil, nil) = %v; errors.Is(ErrInvalidOption) = false", err)
	}
}

// TestPushbackRoundedWithinDeadlineAndCap: the deadline and the cap are
// checked against the pushback as the grid rounds it up: grpc-go sleeps for
// the pushback without checking the deadline.
func TestPushbackRoundedWithinDeadlineAndCap(t *testing.T) {
	tbl := testTable(t)
	for _, tc := range []struct {
		name     string
		retry    time.Duration
		deadline time.Duration
		opts     []middleware.Option
	}{
		{name: "deadline, seconds grid", retry: 10_100 * time.Millisecond, deadline: 10_600 * time.Millisecond},
		{name: "deadline, 10ms grid", retry: 1_001 * time.Millisecond, deadline: 1_008 * time.Millisecond},
		{name: "cap", retry: 10_100 * time.Millisecond, opts: []middleware.Option{middleware.WithMaxPushback(10_500 * time.Millisecond)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := middleware.New(refusing(tc.retry), middleware.Static(tbl), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, ts := anon.context(methodGet)
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			_, err = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop)
			if err == nil {
				t.Fatal("admitted")
			}
			got := ts.trailer.Get(pushbackKey)
			if len(got) != 1 || got[0] != "-1" {
				t.Errorf("pushback %q asks for more than the deadline / cap allows; want -1", got)
			}
		})
	}
}

// TestLimitNeedsServerContext: Limit refuses a context that is not a
// server call's (the ratelimit package's client interceptors pass one)
// rather than judge every such call as one anonymous caller.
func TestLimitNeedsServerContext(t *testing.T) {
	var events int
	f := newFixture(t, middleware.WithObserver(func(middleware.Event) { events++ }))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", acmeKey)
	if err := f.l.Limit(ctx); err == nil || !strings.Contains(err.Error(), "server call") {
		t.Errorf("Limit(client context) = %v, want the error that it needs a server call's context", err)
	}
	if events != 0 {
		t.Errorf("%d decisions observed, want none", events)
	}
}

// TestPushbackWithinOffGridCap: a cap off the pushback grid is rounded down
// to it, so a wait within the rounded cap asks for no more than the cap and
// a wait between the two is told not to retry.
func TestPushbackWithinOffGridCap(t *testing.T) {
	tbl := testTable(t)
	for _, tc := range []struct {
		retry time.Duration
		want  string
	}{
		{995 * time.Millisecond, "995"},
		{1_001 * time.Millisecond, "-1"}, // would round up to 1010 ms, past 1005 ms
	} {
		l, err := middleware.New(refusing(tc.retry), middleware.Static(tbl), middleware.WithMaxPushback(1_005*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, ts := anon.context(methodGet)
		if _, err := l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop); err == nil {
			t.Fatal("admitted")
		}
		if got := ts.trailer.Get(pushbackKey); len(got) != 1 || got[0] != tc.want {
			t.Errorf("wait %v under a 1005 ms cap: pushback %q, want %s", tc.retry, got, tc.want)
		}
	}
}

// TestRetryInfoBeyondTheCap: a wait past the pushback cap keeps its
// RetryInfo with the true wait; only the trailer says not to retry.
func TestRetryInfoBeyondTheCap(t *testing.T) {
	tbl := testTable(t)
	for _, tc := range []struct {
		retry, want time.Duration
	}{
		{45 * time.Second, 45 * time.Second},                                                      // past the default 30 s cap
		{59*time.Minute + 30*time.Second + 500*time.Millisecond, 59*time.Minute + 31*time.Second}, // the shared grid's seconds
		{2*time.Hour + 300*time.Millisecond, 2*time.Hour + time.Second},                           // past the grid: rounded up
	} {
		l, err := middleware.New(refusing(tc.retry), middleware.Static(tbl))
		if err != nil {
			t.Fatal(err)
		}
		ctx, ts := anon.context(methodGet)
		_, err = l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop)
		if err == nil {
			t.Fatal("admitted")
		}
		if got := ts.trailer.Get(pushbackKey); len(got) != 1 || got[0] != "-1" {
			t.Errorf("wait %v: pushback %q, want -1", tc.retry, got)
		}
		var retry *errdetails.RetryInfo
		for _, d := range status.Convert(err).Details() {
			if r, ok := d.(*errdetails.RetryInfo); ok {
				retry = r
			}
		}
		if retry == nil {
			t.Errorf("wait %v: no RetryInfo", tc.retry)
			continue
		}
		if got := retry.GetRetryDelay().AsDuration(); got != tc.want {
			t.Errorf("wait %v: RetryInfo %v, want the wait rounded up (%v)", tc.retry, got, tc.want)
		}
	}
}

// TestCostAboveScaledBurst: when the gate scales a burst below a method's
// cost, the store's ErrExceedsBurst is a refusal under overload, not a
// store failure that the default fail-open policy would admit.
func TestCostAboveScaledBurst(t *testing.T) {
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{"gold": {
			Default: &tenant.LimitSpec{Rate: 10, Burst: 10},
			Methods: map[string]tenant.MethodSpec{methodPut: {Cost: 5}},
		}},
		Tenants: map[string]tenant.TenantSpec{"acme": {Tier: "gold", Keys: []string{hashKey(t, acmeKey)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	g, sample := scriptedGate(t)
	store, _ := keyed.New()
	ty := &tally{}
	l, err := middleware.New(store, middleware.Static(tbl), middleware.WithGate(g), ty.option(nil))
	if err != nil {
		t.Fatal(err)
	}
	sample(0.95, time.Now()) // burst 10 × 0.2 = 2, below the cost of 5
	ran, _, _, err := unary(l, call{addr: "203.0.113.7:5000", md: apiKeyMD(acmeKey)}, methodPut)
	if ran || status.Code(err) != codes.Unavailable {
		t.Errorf("cost 5 over a scaled burst of 2: ran %v, %v, want an overload rejection", ran, err)
	}
	if st := ty.counts(); st.StoreErrors != 0 || st.Gate != 1 {
		t.Errorf("counts() = %+v, want 1 gate refusal and no store error", st)
	}
}
