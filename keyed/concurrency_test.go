package keyed

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
)

// TestConcurrentExact has many goroutines take from one key while a driver
// advances a shared fake clock. Whatever the interleaving, the admitted
// count never exceeds burst + rate·elapsed, and no token is lost: admitted
// plus what is left equals exactly what the bucket was given.
func TestConcurrentExact(t *testing.T) {
	const (
		rate    = 1000 // tokens/s: one per clock step
		burst   = 1_000_000
		step    = time.Millisecond
		steps   = 2000
		workers = 8
	)
	m := newMap(t, WithShards(1))
	lim := floodgate.PerSecond(rate, burst)
	// Drain the burst so the bucket stays below its cap for the whole run:
	// a cap would drop tokens legitimately and hide a real loss.
	if r := takeAt(t, m, "k", lim, burst, t0); !r.Allowed {
		t.Fatal("initial drain rejected")
	}
	var clock atomic.Int64
	var admitted atomic.Int64
	var done atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				now := t0.Add(time.Duration(clock.Load()))
				if takeAt(t, m, "k", lim, 1, now).Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	for i := 1; i <= steps; i++ {
		clock.Store(int64(time.Duration(i) * step))
		for admitted.Load() < int64(i)/2 { // let takers keep up, loosely
		}
	}
	done.Store(true)
	wg.Wait()

	elapsed := time.Duration(clock.Load())
	given := int64(burst) + int64(rate*elapsed.Seconds()) // exact: integer rate, whole ms
	got := admitted.Load() + burst                        // the drain took burst
	if got > given {
		t.Errorf("admitted %d > burst + rate·elapsed = %d", got, given)
	}
	left := m.TokensAt("k", lim, t0.Add(elapsed))
	if total := float64(got) + left; total != float64(given) {
		t.Errorf("admitted %d + left %v = %v, want exactly %d (tokens lost or minted)", got, left, total, given)
	}
}

// TestConcurrentKeys races takes, peeks, resets and inserts over many keys
// and shards; run it with -race.
func TestConcurrentKeys(t *testing.T) {
	m := newMap(t, WithCapacity(500), WithShards(4))
	lim := floodgate.PerSecond(100, 10)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				key := fmt.Sprint(i % 1000)
				switch i % 10 {
				case 0:
					m.Reset(context.Background(), key)
				case 1:
					m.Peek(context.Background(), key, lim)
				default:
					takeAt(t, m, key, lim, 1, t0.Add(time.Duration(i)*time.Millisecond))
				}
			}
		}()
	}
	wg.Wait()
	if n := m.Len(); n > 500 || n < 0 {
		t.Errorf("Len() = %d, want within [0, 500]", n)
	}
}

// TestConcurrentMoves takes from a few keys without the shard lock while
// other goroutines make the table grow, evict, and shift entries back on
// removal, moving those keys' slots under the takes. No take may be lost or
// counted twice: for each key, the tokens admitted plus the tokens left is
// exactly its burst.
func TestConcurrentMoves(t *testing.T) {
	const (
		victims = 24
		burst   = 1000
		takes   = 700 // per victim, spread over the takers
		takers  = 3
	)
	m := newMap(t, WithCapacity(300), WithShards(1))
	// Rate 0: a victim never refills, so it is never full and Protect
	// never evicts it; every token it hands out is accounted for.
	vlim := floodgate.PerSecond(0, burst)
	clim := floodgate.PerSecond(1e9, 1) // churn: full again 1ns after a take
	var admitted [victims]atomic.Int64
	var taking, churning sync.WaitGroup
	var done atomic.Bool
	for w := 0; w < 2; w++ {
		churning.Add(1)
		go func() {
			defer churning.Done()
			for i := 0; !done.Load(); i++ {
				key := fmt.Sprint("churn-", w, "-", i%2000)
				if i%7 == 0 {
					m.Reset(context.Background(), key)
					continue
				}
				takeAt(t, m, key, clim, 1, t0.Add(time.Duration(i+1)*time.Microsecond))
			}
		}()
	}
	for w := 0; w < takers; w++ {
		taking.Add(1)
		go func() {
			defer taking.Done()
			for i := w; i < victims*takes; i += takers {
				v := i % victims
				// Later than every churn take, so that the churn
				// buckets are full when a victim needs room.
				if takeAt(t, m, fmt.Sprint("victim-", v), vlim, 1, t0.Add(time.Hour)).Allowed {
					admitted[v].Add(1)
				}
			}
		}()
	}
	taking.Wait()
	done.Store(true)
	churning.Wait()
	for v := range admitted {
		key := fmt.Sprint("victim-", v)
		left := m.TokensAt(key, vlim, t0.Add(time.Hour))
		if got := float64(admitted[v].Load()) + left; got != burst {
			t.Errorf("%s: admitted %d + left %v = %v, want exactly %d", key, admitted[v].Load(), left, got, burst)
		}
	}
	if st := m.Stats(); st.Evictions == 0 {
		t.Errorf("no evictions: the test moved nothing: %+v", st)
	}
}

// TestConcurrentPeekTake races peeks, which store a slot's meta back
// unchanged, with takes on one key while a driver advances the clock. A take
// whose compare-and-swap lost to a peek must look again, not wait for the
// meta to change (the test would hang); no peek may report tokens that takes
// already took or that the clock has not yet given; and no token is lost or
// minted.
func TestConcurrentPeekTake(t *testing.T) {
	const (
		rate    = 1000 // tokens/s: one per clock step
		burst   = 50   // never reached: the driver waits for the takers
		steps   = 2000
		workers = 4
	)
	var clock atomic.Int64 // ns after t0
	m := newMap(t, WithShards(1), WithClock(floodgate.ClockFunc(func() time.Time {
		return t0.Add(time.Duration(clock.Load()))
	})))
	lim := floodgate.PerSecond(rate, burst)
	ctx := context.Background()
	// Drain the bucket, so that it never reaches its cap: a cap would drop
	// tokens legitimately and hide a real loss.
	if res, err := m.TakeN(ctx, "k", lim, burst); err != nil || !res.Allowed {
		t.Fatalf("TakeN(burst) = %+v, %v; want allowed", res, err)
	}
	var admitted atomic.Int64 // after the drain
	var done atomic.Bool
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; !done.Load(); i++ {
				if (i+w)%2 == 1 {
					if res, _ := m.TakeN(ctx, "k", lim, 1); res.Allowed {
						admitted.Add(1)
					}
					continue
				}
				// Every take counted before the peek was decided before
				// it, and the clock has given at most what it shows after.
				taken := admitted.Load()
				res, _ := m.Peek(context.Background(), "k", lim)
				given := rate * clock.Load() / int64(time.Second)
				if res.Remaining < 0 || int64(res.Remaining) > given-taken {
					t.Errorf("Peek = %d remaining with %d given and %d taken since the drain", res.Remaining, given, taken)
					done.Store(true) // stop the driver too
				}
			}
		})
	}
	for i := int64(1); i <= steps && !done.Load(); i++ {
		clock.Store(i * int64(time.Millisecond))
		for admitted.Load() < i-10 && !done.Load() { // keep the takers within 10 tokens
			runtime.Gosched()
		}
	}
	if done.Swap(true) {
		wg.Wait()
		return // failed above
	}
	wg.Wait()
	left := m.Tokens("k", lim)
	if got := float64(admitted.Load()) + left; got != steps {
		t.Errorf("admitted %d + left %v = %v, want exactly the %d given", admitted.Load(), left, got, steps)
	}
}
