package keyed

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
)

func TestWaitN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := New() // the real clock: fake inside the bubble
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		lim := floodgate.PerSecond(10, 2)
		start := time.Now()
		for i := 0; i < 2; i++ {
			if err := m.WaitN(ctx, "k", lim, 1); err != nil {
				t.Fatalf("WaitN %d: %v", i, err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("the burst waited %v, want 0", d)
		}
		// Three waiters reserve in turn: served 100 ms apart.
		var wg sync.WaitGroup
		done := make([]time.Duration, 3)
		for i := range done {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := m.WaitN(ctx, "k", lim, 1); err != nil {
					t.Errorf("WaitN: %v", err)
				}
				done[i] = time.Since(start)
			}()
			synctest.Wait() // fix the arrival order
		}
		wg.Wait()
		for i, d := range done {
			if want := time.Duration(i+1) * 100 * time.Millisecond; d != want {
				t.Errorf("waiter %d served after %v, want %v", i, d, want)
			}
		}
		if r, _ := m.Peek(context.Background(), "k", lim); r.Remaining != 0 {
			t.Errorf("Remaining after the waits = %d, want 0", r.Remaining)
		}
	})
}

func TestWaitNFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := New()
		lim := floodgate.PerSecond(1, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := m.WaitN(ctx, "k", lim, 2); !errors.Is(err, floodgate.ErrExceedsBurst) {
			t.Errorf("WaitN(n > burst) = %v, want ErrExceedsBurst", err)
		}
		if err := m.WaitN(ctx, "z", floodgate.Limit{}, 1); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
			t.Errorf("WaitN(zero Limit) = %v, want ErrWouldExceedDeadline: it admits nothing, ever", err)
		}
		if err := m.WaitN(ctx, "k", lim, 1); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitN(ctx, "k", lim, 1); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
			t.Errorf("WaitN needing 1s with 500ms left = %v, want ErrWouldExceedDeadline", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("failing fast took %v", d)
		}
		if err := m.WaitN(ctx, "z", floodgate.PerSecond(0, 1), 1); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitN(context.Background(), "z", floodgate.PerSecond(0, 1), 1); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
			t.Errorf("WaitN on a bucket that never refills = %v, want ErrWouldExceedDeadline", err)
		}
		if err := m.WaitN(ctx, "k", lim, -1); !errors.Is(err, floodgate.ErrNegativeN) {
			t.Errorf("WaitN(-1) = %v, want ErrNegativeN", err)
		}
		cancel()
		if err := m.WaitN(ctx, "fresh", lim, 1); !errors.Is(err, context.Canceled) {
			t.Errorf("WaitN on a done context = %v, want context.Canceled", err)
		}
	})
}

func TestWaitNCancelRefunds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := New()
		lim := floodgate.PerSecond(1, 1)
		m.WaitN(context.Background(), "k", lim, 1) // drain
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error)
		go func() { errc <- m.WaitN(ctx, "k", lim, 1) }()
		synctest.Wait()
		if got := m.Tokens("k", lim); got != -1 {
			t.Errorf("Tokens while a waiter owes one = %v, want -1", got)
		}
		time.Sleep(300 * time.Millisecond) // fake time inside the bubble
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("WaitN = %v, want context.Canceled", err)
		}
		if got := m.Tokens("k", lim); got != 0.3 {
			t.Errorf("Tokens after the refund = %v, want 0.3", got)
		}
	})
}

// TestWaitNCancelRefundsOverflow: a key without a bucket of its own waits on
// its shard's overflow bucket, and a canceled wait gives its tokens back
// there, or the keys sharing it would wait for tokens nobody took.
func TestWaitNCancelRefundsOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := New(WithCapacity(1), WithShards(1))
		lim := floodgate.PerSecond(1, 1)
		bg := context.Background()
		m.WaitN(bg, "resident", lim, 1) // not full: protected from eviction
		m.WaitN(bg, "new-1", lim, 1)    // drains the overflow bucket
		if st := m.Stats(); st.Overflowed != 1 {
			t.Fatalf("Stats = %+v, want new-1 in the overflow bucket", st)
		}
		ctx, cancel := context.WithCancel(bg)
		errc := make(chan error)
		go func() { errc <- m.WaitN(ctx, "new-2", lim, 1) }()
		synctest.Wait()
		time.Sleep(300 * time.Millisecond)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitN = %v, want context.Canceled", err)
		}
		// 0.3 tokens now: the next waiter waits 0.7 s, not 1.7 s.
		start := time.Now()
		if err := m.WaitN(bg, "new-3", lim, 1); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 700*time.Millisecond {
			t.Errorf("WaitN after the refund waited %v, want 700ms", got)
		}
	})
}

// TestWaitNCancelAfterReset: a waiter canceled after its key was reset owes
// the new bucket nothing, and gives it nothing: the new bucket must not
// admit more than its burst.
func TestWaitNCancelAfterReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := New()
		lim := floodgate.PerSecond(1, 2)
		bg := context.Background()
		m.WaitN(bg, "k", lim, 2) // drain
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- m.WaitN(ctx, "k", lim, 1) }()
		synctest.Wait() // reserved: one token owed
		if m.Len() != 1 {
			t.Fatalf("Len() = %d before Reset, want 1", m.Len())
		}
		if err := m.Reset(bg, "k"); err != nil || m.Len() != 0 {
			t.Fatalf("Reset = %v with Len() = %d after, want nil and 0", err, m.Len())
		}
		admitted := 0
		for range 3 {
			if res, _ := m.TakeN(bg, "k", lim, 1); res.Allowed {
				admitted++
			}
			if admitted == 1 {
				cancel()
				<-errc
			}
		}
		if admitted != 2 {
			t.Errorf("a new bucket of burst 2 admitted %d takes at one instant", admitted)
		}
	})
}

// TestWaitNLargeBursts: bursts near MaxBurst put WaitN debts beyond what
// the difference of two int64 unit counts can hold; the bucket must stay in
// debt, and a reservation that cannot be counted is refused, not served at
// once.
func TestWaitNLargeBursts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := New()
		const burst = 5_000_000_000
		bg := context.Background()

		slow := floodgate.PerSecond(1, burst)
		m.WaitN(bg, "slow", slow, burst) // drain
		ctx, cancel := context.WithCancel(bg)
		errc := make(chan error)
		go func() { errc <- m.WaitN(ctx, "slow", slow, burst) }()
		synctest.Wait()
		time.Sleep(time.Millisecond)
		if tok := m.Tokens("slow", slow); tok > -burst+1 {
			t.Errorf("Tokens with %d owed = %v", burst, tok)
		}
		if res, _ := m.TakeN(bg, "slow", slow, 1); res.Allowed {
			t.Errorf("take with %d tokens owed: %+v", burst, res)
		}
		cancel()
		<-errc

		fast := floodgate.PerSecond(1e9, burst) // 5 s per burst
		m.WaitN(bg, "fast", fast, burst)
		start := time.Now()
		if err := m.WaitN(bg, "fast", fast, burst); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 5*time.Second {
			t.Errorf("a wait for a whole burst at 1e9/s took %v, want 5s", got)
		}
		// The bucket is drained: one more burst is owed as soon as it is
		// reserved, and a second on top no longer fits the arithmetic.
		go func() { errc <- m.WaitN(bg, "fast", fast, burst) }()
		synctest.Wait()
		if err := m.WaitN(bg, "fast", fast, burst); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
			t.Errorf("a second reservation of a whole burst = %v, want ErrWouldExceedDeadline", err)
		}
		if err := <-errc; err != nil {
			t.Errorf("first reservation: %v", err)
		}
	})
}
