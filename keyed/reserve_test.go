package keyed

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
)

// clock is a fake clock that tests advance by hand.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time          { return t0.Add(time.Duration(c.ns.Load())) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// clocked returns a Map on a fake clock that starts at t0.
func clocked(t testing.TB, opts ...Option) (*Map, *clock) {
	t.Helper()
	c := &clock{}
	m, err := New(append([]Option{WithClock(c)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	m.base = t0
	return m, c
}

var bg = context.Background()

// reserve is m.ReserveN for reservations that must be made.
func reserve(t testing.TB, m *Map, key string, lim floodgate.Limit, n int) floodgate.Reservation {
	t.Helper()
	r, err := m.ReserveN(bg, key, lim, n)
	if err != nil || !r.Result.Allowed {
		t.Fatalf("ReserveN(%q, %v, %d) = %+v, %v; want allowed", key, lim, n, r.Result, err)
	}
	return r
}

// TestReserveSettle walks one bucket through a refund, an overrun into
// debt, refusals while in debt and its repayment, on a fake clock.
func TestReserveSettle(t *testing.T) {
	m, c := clocked(t)
	lim := floodgate.PerSecond(10, 10) // debt limit: one burst
	tokens := func() float64 { return m.Tokens("k", lim) }

	// A call estimated at 5 that cost 2 gets 3 back.
	r := reserve(t, m, "k", lim, 5)
	if got := tokens(); got != 5 {
		t.Fatalf("tokens after ReserveN(5) = %v, want 5", got)
	}
	res, err := r.Settle(bg, 2)
	if err != nil || !res.Allowed || res.Remaining != 8 || res.Owed != 0 {
		t.Fatalf("Settle(2) = %+v, %v; want allowed, 8 remaining", res, err)
	}
	if got := tokens(); got != 8 {
		t.Fatalf("tokens after the refund = %v, want 8", got)
	}

	// A call estimated at 5 that cost 12 overruns by 7: the bucket owes 4.
	r = reserve(t, m, "k", lim, 5)
	res, err = r.Settle(bg, 12)
	if err != nil || res.Remaining != 0 || res.Owed != 4 || res.ResetAfter != 1400*time.Millisecond {
		t.Fatalf("Settle(12) = %+v, %v; want 0 remaining, 4 owed, reset 1.4s", res, err)
	}
	if got := tokens(); got != -4 {
		t.Fatalf("tokens after the overrun = %v, want -4", got)
	}

	// While it owes, every take is refused until it holds n again.
	for _, n := range []int{1, 3} {
		res, err := m.TakeN(bg, "k", lim, n)
		want := time.Duration(4+n) * 100 * time.Millisecond
		if err != nil || res.Allowed || res.Owed != 4 || res.RetryAfter != want {
			t.Errorf("TakeN(%d) in debt = %+v, %v; want refused, 4 owed, retry %v", n, res, err, want)
		}
	}
	if r, err := m.ReserveN(bg, "k", lim, 0); err != nil || r.Result.Allowed || r.Result.RetryAfter != 400*time.Millisecond {
		t.Errorf("ReserveN(0) in debt = %+v, %v; want refused, retry 400ms (until it owes nothing)", r.Result, err)
	}
	if res, _ := m.TakeN(bg, "k", lim, 0); !res.Allowed || res.Owed != 4 {
		t.Errorf("TakeN(0) in debt = %+v; want a peek: allowed, 4 owed", res)
	}

	// Repaid at the rate: 400 ms to owe nothing, 100 ms more for a token.
	c.Advance(400 * time.Millisecond)
	if r, _ := m.ReserveN(bg, "k", lim, 0); !r.Result.Allowed {
		t.Errorf("ReserveN(0) once repaid = %+v, want allowed", r.Result)
	}
	if res, _ := m.TakeN(bg, "k", lim, 1); res.Allowed || res.RetryAfter != 100*time.Millisecond {
		t.Errorf("TakeN(1) once repaid = %+v, want refused, retry 100ms", res)
	}
	c.Advance(100 * time.Millisecond)
	if res, _ := m.TakeN(bg, "k", lim, 1); !res.Allowed || res.Remaining != 0 {
		t.Errorf("TakeN(1) after the retry = %+v, want allowed", res)
	}
}

// TestSettleDebtLimit: a charge stops at the debt limit, in whole tokens,
// and the error says what was not charged.
func TestSettleDebtLimit(t *testing.T) {
	for _, c := range []struct {
		name     string
		lim      floodgate.Limit
		reserve  int
		actual   int
		want     float64 // tokens after
		left     int     // tokens not charged
		wantOwed int
	}{
		{"default is one burst", floodgate.PerSecond(1, 10), 10, 100, -10, 80, 10},
		{"explicit", floodgate.Limit{Rate: 1, Burst: 10, Debt: 25}, 4, 36, -25, 1, 25},
		{"just fits", floodgate.Limit{Rate: 1, Burst: 10, Debt: 25}, 4, 35, -25, 0, 25},
		{"no debt", floodgate.Limit{Rate: 1, Burst: 10, Debt: floodgate.NoDebt}, 4, 9, 1, 0, 0},
		{"no debt, over", floodgate.Limit{Rate: 1, Burst: 10, Debt: floodgate.NoDebt}, 4, 20, 0, 10, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, _ := clocked(t)
			r := reserve(t, m, "k", c.lim, c.reserve)
			res, err := r.Settle(bg, c.actual)
			var dle *floodgate.DebtLimitError
			switch {
			case c.left == 0 && err != nil:
				t.Errorf("Settle(%d) error = %v, want nil", c.actual, err)
			case c.left > 0 && (!errors.As(err, &dle) || dle.Uncharged != c.left || !errors.Is(err, floodgate.ErrDebtLimit)):
				t.Errorf("Settle(%d) error = %v, want a DebtLimitError of %d", c.actual, err, c.left)
			}
			if !res.Allowed || res.Owed != c.wantOwed {
				t.Errorf("Settle(%d) = %+v, want allowed, %d owed", c.actual, res, c.wantOwed)
			}
			if got := m.Tokens("k", c.lim); got != c.want {
				t.Errorf("tokens after = %v, want %v", got, c.want)
			}
		})
	}
}

// TestSettleWholeTokens: a bucket holding a fraction of a token is charged
// whole tokens down to its debt limit, and owes its debt rounded up.
func TestSettleWholeTokens(t *testing.T) {
	m, c := clocked(t)
	lim := floodgate.PerSecond(10, 2)
	reserve(t, m, "k", lim, 2)
	c.Advance(50 * time.Millisecond) // half a token
	res, err := m.SettleN(bg, "k", lim, 0, 5)
	var dle *floodgate.DebtLimitError
	if !errors.As(err, &dle) || dle.Uncharged != 3 {
		t.Fatalf("SettleN(0, 5) error = %v, want 3 tokens not charged", err)
	}
	if got := m.Tokens("k", lim); got != -1.5 {
		t.Errorf("tokens = %v, want -1.5: charged 2 whole tokens of 5", got)
	}
	if res.Owed != 2 {
		t.Errorf("Owed = %d, want 2 (1.5 rounded up)", res.Owed)
	}
}

// TestSettleRefundDeepInDebt: a refund to a bucket that owes its largest
// debt limit at the largest burst adds what it refunds, however large,
// and fills the bucket only when that is more than it lacks.
func TestSettleRefundDeepInDebt(t *testing.T) {
	lim := floodgate.Limit{Rate: 0, Burst: floodgate.MaxBurst, Debt: floodgate.MaxBurst}
	for _, c := range []struct {
		refund int
		want   float64
	}{
		{10_000_000_000, 10_000_000_000 - floodgate.MaxBurst},
		{2 * floodgate.MaxBurst, floodgate.MaxBurst},
		{2*floodgate.MaxBurst + 1, floodgate.MaxBurst},
	} {
		m, _ := clocked(t)
		if _, err := m.SettleN(bg, "k", lim, 0, 2*floodgate.MaxBurst); err != nil {
			t.Fatal(err)
		}
		if got := m.Tokens("k", lim); got != -floodgate.MaxBurst {
			t.Fatalf("tokens = %v, want %v", got, -floodgate.MaxBurst)
		}
		res, err := m.SettleN(bg, "k", lim, c.refund, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Tokens("k", lim); got != c.want || res.Remaining != int(c.want) {
			t.Errorf("refund of %d: tokens %v, Remaining %d; want %v", c.refund, got, res.Remaining, c.want)
		}
	}
}

// TestSettleBadInput: every bad input gets an error or does what its
// documentation says, and no token is lost or created: the bucket's tokens
// before and after are checked each time.
func TestSettleBadInput(t *testing.T) {
	lim := floodgate.PerSecond(1, 10)
	for _, c := range []struct {
		name string
		// do runs on a bucket that holds 10 tokens and returns the error
		// it saw; want is the bucket's tokens after.
		do      func(m *Map) error
		want    float64
		wantErr error
	}{
		{"negative reservation", func(m *Map) error {
			_, err := m.ReserveN(bg, "k", lim, -1)
			return err
		}, 10, floodgate.ErrNegativeN},
		{"negative cost", func(m *Map) error {
			r := reserve(t, m, "k", lim, 4)
			if _, err := r.Settle(bg, -1); !errors.Is(err, floodgate.ErrNegativeN) {
				return err
			}
			_, err := r.Settle(bg, 1) // the reservation was not spent
			return err
		}, 9, nil},
		{"negative SettleN", func(m *Map) error {
			_, err := m.SettleN(bg, "k", lim, -1, 3)
			return err
		}, 10, floodgate.ErrNegativeN},
		{"reservation above the burst", func(m *Map) error {
			r, err := m.ReserveN(bg, "k", lim, 11)
			if r.Result.Allowed || r.Result.RetryAfter != floodgate.Never {
				t.Errorf("ReserveN(11) = %+v, want refused for good", r.Result)
			}
			if _, err := r.Settle(bg, 11); err != nil { // refused: settles nothing
				return err
			}
			return err
		}, 10, floodgate.ErrExceedsBurst},
		{"cost above the debt limit", func(m *Map) error {
			r := reserve(t, m, "k", lim, 1)
			_, err := r.Settle(bg, 30) // 29 over: 19 fit
			return err
		}, -10, floodgate.ErrDebtLimit},
		{"settled twice", func(m *Map) error {
			r := reserve(t, m, "k", lim, 4)
			if _, err := r.Settle(bg, 1); err != nil {
				return err
			}
			_, err := r.Settle(bg, 0)
			return err
		}, 9, floodgate.ErrSettled},
		{"settled after the limit changed", func(m *Map) error {
			// Reserved under lim; the key's limit is now lower: the take
			// under it caps the bucket at its burst (6 → 3, then 2).
			low := floodgate.PerSecond(1, 3)
			r := reserve(t, m, "k", lim, 4)
			if res, _ := m.TakeN(bg, "k", low, 1); !res.Allowed {
				t.Error("take under the new limit refused")
			}
			// The refund of 3 applies under lim (2 → 5), and the next
			// decision under low caps it at 3 again.
			if _, err := r.Settle(bg, 1); err != nil {
				return err
			}
			if got := m.Tokens("k", lim); got != 5 {
				t.Errorf("tokens under the reservation's limit = %v, want 5", got)
			}
			if got := m.Tokens("k", low); got != 3 {
				t.Errorf("tokens under the new limit = %v, want 3", got)
			}
			return nil
		}, 5, nil},
		{"refused reservation", func(m *Map) error {
			if _, err := m.TakeN(bg, "k", lim, 10); err != nil {
				return err
			}
			r, err := m.ReserveN(bg, "k", lim, 1)
			if err != nil || r.Result.Allowed {
				t.Errorf("ReserveN on an empty bucket = %+v, %v; want refused", r.Result, err)
			}
			_, err = r.Settle(bg, 5) // a no-op
			return err
		}, 0, nil},
		{"invalid limit", func(m *Map) error {
			_, err := m.SettleN(bg, "k", floodgate.Limit{Rate: 1, Burst: 10, Debt: -3}, 0, 3)
			return err
		}, 10, floodgate.ErrInvalidLimit},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, _ := clocked(t)
			if got := m.Tokens("k", lim); got != 10 {
				t.Fatalf("tokens before = %v, want 10", got)
			}
			if err := c.do(m); !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Errorf("error = %v, want %v", err, c.wantErr)
			}
			if got := m.Tokens("k", lim); got != c.want {
				t.Errorf("tokens after = %v, want %v", got, c.want)
			}
		})
	}
}

// TestReserveNoneZeroLimit: the zero Limit admits nothing, not even a
// reservation of nothing; Inf admits everything and keeps no state.
func TestReserveNoneZeroLimit(t *testing.T) {
	m, _ := clocked(t)
	if r, err := m.ReserveN(bg, "k", floodgate.Limit{}, 0); err != nil || r.Result.Allowed || r.Result.RetryAfter != floodgate.Never {
		t.Errorf("ReserveN(zero Limit, 0) = %+v, %v; want refused for good", r.Result, err)
	}
	r := reserve(t, m, "k", floodgate.Inf, 0)
	if res, err := r.Settle(bg, 1e6); err != nil || !res.Allowed {
		t.Errorf("Settle under Inf = %+v, %v; want allowed", res, err)
	}
	if m.Len() != 0 {
		t.Errorf("Len() = %d, want 0", m.Len())
	}
}

// TestDebtSurvivesEviction: under both pressure policies, a full Map never
// evicts a bucket in debt, however many new keys arrive; once refilled it
// may go.
func TestDebtSurvivesEviction(t *testing.T) {
	for _, p := range []Pressure{Protect, Evict} {
		t.Run([]string{"Protect", "Evict"}[p], func(t *testing.T) {
			m, c := clocked(t, WithCapacity(2), WithShards(1), WithPressure(p))
			lim := floodgate.PerSecond(1, 10)
			r := reserve(t, m, "debtor", lim, 10)
			if _, err := r.Settle(bg, 15); err != nil {
				t.Fatal(err)
			}
			reserve(t, m, "other", lim, 1) // not full, owes nothing
			for i := range 100 {
				m.TakeN(bg, "new-"+strconv.Itoa(i), lim, 1)
			}
			if !tracks(m, "debtor") {
				t.Fatal("the bucket in debt was evicted")
			}
			if got := m.Tokens("debtor", lim); got != -5 {
				t.Errorf("debtor's tokens = %v, want -5", got)
			}
			st := m.Stats()
			if p == Evict && (st.EvictedNotFull == 0 || tracks(m, "other")) {
				t.Errorf("Evict: Stats = %+v, want the bucket that owes nothing evicted", st)
			}
			if p == Protect && st.Evictions != 0 {
				t.Errorf("Protect: Stats = %+v, want no eviction", st)
			}
			// Repaid and full again (15 s at 1/s), it is evicted as any
			// full bucket is.
			c.Advance(15 * time.Second)
			for i := range 100 {
				m.TakeN(bg, "later-"+strconv.Itoa(i), lim, 1)
			}
			if tracks(m, "debtor") {
				t.Error("a refilled bucket is never evicted")
			}
		})
	}
}

// TestDebtSurvivesRateCut: a bucket charged into debt under one limit and
// refused under a slower one is not evicted when the first limit would
// have repaid it: refusals under the slower limit keep it.
func TestDebtSurvivesRateCut(t *testing.T) {
	m, c := clocked(t, WithCapacity(1), WithShards(1), WithPressure(Evict))
	fast := floodgate.PerSecond(10, 10)
	slow := floodgate.PerSecond(1, 10)
	r := reserve(t, m, "debtor", fast, 10)
	r.Settle(bg, 20) // owes 10: full again in 2 s at 10/s, 20 s at 1/s
	c.Advance(time.Second)
	if res, _ := m.TakeN(bg, "debtor", slow, 1); res.Allowed || res.Owed != 9 {
		t.Fatalf("TakeN under the slower limit = %+v, want refused, 9 owed", res)
	}
	c.Advance(2 * time.Second) // full by now under fast, not under slow
	m.TakeN(bg, "newcomer", slow, 1)
	if !tracks(m, "debtor") {
		t.Fatal("the debtor was evicted once the old limit would have repaid it")
	}
	if got := m.Tokens("debtor", slow); got != -7 {
		t.Errorf("debtor's tokens = %v, want -7", got)
	}
}

// TestDebtSurvivesLimitChange: a config reload or a gate scale (a new
// Limit for the same key) keeps the bucket's debt, and repays it at the new
// rate.
func TestDebtSurvivesLimitChange(t *testing.T) {
	m, c := clocked(t)
	old := floodgate.PerSecond(10, 10)
	r := reserve(t, m, "k", old, 10)
	r.Settle(bg, 16) // owes 6
	for _, lim := range []floodgate.Limit{
		floodgate.PerSecond(20, 40),      // raised
		floodgate.PerSecond(5, 2),        // lowered
		old.Scale(0.5),                   // the CPU gate's cut
		{Rate: 10, Burst: 10, Debt: 100}, // another debt limit
	} {
		res, _ := m.TakeN(bg, "k", lim, 1)
		if res.Allowed || res.Owed != 6 {
			t.Errorf("TakeN under %v = %+v, want refused, 6 owed", lim, res)
		}
	}
	c.Advance(100 * time.Millisecond)
	if got := m.Tokens("k", floodgate.PerSecond(20, 40)); got != -4 {
		t.Errorf("tokens 100 ms later at 20/s = %v, want -4", got)
	}
}

// TestReserveSettleConcurrent: goroutines reserve and settle random costs
// on one bucket, with no refill; whatever the interleaving, the bucket ends
// at its burst less the actual costs of the reservations it allowed.
func TestReserveSettleConcurrent(t *testing.T) {
	const (
		burst   = 2000
		workers = 8
		ops     = 1000
	)
	m, _ := clocked(t)
	// A debt limit no run reaches, so that no charge is cut.
	lim := floodgate.Limit{Rate: 0, Burst: burst, Debt: floodgate.MaxBurst}
	var spent atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range ops {
				r, err := m.ReserveN(bg, "k", lim, rng.IntN(10))
				if err != nil {
					t.Error(err)
					return
				}
				if !r.Result.Allowed {
					continue
				}
				actual := rng.IntN(20)
				if _, err := r.Settle(bg, actual); err != nil {
					t.Error(err)
					return
				}
				spent.Add(int64(actual))
			}
		})
	}
	wg.Wait()
	if spent.Load() <= burst {
		t.Fatalf("spent %d, want more than the burst: the bucket must go into debt", spent.Load())
	}
	if got, want := m.Tokens("k", lim), float64(burst-spent.Load()); got != want {
		t.Errorf("tokens = %v, want burst − spent = %v", got, want)
	}
}

func TestReserveSettleZeroAllocs(t *testing.T) {
	m, err := New(WithCapacity(1000))
	if err != nil {
		t.Fatal(err)
	}
	lim := floodgate.PerSecond(1e9, 1e6)
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
		m.TakeN(bg, keys[i], lim, 1)
	}
	i := 0
	for _, c := range []struct {
		name   string
		actual int
	}{{"refund", 1}, {"as reserved", 5}, {"overrun", 9}} {
		if allocs := testing.AllocsPerRun(1000, func() {
			r, _ := m.ReserveN(bg, keys[i%len(keys)], lim, 5)
			r.Settle(bg, c.actual)
			i++
		}); allocs != 0 {
			t.Errorf("ReserveN and Settle (%s): %v allocs/op, want 0", c.name, allocs)
		}
	}
}

// TestReserveOverflowDebt: new keys a full Map has no room for share their
// shard's overflow bucket, debt included: an overrun charged to it holds
// back every such key, reservations of nothing too.
func TestReserveOverflowDebt(t *testing.T) {
	m, _ := clocked(t, WithCapacity(1), WithShards(1))
	lim := floodgate.PerSecond(1, 5)
	reserve(t, m, "resident", lim, 1) // not full: protected
	r := reserve(t, m, "x", lim, 2)   // the overflow bucket's
	if _, err := r.Settle(bg, 8); err != nil {
		t.Fatal(err)
	}
	if got := m.Stats().Overflowed; got == 0 {
		t.Fatalf("Stats().Overflowed = 0: the overflow bucket decided nothing")
	}
	if r, err := m.ReserveN(bg, "y", lim, 0); err != nil || r.Result.Allowed || r.Result.Owed != 3 {
		t.Errorf("ReserveN(y, 0) = %+v, %v; want refused for the overflow bucket's 3 owed", r.Result, err)
	}
}
