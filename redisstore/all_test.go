package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
)

// reserveAll runs ReserveAll and returns the refused index and each
// take's Result and Tokens.
func reserveAll(t *testing.T, s *redisstore.Store, takes ...floodgate.Take) (int, []floodgate.Result, []int) {
	t.Helper()
	rs := make([]floodgate.Reservation, len(takes))
	refused, err := s.ReserveAll(bg, takes, rs)
	if err != nil {
		t.Fatalf("ReserveAll = %d, %v", refused, err)
	}
	res := make([]floodgate.Result, len(rs))
	tokens := make([]int, len(rs))
	for i := range rs {
		res[i], tokens[i] = rs[i].Result, rs[i].Tokens()
	}
	return refused, res, tokens
}

// remaining peeks key's bucket through a store without leases.
func remaining(t *testing.T, s *redisstore.Store, key string, lim floodgate.Limit) int {
	t.Helper()
	res, err := s.Peek(bg, key, lim)
	if err != nil {
		t.Fatal(err)
	}
	return res.Remaining
}

// TestReserveAll: a request's takes are reserved all or none, in one
// script call; a refused request takes nothing from any bucket, and each
// take reports what its bucket decided alone.
func TestReserveAll(t *testing.T) {
	srv := sharedServer(t)
	for _, mode := range []struct {
		name string
		opts []redisstore.Option
	}{{"single", nil}, {"batched", []redisstore.Option{redisstore.WithBatching(8)}}} {
		t.Run(mode.name, func(t *testing.T) {
			c := newClient(t, srv.Addr)
			clock := newFakeClock()
			s := newStore(t, c, append(mode.opts, redisstore.WithClientClock(clock))...)
			lim := floodgate.PerSecond(1, 10)
			a, b := floodgate.Take{Key: "a", Limit: lim, N: 3}, floodgate.Take{Key: "b", Limit: lim, N: 8}
			if refused, res, tokens := reserveAll(t, s, a, b); refused != -1 || !res[0].Allowed || !res[1].Allowed || tokens[0] != 3 || tokens[1] != 8 {
				t.Fatalf("ReserveAll(a 3, b 8) = %d, %+v, tokens %v; want both reserved", refused, res, tokens)
			}
			// b holds 2: a second request fits on a, not on b.
			refused, res, tokens := reserveAll(t, s, a, b)
			if refused != 1 || !res[0].Allowed || res[1].Allowed || tokens[0] != 0 || tokens[1] != 0 {
				t.Fatalf("ReserveAll(a 3, b 8) again = %d, %+v, tokens %v; want b refused, a fitted, nothing held", refused, res, tokens)
			}
			if res[0].Remaining != 7 || res[1].Remaining != 2 || res[1].RetryAfter != 6*time.Second {
				t.Errorf("Results %+v; want a with 7 left, b with 2 and 6 s to wait", res)
			}
			if got := remaining(t, s, "a", lim); got != 7 {
				t.Errorf("a holds %d after the refused request, want 7: nothing taken", got)
			}
			// The same bucket twice in one request counts twice.
			if refused, _, _ := reserveAll(t, s, floodgate.Take{Key: "a", Limit: lim, N: 4}, floodgate.Take{Key: "a", Limit: lim, N: 4}); refused != 1 {
				t.Errorf("ReserveAll(a 4, a 4) on 7 = %d, want the second refused", refused)
			}
			if got := remaining(t, s, "a", lim); got != 7 {
				t.Errorf("a holds %d, want 7", got)
			}
			// An invalid take is refused before anything is taken.
			rs := make([]floodgate.Reservation, 2)
			if refused, err := s.ReserveAll(bg, []floodgate.Take{a, {Key: "b", Limit: lim, N: 11}}, rs); refused != 1 || err == nil {
				t.Errorf("ReserveAll with a take above the burst = %d, %v; want 1 and an error", refused, err)
			}
			if got := remaining(t, s, "a", lim); got != 7 {
				t.Errorf("a holds %d after an invalid request, want 7", got)
			}
		})
	}
}

// TestReserveAllDenyCache: a take the deny cache refuses refuses the
// request with no take; the other takes are peeked together.
func TestReserveAllDenyCache(t *testing.T) {
	srv := sharedServer(t)
	clock := newFakeClock()
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(clock), redisstore.WithDenyCache(8), redisstore.WithBatching(8))
	lim := floodgate.PerSecond(1, 10)
	s.TakeN(bg, "b", lim, 10)
	if res, _ := s.TakeN(bg, "b", lim, 1); res.Allowed {
		t.Fatal("b not drained")
	}
	refused, res, _ := reserveAll(t, s, floodgate.Take{Key: "a", Limit: lim, N: 1}, floodgate.Take{Key: "b", Limit: lim, N: 1})
	if refused != 1 || res[1].Source != floodgate.SourceCache || !res[0].Allowed || res[0].Remaining != 10 {
		t.Errorf("ReserveAll(a, b) with b cached = %d, %+v; want b refused by the cache, a peeked full", refused, res)
	}
	if got := remaining(t, s, "a", lim); got != 10 {
		t.Errorf("a holds %d, want 10", got)
	}
}

// TestReserveAllLeases: a take spent from a lease goes back to it when
// another take refuses the request.
func TestReserveAllLeases(t *testing.T) {
	srv := sharedServer(t)
	clock := newFakeClock()
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(clock), redisstore.WithLeases(time.Second, 8))
	lim := floodgate.PerSecond(1, 80)
	s.TakeN(bg, "hot", lim, 1)
	if res, _ := s.TakeN(bg, "hot", lim, 1); !res.Allowed {
		t.Fatal(res) // leases 10 beyond its own
	}
	s.TakeN(bg, "cold", lim, 80)
	before := s.Stats().Lease
	refused, _, _ := reserveAll(t, s, floodgate.Take{Key: "hot", Limit: lim, N: 2}, floodgate.Take{Key: "cold", Limit: lim, N: 1})
	if refused != 1 || s.Stats().Lease != before+1 {
		t.Fatalf("ReserveAll(hot, cold) = %d, Stats %+v; want cold refused, hot from its lease", refused, s.Stats())
	}
	// The 10 leased tokens are all there: 5 takes of 2 from the lease.
	for i := range 5 {
		if res, _ := s.TakeN(bg, "hot", lim, 2); !res.Allowed || res.Source != floodgate.SourceLease {
			t.Fatalf("take %d from the lease = %+v", i, res)
		}
	}
}

// TestReserveAllCountsOnce: when Redis cannot decide one take of a
// request, the failure policy decides every take, the leased ones and those
// under floodgate.Inf too, and Stats counts each take once: a take decided
// in process, then handed to the failure policy, is not also counted as
// decided in process.
func TestReserveAllCountsOnce(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	s := newStore(t, c, redisstore.WithPrefix(prefix(t)), redisstore.WithClientClock(newFakeClock()), redisstore.WithLeases(time.Second, 8))
	lim := floodgate.PerSecond(1, 80)
	s.TakeN(bg, "hot", lim, 1)
	if res, _ := s.TakeN(bg, "hot", lim, 1); !res.Allowed {
		t.Fatal(res) // leases 10 beyond its own
	}
	if err := c.Set(bg, s.Key("bad"), "not a bucket", 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	reserveAll(t, s, floodgate.Take{Key: "hot", Limit: lim, N: 1}, floodgate.Take{Key: "free", Limit: floodgate.Inf, N: 1},
		floodgate.Take{Key: "bad", Limit: lim, N: 1})
	after := s.Stats()
	decided := func(st redisstore.Stats) uint64 {
		return st.Redis + st.Cache + st.Lease + st.Fallback + st.FailOpen + st.FailClosed
	}
	if got := decided(after) - decided(before); got != 3 || after.Lease-before.Lease != 1 || after.Fallback-before.Fallback != 1 {
		t.Fatalf("Stats before %+v, after %+v: %d decisions counted for 3 takes, want 3: hot's from its lease, bad's by the fallback", before, after, got)
	}
}

// TestReserveAllCluster: takes in different slots of a Cluster are one
// group per slot; what one slot took is given back when another refused.
func TestReserveAllCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, redisstore.WithClientClock(newFakeClock()), redisstore.WithBatching(8))
	lim := floodgate.PerSecond(1, 10)
	keys := []string{"k0", "k1", "k2", "k3", "k4"} // some in other slots than k0
	s.TakeN(bg, keys[4], lim, 10)
	var takes []floodgate.Take
	for _, k := range keys {
		takes = append(takes, floodgate.Take{Key: k, Limit: lim, N: 2})
	}
	refused, res, tokens := reserveAll(t, s, takes...)
	if refused != 4 {
		t.Fatalf("ReserveAll = %d, %+v; want the drained k4 refused", refused, res)
	}
	for i, k := range keys[:4] {
		if got := remaining(t, s, k, lim); got != 10 || tokens[i] != 0 || !res[i].Allowed || res[i].Remaining != 10 {
			t.Errorf("%s holds %d, reported %+v with %d tokens; want 10 held and reported, nothing reserved", k, got, res[i], tokens[i])
		}
	}
}

// TestLeaseLostBucket: a bucket that disappears from Redis (a restart
// without persistence, FLUSHALL) is recreated from what the store that
// decided on it last saw, not full: full, it would hand out what was
// already taken again.
func TestLeaseLostBucket(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	pfx := redisstore.WithPrefix(prefix(t))
	s := newStore(t, c, pfx, redisstore.WithClientClock(newFakeClock()), redisstore.WithLeases(time.Second, 8))
	lim := floodgate.PerSecond(1, 80) // no refill to speak of
	s.TakeN(bg, "k", lim, 1)
	s.TakeN(bg, "k", lim, 1) // leases 10
	if err := c.Del(bg, s.Key("k")).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if res, _ := s.TakeN(bg, "k", lim, 1); !res.Allowed || res.Source != floodgate.SourceLease {
			t.Fatalf("take %d = %+v, want from the lease", i, res)
		}
	}
	// The bucket held 80 − 1 − 11 = 68: a lease of 1 + 10 leaves 57, and
	// the new lease's 10; full, 80 − 11 + 10.
	if res, _ := s.TakeN(bg, "k", lim, 1); !res.Allowed || res.Remaining != 67 {
		t.Errorf("TakeN on the lost bucket = %+v, want 67 left: recreated from the hint", res)
	}
	// Without a recent answer, a missing bucket is a full one.
	if err := c.Del(bg, s.Key("k")).Err(); err != nil {
		t.Fatal(err)
	}
	other := newStore(t, c, pfx, redisstore.WithClientClock(newFakeClock()), redisstore.WithLeases(time.Second, 8))
	if res, _ := other.TakeN(bg, "k", lim, 1); res.Remaining != 79 {
		t.Errorf("TakeN from a store that never saw it = %+v, want 79 left", res)
	}
}
