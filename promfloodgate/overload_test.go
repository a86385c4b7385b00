package promfloodgate

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
)

// The overload controller's signals are gauges, and its sheds are counted
// by cause and, through the observer, as overload decisions.
func TestOverloadMetrics(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(1, 1), overload.WithQueueTarget(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(WithMethods(methodGet), WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithOverload(ctrl), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	// A call holds the only slot; the next one waits its millisecond and
	// is shed.
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := icpt(callCtx(proKey), nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, func(context.Context, any) (any, error) {
			close(entered)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-entered
	_, err = icpt(callCtx(proKey), nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop)
	if err == nil {
		t.Fatal("the second call was not shed")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	want := `
# HELP floodgate_overload_inflight Calls holding one of the overload controller's slots.
# TYPE floodgate_overload_inflight gauge
floodgate_overload_inflight 0
# HELP floodgate_overload_limit The overload controller's concurrency limit: calls it lets run at once.
# TYPE floodgate_overload_limit gauge
floodgate_overload_limit 1
# HELP floodgate_overload_shed_total Calls the overload controller shed, by cause (queue_full, displaced, wait_timeout, deadline, tap).
# TYPE floodgate_overload_shed_total counter
floodgate_overload_shed_total{cause="deadline"} 0
floodgate_overload_shed_total{cause="displaced"} 0
floodgate_overload_shed_total{cause="queue_full"} 0
floodgate_overload_shed_total{cause="tap"} 0
floodgate_overload_shed_total{cause="wait_timeout"} 1
# HELP floodgate_overload_state 1 for the overload controller's current state (open, shedding), 0 for the other.
# TYPE floodgate_overload_state gauge
floodgate_overload_state{state="open"} 0
floodgate_overload_state{state="shedding"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"floodgate_overload_inflight", "floodgate_overload_limit", "floodgate_overload_shed_total", "floodgate_overload_state"); err != nil {
		t.Error(err)
	}
	decisions := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="Unavailable",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="overload",source="memory",stage="interceptor",tier="pro"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(decisions), "floodgate_decisions_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "floodgate_overload_latency_seconds", "floodgate_overload_baseline_seconds",
		"floodgate_overload_admitted_total", "floodgate_overload_queued", "floodgate_overload_queue_cap", "floodgate_overload_wait_seconds",
		"floodgate_overload_queue_target_seconds", "floodgate_overload_throughput", "floodgate_overload_untapped_total"); n != 1+1+2+1+1+1+1+1+1 {
		t.Errorf("%d series of the other overload metrics, want 10", n)
	}
}

// TestOverloadUntapped: a call that reaches the controller without the tap
// handle counting it in moves floodgate_overload_untapped_total; one the
// tap handle counted does not.
func TestOverloadUntapped(t *testing.T) {
	ctrl, err := overload.New(overload.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	untapped := func(want string) {
		t.Helper()
		exp := `
# HELP floodgate_overload_untapped_total Calls that reached the overload controller without the tap handle counting them as they entered: a server wired without the tap handle, whose calls can queue where the controller cannot bound them. It should stay 0.
# TYPE floodgate_overload_untapped_total counter
floodgate_overload_untapped_total ` + want + "\n"
		if err := testutil.CollectAndCompare(c, strings.NewReader(exp), "floodgate_overload_untapped_total"); err != nil {
			t.Error(err)
		}
	}
	untapped("0")
	icpt := lim.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	// Through the tap handle first, as a server built with
	// Limiter.ServerOptions calls it.
	ctx := callCtx(proKey)
	md, _ := metadata.FromIncomingContext(ctx)
	ctx, err = lim.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: md})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := icpt(ctx, nil, info, noop); err != nil {
		t.Fatal(err)
	}
	untapped("0")
	// The interceptor alone: a server without the tap handle.
	if _, err := icpt(callCtx(proKey), nil, info, noop); err != nil {
		t.Fatal(err)
	}
	untapped("1")
}

// TestTapRejections: the tap handle's rejections, of the caller it
// resolved, count in floodgate_tap_rejections_total and in the decisions
// at stage tap, and feed the offenders by subject.
func TestTapRejections(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(1, 1), overload.WithQueueTarget(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewOffenders()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(WithMethods(methodGet), WithOffenders(f))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithOverload(ctrl), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	enter := func() (context.Context, error) {
		ctx, cancel := context.WithCancel(callCtx(proKey))
		t.Cleanup(cancel) // gives the call's place back
		md, _ := metadata.FromIncomingContext(ctx)
		return lim.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: md})
	}
	// One call runs through, so that the tap knows the caller's key.
	ctx, err := enter()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noop); err != nil {
		t.Fatal(err)
	}
	// Calls that enter and never end fill the server's places.
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatal("the tap handle admitted 100 calls to a controller of limit 1")
		}
		if _, err := enter(); err != nil {
			break
		}
	}
	want := `
# HELP floodgate_decisions_total Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.
# TYPE floodgate_decisions_total counter
floodgate_decisions_total{code="OK",method="/inventory.v1.Inventory/Get",outcome="admitted",reason="admitted",source="memory",stage="interceptor",tier="pro"} 1
floodgate_decisions_total{code="Unavailable",method="/inventory.v1.Inventory/Get",outcome="rejected",reason="overload",source="none",stage="tap",tier="pro"} 1
# HELP floodgate_tap_rejections_total Calls rejected by the tap handle before their request was read.
# TYPE floodgate_tap_rejections_total counter
floodgate_tap_rejections_total 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_decisions_total", "floodgate_tap_rejections_total"); err != nil {
		t.Error(err)
	}
	if got, want := f.Top(0), []Offender{{Key: "t:p", Rejections: 1}}; !cmp.Equal(got, want) {
		t.Errorf("offenders %v, want %v", got, want)
	}
}
