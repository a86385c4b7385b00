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
		if r := m.Peek("k", lim); r.Remaining != 0 {
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
		if err := m.WaitN(ctx, "k", lim, -1); !errors.Is(err, ErrNegativeN) {
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
