package redisstore_test

import (
	"github.com/floodgate-go/floodgate/remote"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/redisstore"
)

// TestTTLFollowsLimitChange: a bucket drained under a fast limit gets a
// short TTL. A refused take under a slower limit must lengthen it, or the
// key expires and the bucket comes back full long before the slow limit
// would have refilled it.
func TestTTLFollowsLimitChange(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	s := newStore(t, c) // server clock: no TTL slack
	fast, slow := floodgate.PerSecond(100, 20), floodgate.PerSecond(1, 20)
	if res, _ := s.TakeN(bg, "k", fast, 20); !res.Allowed {
		t.Fatalf("drain under %v: %+v", fast, res)
	}
	if pttl := c.PTTL(bg, s.Key("k")).Val(); pttl > 200*time.Millisecond+redisstore.Linger {
		t.Fatalf("PTTL %v after draining under %v, want ≤ 200ms + %v", pttl, fast, redisstore.Linger)
	}
	if res, _ := s.TakeN(bg, "k", slow, 1); res.Allowed {
		t.Fatalf("take under %v right after the drain: %+v, want refused", slow, res)
	}
	// 20 tokens at 1/s: about 20 s to full.
	if pttl := c.PTTL(bg, s.Key("k")).Val(); pttl < 15*time.Second {
		t.Errorf("PTTL %v after a refused take under %v, want the ~20s it takes to fill", pttl, slow)
	}
	if _, err := s.Peek(bg, "k", floodgate.PerSecond(0.1, 20)); err != nil {
		t.Fatal(err)
	}
	if pttl := c.PTTL(bg, s.Key("k")).Val(); pttl < 150*time.Second {
		t.Errorf("PTTL %v after a peek under 0.1/s, want the ~200s it takes to fill", pttl)
	}
	time.Sleep(250 * time.Millisecond) // past the fast limit's TTL
	admitted := 0
	for range 5 {
		if res, _ := s.TakeN(bg, "k", slow, 1); res.Allowed {
			admitted++
		}
	}
	if admitted != 0 {
		t.Errorf("%d takes admitted 250ms after the drain under %v, want 0", admitted, slow)
	}
}

// TestRetryAfterSuffices: a retry exactly RetryAfter later succeeds, although
// the script counts whole microseconds and RetryAfter is a Duration.
func TestRetryAfterSuffices(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock))
	for _, lim := range []floodgate.Limit{floodgate.PerSecond(3, 1), floodgate.PerSecond(7, 2), floodgate.PerSecond(1000.0/3, 1), floodgate.PerSecond(0.3, 1)} {
		key := lim.String()
		for i := range 20 {
			clock.Advance(time.Duration(i) * 137 * time.Nanosecond) // vary the sub-µs phase
			s.TakeN(bg, key, lim, lim.Burst)
			res, err := s.TakeN(bg, key, lim, 1)
			if err != nil || res.Allowed {
				t.Fatalf("%v: take on a drained bucket = %+v, %v", lim, res, err)
			}
			if res.RetryAfter%time.Microsecond != 0 {
				t.Errorf("%v: RetryAfter %v is not whole microseconds", lim, res.RetryAfter)
			}
			clock.Advance(res.RetryAfter)
			if res2, _ := s.TakeN(bg, key, lim, 1); !res2.Allowed {
				t.Fatalf("%v: retry after exactly RetryAfter (%v) refused: %+v", lim, res.RetryAfter, res2)
			}
		}
	}
}

// TestNotABucket: a key that holds something else fails its own decisions,
// which go to the failure policy, and nothing else: the breaker stays
// closed and other keys are decided by Redis.
func TestNotABucket(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	var errs []error
	var mu sync.Mutex
	s := newStore(t, c, redisstore.WithBreaker(2, time.Minute), redisstore.WithOnError(func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}))
	lim := floodgate.PerSecond(10, 10)
	c.Set(bg, s.Key("string"), "legacy value", 0)
	c.HSet(bg, s.Key("hash"), "f", "v")
	for _, key := range []string{"string", "hash"} {
		for range 3 {
			res, err := s.TakeN(bg, key, lim, 1)
			if err != nil || res.Source != floodgate.SourceFallback {
				t.Errorf("TakeN on the %s key = %+v, %v; want decided by the fallback", key, res, err)
			}
		}
		if v := c.Type(bg, s.Key(key)).Val(); v != key {
			t.Errorf("the %s key is now a %s: it must be left alone", key, v)
		}
	}
	if res, err := s.TakeN(bg, "other", lim, 1); err != nil || res.Source != floodgate.SourceRedis {
		t.Errorf("TakeN on a bucket = %+v, %v; want decided by Redis", res, err)
	}
	if st := s.Stats(); st.Trips != 0 || st.Breaker != remote.BreakerClosed || st.Errors != 6 {
		t.Errorf("Stats = %+v, want no trips, breaker closed, 6 errors", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 6 || redisstore.KindOf(errs[0]) != remote.KindScript {
		t.Errorf("OnError got %v, want 6 errors of kind script", errs)
	}
}

// TestNotABucketInBatch: in a batch, a key that is not a bucket must not
// fail the decisions made before it in the same script call, which Redis
// has already applied: the fallback deciding them again would count them
// twice. Redis is paused so that the later takes queue into one batch.
func TestNotABucketInBatch(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	s := newStore(t, c, redisstore.WithBatching(64))
	lim := floodgate.PerSecond(0, 5) // no refill
	if res, _ := s.TakeN(bg, "good", lim, 5); !res.Allowed {
		t.Fatal(res)
	}
	c.Set(bg, s.Key("bad"), "not a bucket", 0)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var good, bad floodgate.Result
	wg.Go(func() { s.TakeN(bg, "lead", lim, 1) }) // on the wire while Redis is paused
	time.Sleep(50 * time.Millisecond)
	wg.Go(func() { good, _ = s.TakeN(bg, "good", lim, 1) })
	wg.Go(func() { bad, _ = s.TakeN(bg, "bad", lim, 1) })
	time.Sleep(50 * time.Millisecond)
	srv.Cont()
	wg.Wait()
	if good.Allowed || good.Source != floodgate.SourceRedis {
		t.Errorf("take on a drained bucket batched with a bad key = %+v, want refused by Redis", good)
	}
	if bad.Source != floodgate.SourceFallback {
		t.Errorf("take on the bad key = %+v, want decided by the fallback", bad)
	}
}

// TestLocalShare: the local fallback's share is the limit divided by
// WithLocalDivisor, exactly when it divides evenly, and starts empty when
// Redis goes away: it goes on at its part of the rate, with no burst of
// its own.
func TestLocalShare(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	clock := newFakeClock()
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(c, redisstore.WithLocalDivisor(4), redisstore.WithDeadline(50*time.Millisecond),
		redisstore.WithFallback(m), redisstore.WithClientClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	lim := floodgate.PerSecond(8, 8)
	admitted := 0
	for range 5 { // over a second, a take every 250 ms
		res, err := s.TakeN(bg, "k", lim, 1)
		if err != nil || res.Source != floodgate.SourceFallback || res.Limit != lim.Scale(1.0/4) {
			t.Fatalf("TakeN with Redis unreachable = %+v, %v", res, err)
		}
		if res.Allowed {
			admitted++
		}
		clock.Advance(250 * time.Millisecond)
	}
	if admitted != 2 {
		t.Errorf("the local fallback admitted %d in a second, want 8/4 = 2", admitted)
	}
}

// TestRefusalsDoNotWrite: refusals under an unchanged limit leave the key's
// TTL alone, also for a bucket that never refills (rate 0), whose TTL sits
// at the cap: otherwise each refusal would be a replicated write.
func TestRefusalsDoNotWrite(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	s := newStore(t, c)
	for _, lim := range []floodgate.Limit{floodgate.PerSecond(0, 2), floodgate.PerSecond(10, 2)} {
		key := "k" + lim.String()
		if res, _ := s.TakeN(bg, key, lim, 2); !res.Allowed {
			t.Fatalf("%v: drain refused", lim)
		}
		before := c.PTTL(bg, s.Key(key)).Val()
		time.Sleep(20 * time.Millisecond)
		for range 5 {
			if res, _ := s.TakeN(bg, key, lim, 2); res.Allowed {
				t.Fatalf("%v: a take on the drained bucket was allowed", lim)
			}
		}
		if after := c.PTTL(bg, s.Key(key)).Val(); after > before {
			t.Errorf("%v: refusals moved the TTL from %v to %v", lim, before, after)
		}
	}
}
