package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
)

// A call through Admit and a call through the interceptor take from the
// same bucket: a tenant's HTTP and gRPC calls share its quota.
func TestAdmitSharesBucketsWithTheInterceptor(t *testing.T) {
	f := newFixture(t)
	c := middleware.Call{
		Method: methodGet,
		Addr:   netip.MustParseAddr("203.0.113.7"),
		Header: http.Header{"X-Api-Key": {acmeKey}},
	}
	// acme's burst is 5: three through Admit, two through the interceptor.
	for i := range 3 {
		a, err := f.l.Admit(t.Context(), c)
		if err != nil {
			t.Fatalf("Admit #%d: %v", i, err)
		}
		d, ok := middleware.FromContext(a.Context())
		if !ok || !d.Allowed || d.Tenant != "acme" || d.Result.Remaining != 4-i {
			t.Errorf("Admit #%d: FromContext = %+v, %v, want acme admitted with %d left", i, d, ok, 4-i)
		}
		if got, _ := a.Decision(); got != d {
			t.Errorf("Admit #%d: Decision() = %+v, want the context's %+v", i, got, d)
		}
		a.Done()
	}
	for i := range 2 {
		if ran, _, _, err := unary(f.l, call{addr: "198.51.100.1:1", md: apiKeyMD(acmeKey)}, methodGet); !ran || err != nil {
			t.Fatalf("interceptor call #%d: ran %v, %v", i, ran, err)
		}
	}
	a, err := f.l.Admit(t.Context(), c)
	if got, want := status.Code(err), codes.ResourceExhausted; got != want {
		t.Fatalf("Admit over quota: %v, want %v", err, want)
	}
	d, ok := a.Decision()
	if !ok || d.Allowed || d.Reason != middleware.ReasonQuota || d.Result.Limit.Burst != 5 {
		t.Errorf("Decision() = %+v, %v, want a quota rejection under burst 5", d, ok)
	}
	var rej *middleware.Rejection
	if !errors.As(err, &rej) {
		t.Fatalf("Admit over quota: %v, want a *Rejection", err)
	}
	if got, want := rej.RetryAfter, 100*time.Millisecond; got != want {
		t.Errorf("Rejection.RetryAfter = %v, want %v (10/s)", got, want)
	}
	if _, ok := middleware.FromContext(a.Context()); ok {
		t.Error("a rejected call's context carries a decision")
	}
	if ran, _, ts, _ := unary(f.l, call{addr: "198.51.100.1:1", md: apiKeyMD(acmeKey)}, methodGet); ran || len(ts.trailer[pushbackKey]) != 1 {
		t.Errorf("interceptor after Admit drained the bucket: ran %v, trailer %v", ran, ts.trailer)
	}
	if st := f.tally.counts(); st.Admitted != 5 || st.Quota != 2 {
		t.Errorf("counts() = %+v, want 5 admitted and 2 over quota", st)
	}
}

func TestAdmitExemptAndAnonymous(t *testing.T) {
	f := newFixture(t)
	a, err := f.l.Admit(t.Context(), middleware.Call{Method: "/grpc.health.v1.Health/Check"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Decision(); ok || a.Context() != t.Context() {
		t.Error("an exempt call has a decision")
	}
	a.Done()
	// Neither headers nor an address: the anonymous bucket of callers
	// without one (burst 2).
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		a, err := f.l.Admit(t.Context(), middleware.Call{Method: methodGet})
		if got := status.Code(err); got != want {
			t.Fatalf("anonymous call #%d: %v, want %v", i, err, want)
		}
		if d, _ := a.Decision(); d.Tenant != "" {
			t.Errorf("anonymous call #%d: tenant %q", i, d.Tenant)
		}
	}
	if st := f.tally.counts(); st.Exempt != 1 {
		t.Errorf("counts().Exempt = %d, want 1", st.Exempt)
	}
}

// With an overload controller, an admitted call holds a slot until Done;
// a call that finds none is shed with the overload status and the
// controller's retry delay.
func TestAdmitHoldsTheControllersSlotUntilDone(t *testing.T) {
	clk := newClock()
	ctrl, err := overload.New(overload.WithClock(clk), overload.WithQueueTarget(time.Millisecond/2), overload.WithRetryAfter(3*time.Second),
		overload.WithLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, middleware.WithOverload(ctrl))
	c := middleware.Call{Method: methodGet, Header: http.Header{"Authorization": {"Bearer " + acmeKey}}}
	held, err := f.l.Admit(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	shed, err := f.l.Admit(t.Context(), c)
	if got, want := status.Code(err), codes.Unavailable; got != want {
		t.Fatalf("Admit while the slot is held: %v, want %v", err, want)
	}
	if d, _ := shed.Decision(); d.Allowed || d.Reason != middleware.ReasonOverload || d.Tenant != "acme" {
		t.Errorf("shed call's Decision() = %+v, want acme shed for overload", d)
	}
	var rej *middleware.Rejection
	if !errors.As(err, &rej) {
		t.Fatalf("Admit while the slot is held: %v, want a *Rejection", err)
	}
	if got, want := rej.RetryAfter, 3*time.Second; got != want {
		t.Errorf("shed call's Rejection.RetryAfter = %v, want %v", got, want)
	}
	shed.Done() // holds nothing: a no-op
	held.Done()
	again, err := f.l.Admit(t.Context(), c)
	if err != nil {
		t.Fatalf("Admit after Done: %v", err)
	}
	again.Done()
	if s := ctrl.Snapshot(); s.Inflight != 0 {
		t.Errorf("controller in flight after every Done: %d", s.Inflight)
	}
	if st := f.tally.counts(); st.Admitted != 3 || st.Shed != 1 || st.Overload != 1 || st.Tap != 0 {
		t.Errorf("counts() = %+v, want 3 admitted by their quota, 1 of them shed (an overload rejection), none at the tap", st)
	}
}

// TestCountsOnlyGrow reads the counts of the events while a call its
// quota let through (admitted, or a failed store failing open) waits for
// the overload controller, and again once the controller has shed it: the
// waiting call is not reported until the controller decides, no count
// falls, and the shed is counted in Shed, under its quota's decision.
func TestCountsOnlyGrow(t *testing.T) {
	for _, tc := range []struct {
		name          string
		store         floodgate.Store
		waiting, want counts
	}{
		{"admitted", nil, counts{Admitted: 1}, counts{Admitted: 2, Overload: 1, Shed: 1}},
		{"store error", failingStore{}, counts{StoreErrors: 1}, counts{StoreErrors: 2, Overload: 1, Shed: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctrl, err := overload.New(overload.WithLimits(1, 1), overload.WithQueueTarget(time.Second),
					overload.WithLogger(slog.New(slog.DiscardHandler)))
				if err != nil {
					t.Fatal(err)
				}
				var l *middleware.Limiter
				ty := &tally{}
				if tc.store == nil {
					f := newFixture(t, middleware.WithOverload(ctrl))
					l, ty = f.l, f.tally
				} else if l, err = middleware.New(tc.store, middleware.Static(testTable(t)), middleware.WithOverload(ctrl), ty.option(nil)); err != nil {
					t.Fatal(err)
				}
				c := middleware.Call{Method: methodGet, Header: http.Header{"X-Api-Key": {acmeKey}}}
				held, err := l.Admit(t.Context(), c)
				if err != nil {
					t.Fatal(err)
				}
				defer held.Done()
				done := make(chan error, 1)
				go func() {
					_, err := l.Admit(t.Context(), c)
					done <- err
				}()
				synctest.Wait()
				waiting := ty.counts()
				if s := ctrl.Snapshot(); s.Queued != 1 {
					t.Fatalf("controller queue %d, want the second call waiting", s.Queued)
				}
				if waiting != tc.waiting {
					t.Errorf("counts() while the call waits = %+v, want %+v", waiting, tc.waiting)
				}
				if err := <-done; status.Code(err) != codes.Unavailable {
					t.Fatalf("Admit after its wait: %v, want UNAVAILABLE", err)
				}
				shed := ty.counts()
				before, after := reflect.ValueOf(waiting), reflect.ValueOf(shed)
				for i := range before.NumField() {
					if b, a := before.Field(i).Uint(), after.Field(i).Uint(); a < b {
						t.Errorf("counts().%s fell from %d to %d", before.Type().Field(i).Name, b, a)
					}
				}
				if shed != tc.want {
					t.Errorf("counts() = %+v, want %+v", shed, tc.want)
				}
			})
		})
	}
}

// A call whose context ends while it waits for a slot is neither admitted
// nor shed: Admit returns the context's status.
// oneSlot returns a fixture whose overload controller runs one call at a
// time and lets calls wait a minute, with that one slot held by acme's
// call c until the test ends.
func oneSlot(t *testing.T) (*overload.Controller, fixture, middleware.Call, middleware.Admission) {
	t.Helper()
	ctrl, err := overload.New(overload.WithClock(newClock()), overload.WithQueueTarget(time.Minute),
		overload.WithLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, middleware.WithOverload(ctrl))
	c := middleware.Call{Method: methodGet, Header: http.Header{"X-Api-Key": {acmeKey}}}
	held, err := f.l.Admit(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	return ctrl, f, c, held
}

func TestAdmitContextEndsWhileWaiting(t *testing.T) {
	_, f, c, held := oneSlot(t)
	defer held.Done()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	a, err := f.l.Admit(ctx, c)
	if got, want := status.Code(err), codes.Canceled; got != want {
		t.Fatalf("Admit with an ended context: %v, want %v", err, want)
	}
	var rej *middleware.Rejection
	if d, _ := a.Decision(); !d.Allowed || errors.As(err, &rej) {
		t.Errorf("Decision() = %+v, rejection %+v: want the quota's admission, no rejection", d, rej)
	}
	if e := f.tally.last(); e.Allowed || e.Rejection != nil || !errors.Is(e.Err, context.Canceled) || e.Reason != middleware.ReasonAdmitted {
		t.Errorf("event of the call whose context ended while it waited: %+v, want not allowed, no rejection, Err canceled, its quota's reason", e)
	}
}

// TestAdmitTurnedAwayAsItEnters: Admit counts a call into the controller
// as the tap handle would; one the controller turns away as it enters is
// a shed of cause tap, with the overload reason in its decision, reported
// as Admit's, not the tap handle's, and it takes no place.
func TestAdmitTurnedAwayAsItEnters(t *testing.T) {
	ctrl, f, c, held := oneSlot(t)
	// The rest wait for the one slot, until the controller holds all it
	// lets wait and turns the next away as it enters.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var waiting int
	var turned middleware.Admission
	for i := 0; i < 64; i++ {
		before := f.tally.len()
		a, err := admitAsync(ctx, f.l, c, done)
		if err == nil {
			waiting++
			continue
		}
		if f.tally.len() == before {
			t.Fatalf("refused call %d reported no event: %v", i, err)
		}
		turned = a
		break
	}
	if waiting == 0 {
		t.Fatal("no call waited: the fixture turns calls away at once")
	}
	e := f.tally.last()
	if e.Tap || !e.Shed || e.Cause != overload.ShedTap || e.Reason != middleware.ReasonOverload || e.Context == nil || e.Rejection == nil {
		t.Errorf("event of the call turned away as it entered: %+v, want Admit's shed of cause tap, with its context and rejection", e)
	}
	if d, ok := turned.Decision(); !ok || d.Allowed || d.Reason != middleware.ReasonOverload || d.Tenant != "acme" {
		t.Errorf("Decision() of the call turned away = %+v, %v; want acme, refused for overload", d, ok)
	}
	cancel()
	for range waiting {
		<-done
	}
	held.Done()
	waitFor(t, func() bool { return ctrl.Snapshot().Inside == 0 }, "every place to come back")
}

// admitAsync admits c from a goroutine of its own and returns its
// admission once it is decided, or err nil once it waits: a waiting call
// signals done when its context ends.
func admitAsync(ctx context.Context, l *middleware.Limiter, c middleware.Call, done chan struct{}) (middleware.Admission, error) {
	type result struct {
		a   middleware.Admission
		err error
	}
	out := make(chan result, 1)
	go func() {
		a, err := l.Admit(ctx, c)
		a.Done()
		out <- result{a, err}
		done <- struct{}{}
	}()
	select {
	case r := <-out:
		<-done
		if r.err == nil {
			r.err = errors.New("admitted")
		}
		return r.a, r.err
	case <-time.After(50 * time.Millisecond):
		return middleware.Admission{}, nil
	}
}
