package redisstore_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
)

// shareStores returns n stores on one bucket space with shares f, once
// each has counted all n: the first take of each goes to Redis, which
// registers it.
func shareStores(t *testing.T, srv *redistest.Server, n int, f float64, opts ...redisstore.Option) []*redisstore.Store {
	t.Helper()
	t.Cleanup(redisstore.SetInstancePeriod(20 * time.Millisecond))
	pfx := redisstore.WithPrefix(prefix(t))
	stores := make([]*redisstore.Store, n)
	for i := range stores {
		stores[i] = newStore(t, newClient(t, srv.Addr), append([]redisstore.Option{pfx, redisstore.WithShares(f, 1000)}, opts...)...)
	}
	eventually(t, "stores counting each other", func() bool {
		for _, s := range stores {
			s.Peek(bg, "register", floodgate.PerSecond(1, 1))
		}
		for _, s := range stores {
			if s.Stats().Instances != n {
				return false
			}
		}
		return true
	})
	return stores
}

// TestSharesDecideWithoutRedis: a store that has counted the instances
// decides takes within its share in process, and only what the share
// does not cover goes to Redis, under the pool's part of the limit.
func TestSharesDecideWithoutRedis(t *testing.T) {
	srv := sharedServer(t)
	s := shareStores(t, srv, 1, 0.5)[0]
	lim := floodgate.Limit{Rate: 0.001, Burst: 10} // share 5, pool 5
	before := s.Stats()
	for i := range 5 {
		res, err := s.TakeN(bg, "k", lim, 1)
		if err != nil || !res.Allowed || res.Source != floodgate.SourceLease || res.Limit != lim || res.Remaining != 8-2*i {
			t.Fatalf("take %d = %+v, %v; want admitted from the share, %d remaining of the whole", i, res, err, 8-2*i)
		}
	}
	if st := s.Stats(); st.Shares-before.Shares != 5 || st.Redis != before.Redis {
		t.Fatalf("Stats = %+v, want 5 takes from the share and no call", st)
	}
	// The pool holds the other half: five more, from Redis.
	for i := range 5 {
		res, err := s.TakeN(bg, "k", lim, 1)
		if err != nil || !res.Allowed || res.Source != floodgate.SourceRedis || res.Limit != lim {
			t.Fatalf("pool take %d = %+v, %v; want admitted by Redis under the whole limit", i, res, err)
		}
	}
	res, err := s.TakeN(bg, "k", lim, 1)
	if err != nil || res.Allowed {
		t.Fatalf("11th take = %+v, %v; want refused: the share and the pool hold the burst", res, err)
	}
	// Redis holds the pool's part only: 5 tokens, none left.
	if p, err := s.Peek(bg, "k", lim); err != nil || p.Remaining != 0 {
		t.Errorf("Peek = %+v, %v; want nothing left", p, err)
	}
}

// TestSharesHeartbeat: a store with shares registers by itself, deciding
// nothing: an idle instance stays counted, so that it does not wake to a
// count of one.
func TestSharesHeartbeat(t *testing.T) {
	srv := sharedServer(t)
	t.Cleanup(redisstore.SetInstancePeriod(20 * time.Millisecond))
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithShares(0.5, 100))
	eventually(t, "a registration without a decision", func() bool { return s.Stats().Instances == 1 })
	if st := s.Stats(); st.Redis+st.Lease+st.Cache != 0 {
		t.Fatalf("Stats = %+v, want no decision", st)
	}
	res, err := s.TakeN(bg, "k", floodgate.Limit{Rate: 0.001, Burst: 10}, 1)
	if err != nil || res.Source != floodgate.SourceLease {
		t.Errorf("first TakeN = %+v, %v; want the share's", res, err)
	}
}

// TestSharesNotBeforeCount: a store that has not counted the instances
// yet decides nothing on a share, and takes from the smallest pool any
// count gives, as if it were the only instance: a new instance does not
// know its share, and must not take the others'.
func TestSharesNotBeforeCount(t *testing.T) {
	srv := sharedServer(t)
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithShares(0.5, 100))
	lim := floodgate.PerSecond(10, 10)
	res, err := s.TakeN(bg, "k", lim, 1)
	if err != nil || !res.Allowed || res.Source != floodgate.SourceRedis || res.Remaining != 4 || res.Limit != lim {
		t.Fatalf("TakeN = %+v, %v; want Redis's decision on the pool of 5, under the whole limit", res, err)
	}
}

// TestSharesBound: three stores with shares, on real time, asked for
// three times the rate in equal parts, admit at most burst + rate×t, and
// at least most of it; each decides most takes on its share. One store
// alone (its peers silent but counted) is held to its share and the pool:
// (1 − f + f/N) of the limit.
func TestSharesBound(t *testing.T) {
	srv := sharedServer(t)
	stores := shareStores(t, srv, 3, 0.5)
	lim := floodgate.PerSecond(60, 30) // share 5 at 10/s each, pool 15 at 30/s
	run := func(key string, who []*redisstore.Store) (admitted int64, elapsed time.Duration) {
		var n atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		stop := start.Add(1500 * time.Millisecond)
		for _, s := range who {
			wg.Go(func() {
				for time.Now().Before(stop) {
					if res, _ := s.TakeN(bg, key, lim, 1); res.Allowed {
						n.Add(1)
					}
					time.Sleep(time.Second / 60) // 60/s a store
				}
			})
		}
		wg.Wait()
		return n.Load(), time.Since(start)
	}
	before := stores[0].Stats().Shares
	got, elapsed := run("even", stores)
	bound := float64(lim.Burst) + lim.Rate*elapsed.Seconds()
	if float64(got) > bound {
		t.Errorf("3 stores admitted %d in %v, more than burst + rate×t = %.0f", got, elapsed, bound)
	}
	if float64(got) < 0.8*bound {
		t.Errorf("3 stores admitted %d in %v, less than 80%% of burst + rate×t = %.0f", got, elapsed, bound)
	}
	if shared := stores[0].Stats().Shares - before; shared == 0 {
		t.Error("no take from the share: the test checks nothing of shares")
	}
	t.Logf("evenly: admitted %d in %v (bound %.0f)", got, elapsed, bound)

	got, elapsed = run("skewed", stores[:1])
	// One store: its share, 5 + 10/s, and the pool, 15 + 30/s.
	one := 5 + 15 + 40*elapsed.Seconds()
	if float64(got) > one+1 || float64(got) < 0.8*one {
		t.Errorf("one store admitted %d in %v, not about its share and the pool, %.0f", got, elapsed, one)
	}
	t.Logf("one store: admitted %d in %v (its share and the pool: %.0f)", got, elapsed, one)
}

// TestSharesReservations: a reservation from the share settles on it, and
// its debt keeps the share refusing; the pool's reservations settle on
// Redis.
func TestSharesReservations(t *testing.T) {
	srv := sharedServer(t)
	clock := newFakeClock()
	s := shareStores(t, srv, 1, 0.5, redisstore.WithClientClock(clock))[0]
	lim := floodgate.Limit{Rate: 1, Burst: 10} // share 5, pool 5
	r, err := s.ReserveN(bg, "k", lim, 2)
	if err != nil || !r.Result.Allowed || r.Result.Source != floodgate.SourceLease {
		t.Fatalf("ReserveN = %+v, %v; want reserved from the share", r.Result, err)
	}
	if _, err := r.Settle(bg, 8); err != nil { // 6 more: the share owes 3
		t.Fatalf("Settle: %v", err)
	}
	if r0, err := s.ReserveN(bg, "k", lim, 0); err != nil || r0.Result.Allowed || r0.Result.Owed == 0 {
		t.Errorf("ReserveN(0) while the share owes = %+v, %v; want refused, owing", r0.Result, err)
	}
	res, err := s.TakeN(bg, "k", lim, 1)
	if err != nil || !res.Allowed || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN after the share's debt = %+v, %v; want the pool's", res, err)
	}
	r2, err := s.ReserveN(bg, "k", lim, 4)
	if err != nil || !r2.Result.Allowed || r2.Result.Source != floodgate.SourceRedis || r2.Result.Limit != lim {
		t.Fatalf("second ReserveN = %+v, %v; want reserved on the pool", r2.Result, err)
	}
	if _, err := r2.Settle(bg, 1); err != nil { // 3 back to the pool
		t.Fatalf("Settle on the pool: %v", err)
	}
	if p, err := s.Peek(bg, "k", lim); err != nil || p.Remaining != 3 || p.Limit != lim {
		t.Errorf("Peek = %+v, %v; want the pool's 5 − 1 − 4 + 3 = 3 (the share owes)", p, err)
	}
}

// TestSharesTooLarge: a take that neither the share nor the pool can hold
// at once, though the limit could, is refused for good; one above the
// limit's burst is the usual error.
func TestSharesTooLarge(t *testing.T) {
	srv := sharedServer(t)
	s := shareStores(t, srv, 1, 0.5)[0]
	lim := floodgate.PerSecond(10, 10) // share 5, pool 5
	res, err := s.TakeN(bg, "k", lim, 6)
	if err != nil || res.Allowed || res.RetryAfter != floodgate.Never || res.Limit != lim {
		t.Errorf("TakeN(6) = %+v, %v; want refused for good", res, err)
	}
	r, err := s.ReserveN(bg, "k", lim, 6)
	if err != nil || r.Result.Allowed || r.Result.RetryAfter != floodgate.Never {
		t.Errorf("ReserveN(6) = %+v, %v; want refused for good", r.Result, err)
	}
	if _, err := s.TakeN(bg, "k", lim, 11); !errors.Is(err, floodgate.ErrExceedsBurst) {
		t.Errorf("TakeN(11) error = %v, want ErrExceedsBurst", err)
	}
	// A take only the share can hold waits for it, not for good.
	big := shareStores(t, srv, 1, 0.8)[0] // share 8, pool 2
	if res, err := big.TakeN(bg, "k", lim, 5); err != nil || !res.Allowed || res.Source != floodgate.SourceLease {
		t.Fatalf("TakeN(5) = %+v, %v; want the share's", res, err)
	}
	if res, err := big.TakeN(bg, "k", lim, 5); err != nil || res.Allowed || res.RetryAfter <= 0 || res.RetryAfter > time.Second {
		t.Errorf("TakeN(5) with 3 left in the share = %+v, %v; want refused until the share holds 5 (about 250 ms)", res, err)
	}
	// A limit too small to share goes whole to Redis.
	small := floodgate.PerSecond(1, 1)
	if res, err := s.TakeN(bg, "small", small, 1); err != nil || !res.Allowed || res.Source != floodgate.SourceRedis {
		t.Errorf("TakeN under %v = %+v, %v; want Redis's", small, res, err)
	}
}

// TestSharesWhileRedisIsDown: shares keep deciding with Redis down, the
// pool's part going to the failure policy, until the others could have
// dropped this instance from their count (its registrations lapse after
// 5 s): from then on its share is theirs, and it decides nothing on it.
func TestSharesWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	s := shareStores(t, srv, 1, 0.5, redisstore.WithDeadline(100*time.Millisecond))[0]
	lim := floodgate.Limit{Rate: 0.001, Burst: 10} // share 5
	srv.Kill()
	start := time.Now()
	for i := range 5 {
		if res, err := s.TakeN(bg, "k", lim, 1); err != nil || !res.Allowed || res.Source != floodgate.SourceLease {
			t.Fatalf("take %d with Redis down = %+v, %v; want the share's", i, res, err)
		}
	}
	for i := range 5 {
		if res, err := s.TakeN(bg, "k", lim, 1); err != nil || res.Source == floodgate.SourceLease || res.Source == floodgate.SourceRedis {
			t.Fatalf("take %d beyond the share with Redis down = %+v, %v; want the failure policy's", i, res, err)
		}
	}
	if time.Since(start) > 4*time.Second {
		t.Skip("too slow to tell the share's last seconds from after")
	}
	time.Sleep(5*time.Second - time.Since(start))
	if res, err := s.TakeN(bg, "k2", lim, 1); err != nil || res.Source == floodgate.SourceLease {
		t.Errorf("take 5 s after Redis went down = %+v, %v; want the failure policy's, not the share's", res, err)
	}
}

// TestSharesDenied: Denied refuses nothing the share would admit, and
// what the deny cache holds for the pool otherwise.
func TestSharesDenied(t *testing.T) {
	srv := sharedServer(t)
	s := shareStores(t, srv, 1, 0.5, redisstore.WithDenyCache(100))[0]
	lim := floodgate.Limit{Rate: 0.001, Burst: 4} // share 2, pool 2
	for i := range 4 {
		if res, err := s.TakeN(bg, "k", lim, 1); err != nil || !res.Allowed {
			t.Fatalf("take %d = %+v, %v", i, res, err)
		}
		if _, denied := s.Denied("k", lim, 1); denied {
			t.Fatalf("Denied after take %d: the pool has not refused yet", i)
		}
	}
	if res, _ := s.TakeN(bg, "k", lim, 1); res.Allowed {
		t.Fatal("5th take admitted")
	}
	res, denied := s.Denied("k", lim, 1)
	if !denied || res.Limit != lim || res.Source != floodgate.SourceCache {
		t.Errorf("Denied = %+v, %v; want the cached refusal under the whole limit", res, denied)
	}
	if _, denied := s.Denied(fmt.Sprint("other"), lim, 1); denied {
		t.Error("Denied on a fresh key")
	}
}
