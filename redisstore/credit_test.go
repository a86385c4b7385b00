package redisstore_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/redisstore"
)

// eventually polls cond until it holds, failing t after 10 s: for the
// credit flusher's charges, which land in the background.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// creditPair returns two stores on one bucket space and clock: a plain
// one, and one with leases of lease time d and credit.
func creditPair(t *testing.T, clock *fakeClock, d time.Duration) (plain, credit *redisstore.Store) {
	t.Helper()
	srv := sharedServer(t)
	pfx := redisstore.WithPrefix(prefix(t))
	plain = newStore(t, newClient(t, srv.Addr), pfx, redisstore.WithClientClock(clock))
	credit = newStore(t, newClient(t, srv.Addr), pfx, redisstore.WithClientClock(clock),
		redisstore.WithLeases(d, 100), redisstore.WithCredit())
	return plain, credit
}

// TestCreditDecidesWithoutRoundTrip: takes on keys this process has no
// answer for are decided on credit, with no call, and their tokens are
// charged to the shared buckets after.
func TestCreditDecidesWithoutRoundTrip(t *testing.T) {
	srv := sharedServer(t)
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(newFakeClock()),
		redisstore.WithLeases(100*time.Millisecond, 100), redisstore.WithCredit())
	lim := floodgate.PerSecond(100, 50) // credit ⌊100 × 0.1⌋ = 10
	for i := range 10 {
		res, err := s.TakeN(bg, fmt.Sprint("cold", i), lim, 2)
		if err != nil || !res.Allowed || res.Source != floodgate.SourceLease || res.Remaining != 48 {
			t.Fatalf("TakeN = %+v, %v; want admitted on credit, 48 remaining", res, err)
		}
	}
	if st := s.Stats(); st.Credit != 10 || st.Lease != 10 || st.Redis != 0 {
		t.Fatalf("Stats = %+v, want 10 takes on credit and no call", st)
	}
	for i := range 10 {
		key := fmt.Sprint("cold", i)
		eventually(t, "charge of "+key, func() bool {
			p, err := s.Peek(bg, key, lim)
			return err == nil && p.Remaining == 48
		})
	}
	// A peek answers from this process's count, which the charges set.
	if res, err := s.TakeN(bg, "cold0", lim, 0); err != nil || res.Source != floodgate.SourceLease || res.Remaining != 48 {
		t.Errorf("TakeN(0) = %+v, %v; want 48 from the local count", res, err)
	}
	if res, err := s.TakeN(bg, "unseen", lim, 0); err != nil || res.Source != floodgate.SourceLease || res.Remaining != 50 {
		t.Errorf("TakeN(0) on an unseen key = %+v, %v; want a full bucket", res, err)
	}
}

// TestCreditWithinItsShare: a take larger than the credit, or than the
// shared bucket held by Redis's last answer here, goes to Redis.
func TestCreditWithinItsShare(t *testing.T) {
	srv := sharedServer(t)
	clock := newFakeClock()
	// A lease time of 60 s: charges go out every 3 s, after the takes
	// below, whose counts they would change.
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(clock),
		redisstore.WithLeases(time.Minute, 100), redisstore.WithCredit())
	lim := floodgate.Limit{Rate: 1.0 / 6, Burst: 50} // credit ⌊10⌋
	if res, err := s.TakeN(bg, "big", lim, 11); err != nil || !res.Allowed || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN(11) = %+v, %v; want decided by Redis", res, err)
	}
	// Redis answered 39 (the refill since is not counted here): 6 on
	// credit leave 33 by this count.
	clock.Advance(61 * time.Second) // not hot (a gap above d): no lease
	if res, err := s.TakeN(bg, "big", lim, 6); err != nil || res.Source != floodgate.SourceLease || res.Remaining != 33 {
		t.Fatalf("TakeN(6) = %+v, %v; want on credit, 33 remaining", res, err)
	}
	// 5 more would hold 11 on credit, beyond the 10: to Redis.
	clock.Advance(61 * time.Second)
	if res, err := s.TakeN(bg, "big", lim, 5); err != nil || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN(5) = %+v, %v; want decided by Redis", res, err)
	}
	res, err := s.TakeN(bg, "small", floodgate.Limit{Rate: 0.01, Burst: 5}, 1) // ⌊0.6⌋ = 0: no credit
	if err != nil || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN under a limit whose credit is 0 = %+v, %v; want decided by Redis", res, err)
	}
}

// TestCreditStopsWhenShort: a charge that finds the shared bucket empty
// leaves it owing, and this process takes nothing more on credit there:
// its next take goes to Redis, which refuses it.
func TestCreditStopsWhenShort(t *testing.T) {
	clock := newFakeClock()
	other, s := creditPair(t, clock, 100*time.Millisecond)
	lim := floodgate.PerSecond(10, 10) // credit 1
	if res, err := other.TakeN(bg, "k", lim, 10); err != nil || !res.Allowed {
		t.Fatalf("draining TakeN = %+v, %v", res, err)
	}
	// No answer here yet: the bucket counts as full, and 1 is admitted on
	// credit, beyond the limit, as the bound allows.
	if res, err := s.TakeN(bg, "k", lim, 1); err != nil || !res.Allowed || res.Source != floodgate.SourceLease {
		t.Fatalf("TakeN = %+v, %v; want admitted on credit", res, err)
	}
	eventually(t, "the charge", func() bool {
		p, err := other.Peek(bg, "k", lim)
		return err == nil && p.Owed == 1
	})
	clock.Advance(150 * time.Millisecond) // 1.5 tokens refilled: 0.5 held
	res, err := s.TakeN(bg, "k", lim, 1)
	if err != nil || res.Allowed || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN after the charge = %+v, %v; want refused by Redis", res, err)
	}
	if st := s.Stats(); st.Credit != 1 {
		t.Errorf("Stats().Credit = %d, want 1", st.Credit)
	}
}

// TestCreditRefundIsLocal: tokens taken on credit and not yet sent are
// given back in process: no call, and nothing reaches the shared bucket.
func TestCreditRefundIsLocal(t *testing.T) {
	srv := sharedServer(t)
	// A lease time of 10 s: charges go out every 500 ms, long after the
	// refunds below.
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(newFakeClock()),
		redisstore.WithLeases(10*time.Second, 100), redisstore.WithCredit())
	lim := floodgate.PerSecond(1, 10) // credit 10
	r, err := s.ReserveN(bg, "resv", lim, 4)
	if err != nil || !r.Result.Allowed || r.Result.Source != floodgate.SourceLease {
		t.Fatalf("ReserveN = %+v, %v; want on credit", r.Result, err)
	}
	if res, err := r.Settle(bg, 0); err != nil || res.Remaining != 10 {
		t.Fatalf("Settle(0) = %+v, %v; want 10 remaining", res, err)
	}
	if res, err := s.TakeN(bg, "take", lim, 3); err != nil || res.Source != floodgate.SourceLease {
		t.Fatalf("TakeN = %+v, %v; want on credit", res, err)
	}
	if err := s.Refund(bg, "take", lim, 3); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Redis != 0 || st.Errors != 0 {
		t.Fatalf("Stats = %+v, want no call", st)
	}
	// A settle above the estimate charges the difference on Redis; the
	// estimate follows with the flusher.
	r, err = s.ReserveN(bg, "over", lim, 4)
	if err != nil || r.Result.Source != floodgate.SourceLease {
		t.Fatalf("ReserveN = %+v, %v; want on credit", r.Result, err)
	}
	if _, err := r.Settle(bg, 6); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the charge", func() bool {
		p, err := s.Peek(bg, "over", lim)
		return err == nil && p.Remaining == 4
	})
	time.Sleep(600 * time.Millisecond) // a flush after the refunds
	for _, key := range []string{"resv", "take"} {
		if p, err := s.Peek(bg, key, lim); err != nil || p.Remaining != 10 {
			t.Errorf("Peek(%s) = %+v, %v; want the full 10: refunded credit is never charged", key, p, err)
		}
	}
}

// TestCreditBound checks the documented bound under concurrency from three
// stores on real time: admitted ≤ burst + rate·(t + (2N+1)·lease time).
// Each store takes its whole credit at a time, at a pace that never leases,
// and together they ask for 2.7 times the rate: stores that kept taking
// on credit from a bucket they had seen short would admit most of it.
func TestCreditBound(t *testing.T) {
	srv := sharedServer(t)
	pfx := prefix(t)
	lim := floodgate.PerSecond(50, 10)
	lease := 100 * time.Millisecond
	credit := 5 // ⌊50 × 0.1⌋
	const stores = 3
	var admitted, asked, onCredit atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(2 * time.Second)
	for range stores {
		s, err := redisstore.New(newClient(t, srv.Addr), redisstore.WithPrefix(pfx), redisstore.WithDeadline(5*time.Second),
			redisstore.WithLeases(lease, 100), redisstore.WithCredit())
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for time.Now().Before(stop) {
				asked.Add(int64(credit))
				if res, _ := s.TakeN(bg, "k", lim, credit); res.Allowed {
					admitted.Add(int64(credit))
				}
				time.Sleep(lease + 10*time.Millisecond)
			}
			onCredit.Add(int64(s.Stats().Credit))
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := float64(lim.Burst) + lim.Rate*(elapsed+(2*stores+1)*lease).Seconds()
	got := float64(admitted.Load())
	if got > bound {
		t.Errorf("admitted %v of %d asked in %v, more than burst + rate·(t+(2N+1)·d) = %v", got, asked.Load(), elapsed, bound)
	}
	if onCredit.Load() == 0 {
		t.Errorf("no take on credit: the test checks nothing")
	}
	t.Logf("admitted %v of %d asked in %v (bound %.0f), %d on credit", got, asked.Load(), elapsed, bound, onCredit.Load())
}

// TestReserveLocal: ReserveLocal takes on credit or from a lease, and
// leaves to ReserveN, taking nothing, what needs Redis.
func TestReserveLocal(t *testing.T) {
	srv := sharedServer(t)
	lim := floodgate.PerSecond(100, 50) // credit 10, leases up to 10
	plain := newStore(t, newClient(t, srv.Addr))
	if _, ok := plain.ReserveLocal("k", lim, 1); ok {
		t.Errorf("ReserveLocal without leases reported a local take")
	}
	clock := newFakeClock()
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(clock),
		redisstore.WithLeases(100*time.Millisecond, 100), redisstore.WithCredit())
	for _, n := range []int{0, 11, 51} {
		if _, ok := s.ReserveLocal("k", lim, n); ok {
			t.Errorf("ReserveLocal(%d) reported a local take: credit is 10", n)
		}
	}
	r, ok := s.ReserveLocal("k", lim, 4)
	if !ok || !r.Result.Allowed || r.Result.Source != floodgate.SourceLease || r.Tokens() != 4 {
		t.Fatalf("ReserveLocal(4) = %+v, %v; want 4 on credit", r, ok)
	}
	// The same key at once is hot: its take buys a lease from Redis.
	if _, ok := s.ReserveLocal("k", lim, 1); ok {
		t.Errorf("ReserveLocal on a hot key reported a local take; want a lease from Redis")
	}
	if res, err := s.TakeN(bg, "k", lim, 1); err != nil || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN on the hot key = %+v, %v; want a lease from Redis", res, err)
	}
	if r, ok := s.ReserveLocal("k", lim, 1); !ok || r.Result.Source != floodgate.SourceLease {
		t.Errorf("ReserveLocal after the lease = %+v, %v; want a take from it", r.Result, ok)
	}
	if _, err := r.Settle(bg, 0); err != nil {
		t.Fatal(err)
	}
}

// TestCreditSettleIntoDebt: a settle that leaves the bucket owing stops
// credit on it, and the tokens taken on credit before are still charged.
func TestCreditSettleIntoDebt(t *testing.T) {
	clock := newFakeClock()
	// A lease time of 10 s: charges go out every 500 ms.
	other, s := creditPair(t, clock, 10*time.Second)
	lim := floodgate.PerSecond(1, 10) // credit 10
	if res, err := s.TakeN(bg, "k", lim, 3); err != nil || res.Source != floodgate.SourceLease {
		t.Fatalf("TakeN = %+v, %v; want on credit", res, err)
	}
	if res, err := other.TakeN(bg, "k", lim, 10); err != nil || !res.Allowed {
		t.Fatalf("draining TakeN = %+v, %v", res, err)
	}
	if res, err := s.SettleN(bg, "k", lim, 0, 5); err != nil || res.Owed != 5 {
		t.Fatalf("SettleN = %+v, %v; want 5 owed", res, err)
	}
	clock.Advance(20 * time.Second) // not hot; 20 tokens refilled: 10 held, 5 of them owed... by Redis's count
	if res, err := s.TakeN(bg, "k", lim, 1); err != nil || res.Source == floodgate.SourceLease {
		t.Fatalf("TakeN after the settle = %+v, %v; want decided by Redis: the bucket owed at its last answer", res, err)
	}
	eventually(t, "the credit's charge", func() bool {
		p, err := other.Peek(bg, "k", lim)
		// 10 refilled over 20 s (the burst) less 1 taken less the 3 on credit.
		return err == nil && p.Remaining == 6
	})
}
