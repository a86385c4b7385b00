package floodgate_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/google/go-cmp/cmp"
)

// recorder is a Settler that records its calls.
type recorder struct {
	mu    sync.Mutex
	calls []settleCall
	res   floodgate.Result
	err   error
}

type settleCall struct {
	Key              string
	Lim              floodgate.Limit
	Reserved, Actual int
}

func (r *recorder) SettleN(_ context.Context, key string, lim floodgate.Limit, reserved, actual int) (floodgate.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, settleCall{key, lim, reserved, actual})
	return r.res, r.err
}

// TestReservationSettle checks what Settle asks of the store, for every
// kind of reservation and input.
func TestReservationSettle(t *testing.T) {
	ctx := context.Background()
	lim := floodgate.PerSecond(10, 5)
	allowed := floodgate.Result{Allowed: true, Limit: lim, Remaining: 2}
	after := floodgate.Result{Allowed: true, Limit: lim, Remaining: 4}
	for _, c := range []struct {
		name      string
		res       floodgate.Result
		nilStore  bool
		actual    int
		wantRes   floodgate.Result
		wantErr   error
		wantCalls []settleCall
	}{
		{name: "refund", res: allowed, actual: 1, wantRes: after,
			wantCalls: []settleCall{{"k", lim, 3, 1}}},
		{name: "overrun", res: allowed, actual: 9, wantRes: after,
			wantCalls: []settleCall{{"k", lim, 3, 9}}},
		{name: "cancel", res: allowed, actual: 0, wantRes: after,
			wantCalls: []settleCall{{"k", lim, 3, 0}}},
		{name: "as reserved", res: allowed, actual: 3, wantRes: allowed},
		{name: "refused", res: floodgate.Result{Limit: lim}, actual: 9, wantRes: floodgate.Result{Limit: lim}},
		{name: "no store", res: allowed, nilStore: true, actual: 9, wantRes: allowed},
		{name: "negative", res: allowed, actual: -1, wantErr: floodgate.ErrNegativeN},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{res: after}
			var s floodgate.Settler = rec
			if c.nilStore {
				s = nil
			}
			r := floodgate.NewReservation(s, "k", lim, 3, c.res)
			got, err := r.Settle(ctx, c.actual)
			if !errors.Is(err, c.wantErr) || got != c.wantRes {
				t.Errorf("Settle(%d) = %+v, %v; want %+v, %v", c.actual, got, err, c.wantRes, c.wantErr)
			}
			if diff := cmp.Diff(c.wantCalls, rec.calls); diff != "" {
				t.Errorf("SettleN calls (-want +got):\n%s", diff)
			}
			// A negative actual spends nothing; anything else spends the
			// reservation, and a second settle changes nothing.
			wantErr := floodgate.ErrSettled
			if c.wantErr != nil {
				wantErr = nil
			}
			calls := len(rec.calls)
			if _, err := r.Settle(ctx, 1); !errors.Is(err, wantErr) {
				t.Errorf("second Settle error = %v, want %v", err, wantErr)
			}
			if c.wantErr == nil && len(rec.calls) != calls {
				t.Errorf("second Settle called the store: %+v", rec.calls[calls:])
			}
		})
	}
}

// TestReservationZero: the zero Reservation holds nothing and settles to
// nothing.
func TestReservationZero(t *testing.T) {
	var r floodgate.Reservation
	if got, err := r.Settle(context.Background(), 5); err != nil || got != (floodgate.Result{}) {
		t.Errorf("zero Settle(5) = %+v, %v; want the zero Result and nil", got, err)
	}
	if got := r.Tokens(); got != 0 {
		t.Errorf("zero Tokens() = %d, want 0", got)
	}
}

// TestReservationSettleOnce: of many goroutines settling one reservation,
// one settles and the others get ErrSettled.
func TestReservationSettleOnce(t *testing.T) {
	rec := &recorder{}
	lim := floodgate.PerSecond(1, 10)
	r := floodgate.NewReservation(rec, "k", lim, 4, floodgate.Result{Allowed: true, Limit: lim})
	var wg sync.WaitGroup
	var settled, refused atomic.Int64
	for range 16 {
		wg.Go(func() {
			_, err := r.Settle(context.Background(), 1)
			switch {
			case err == nil:
				settled.Add(1)
			case errors.Is(err, floodgate.ErrSettled):
				refused.Add(1)
			default:
				t.Errorf("Settle error = %v", err)
			}
		})
	}
	wg.Wait()
	if settled.Load() != 1 || refused.Load() != 15 || len(rec.calls) != 1 {
		t.Errorf("settled %d, refused %d, store calls %d; want 1, 15, 1", settled.Load(), refused.Load(), len(rec.calls))
	}
}

// TestReservationPassesErrors: the store's error, a debt limit included,
// reaches the caller, and the reservation is spent.
func TestReservationPassesErrors(t *testing.T) {
	lim := floodgate.PerSecond(1, 10)
	rec := &recorder{err: &floodgate.DebtLimitError{Uncharged: 7}}
	r := floodgate.NewReservation(rec, "k", lim, 1, floodgate.Result{Allowed: true, Limit: lim})
	_, err := r.Settle(context.Background(), 30)
	var dle *floodgate.DebtLimitError
	if !errors.Is(err, floodgate.ErrDebtLimit) || !errors.As(err, &dle) || dle.Uncharged != 7 {
		t.Fatalf("Settle error = %v, want a DebtLimitError of 7 tokens", err)
	}
	if got, want := err.Error(), "floodgate: charge exceeds the debt limit: 7 tokens not charged"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if _, err := r.Settle(context.Background(), 30); !errors.Is(err, floodgate.ErrSettled) {
		t.Errorf("Settle after a failed settle = %v, want ErrSettled", err)
	}
	if got := r.Tokens(); got != 1 {
		t.Errorf("Tokens() = %d, want 1", got)
	}
}

// TestReserveAllInOrder: on a store that is no AllReserver, ReserveAll
// reserves take after take and gives back what it took when one refuses.
func TestReserveAllInOrder(t *testing.T) {
	m, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := floodgate.PerSecond(1, 10)
	takes := []floodgate.Take{{Key: "a", Limit: lim, N: 3}, {Key: "b", Limit: lim, N: 8}, {Key: "c", Limit: lim, N: 1}}
	rs := make([]floodgate.Reservation, len(takes))
	if refused, err := floodgate.ReserveAll(ctx, m, takes, rs); refused != -1 || err != nil || rs[1].Tokens() != 8 {
		t.Fatalf("ReserveAll = %d, %v, %+v; want all reserved", refused, err, rs)
	}
	refused, err := floodgate.ReserveAll(ctx, m, takes, rs)
	if refused != 1 || err != nil || rs[0].Tokens() != 0 || !rs[0].Result.Allowed || rs[1].Result.Allowed || rs[2].Result != (floodgate.Result{}) {
		t.Fatalf("ReserveAll again = %d, %v, %+v; want b refused, a given back, c not decided", refused, err, rs)
	}
	if res, _ := m.Peek(ctx, "a", lim); res.Remaining != 7 {
		t.Errorf("a holds %d after the refused request, want 7", res.Remaining)
	}
	if _, err := floodgate.ReserveAll(ctx, m, takes, rs[:1]); err == nil {
		t.Error("ReserveAll with too few reservations: no error")
	}
}
