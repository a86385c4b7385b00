package middleware_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
)

// events records what the observer is given.
type events struct {
	mu  sync.Mutex
	got []middleware.Event
}

func (r *events) observe(e middleware.Event) {
	r.mu.Lock()
	r.got = append(r.got, e)
	r.mu.Unlock()
}

func (r *events) last(t *testing.T) middleware.Event {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		t.Fatal("no event observed")
	}
	return r.got[len(r.got)-1]
}

type ctxMark struct{}

// ignoreContext compares events without their context, which
// TestEventCarriesContextAndRetry checks.
var ignoreContext = cmpopts.IgnoreFields(middleware.Event{}, "Context")

// eventOpts compares events by what the tests state: without their
// context, a rejection by its exported fields (its status is shared and
// checked where it is sent), and without the decision's rule and call
// limit's result, which the tests of Decision check.
var eventOpts = cmp.Options{
	ignoreContext,
	cmpopts.IgnoreUnexported(middleware.Rejection{}),
	cmpopts.IgnoreFields(middleware.Decision{}, "Rule", "Result"),
}

// A quota rejection's event carries the call's context and the retry delay
// its RetryInfo states.
func TestEventCarriesContextAndRetry(t *testing.T) {
	var rec events
	f := newFixture(t, middleware.WithObserver(rec.observe))
	c := call{addr: "192.0.2.1:1234"}
	for range 2 { // the anonymous burst
		if _, _, _, err := unary(f.l, c, methodGet); err != nil {
			t.Fatal(err)
		}
	}
	if e := rec.last(t); e.Rejection != nil || e.Context == nil || e.Shed || e.Wait != 0 {
		t.Errorf("admitted call's event %+v, want a context and no rejection, shed or wait", e)
	}
	ctx, _ := c.context(methodGet)
	ctx = context.WithValue(ctx, ctxMark{}, "the call's")
	_, err := f.l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, func(context.Context, any) (any, error) {
		t.Error("the handler of a call over quota ran")
		return nil, nil
	})
	if err == nil {
		t.Fatal("a call over the anonymous burst was admitted")
	}
	e := rec.last(t)
	if e.Reason != middleware.ReasonQuota || e.Rejection == nil || e.Rejection.RetryAfter != time.Second {
		t.Errorf("rejection's event: reason %v, rejection %+v; want quota, retry 1s (1/s from empty)", e.Reason, e.Rejection)
	}
	if e.Context == nil || e.Context.Value(ctxMark{}) != "the call's" {
		t.Errorf("rejection's event context %v, want the call's", e.Context)
	}
}

// The overload controller's events say how long an admitted call waited,
// and why a call was shed.
func TestEventCarriesWaitAndShed(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(1, 1), overload.WithQueueTarget(time.Hour), overload.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	store, tbl := openAcme(t)
	var rec events
	l, err := middleware.New(store, middleware.Static(tbl), middleware.WithOverload(ctrl), middleware.WithObserver(rec.observe))
	if err != nil {
		t.Fatal(err)
	}
	acme := call{addr: "192.0.2.1:1234", md: apiKeyMD(acmeKey)}
	hold := func(entered chan<- struct{}, release <-chan struct{}) chan error {
		done := make(chan error, 1)
		go func() {
			ctx, _ := acme.context(methodGet)
			_, err := l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, func(context.Context, any) (any, error) {
				close(entered)
				<-release
				return nil, nil
			})
			done <- err
		}()
		return done
	}
	entered1, release1 := make(chan struct{}), make(chan struct{})
	done1 := hold(entered1, release1)
	<-entered1
	entered2, release2 := make(chan struct{}), make(chan struct{})
	done2 := hold(entered2, release2)
	waitFor(t, func() bool { return ctrl.Snapshot().Queued == 1 }, "the second call to queue")
	// The queue of one slot's controller holds 4 before a call completes:
	// fill it, and the next call of the same flow is shed.
	var queued []chan error
	for range 3 {
		e, r := make(chan struct{}), make(chan struct{})
		close(r)
		queued = append(queued, hold(e, r))
	}
	waitFor(t, func() bool { return ctrl.Snapshot().Queued == 4 }, "the queue to fill")
	ctx, _ := acme.context(methodGet)
	if _, err := l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodGet}, noHandler(t)); err == nil {
		t.Fatal("a call into a full queue was admitted")
	}
	if e := rec.last(t); !e.Shed || e.Cause != overload.ShedQueueFull || e.Reason != middleware.ReasonOverload || e.Rejection == nil || e.Rejection.RetryAfter != ctrl.RetryAfter() {
		t.Errorf("shed call's event %+v, want shed (queue_full) with the controller's retry delay %v", e, ctrl.RetryAfter())
	}
	close(release1)
	<-entered2
	if e := rec.last(t); !e.Allowed || e.Wait <= 0 {
		t.Errorf("event of the call that waited: %+v, want admitted with its wait", e)
	}
	close(release2)
	for _, done := range append(queued, done1, done2) {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func noHandler(t *testing.T) grpc.UnaryHandler {
	return func(context.Context, any) (any, error) {
		t.Error("the handler of a rejected call ran")
		return nil, nil
	}
}
