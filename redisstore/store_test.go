package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

func TestNewValidates(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tc := range []struct {
		name string
		opt  redisstore.Option
		want string // the option named
	}{
		{"empty prefix", redisstore.WithPrefix(""), "WithPrefix"},
		{"brace in prefix", redisstore.WithPrefix("a{b"), "WithPrefix"},
		{"brace in name", redisstore.WithName("x}"), "WithName"},
		{"zero deadline", redisstore.WithDeadline(0), "WithDeadline"},
		{"policy", redisstore.WithFailurePolicy(9), "WithFailurePolicy"},
		{"divisor", redisstore.WithLocalDivisor(0.5), "WithLocalDivisor"},
		{"NaN divisor", redisstore.WithLocalDivisor(math.NaN()), "WithLocalDivisor"},
		{"breaker failures", redisstore.WithBreaker(0, time.Second), "WithBreaker"},
		{"breaker cooldown", redisstore.WithBreaker(3, 0), "WithBreaker"},
		{"batch", redisstore.WithBatching(-1), "WithBatching"},
		{"cache", redisstore.WithDenyCache(-1), "WithDenyCache"},
		{"lease time", redisstore.WithLeases(-time.Second, 10), "WithLeases"},
		{"lease keys", redisstore.WithLeases(time.Second, 0), "WithLeases"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := redisstore.New(c, tc.opt)
			if !errors.Is(err, floodgate.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "redisstore: "+tc.want+"(") {
				t.Errorf("New(%s) error = %v, want ErrInvalidOption naming %s", tc.name, err, tc.want)
			}
		})
	}
	if _, err := redisstore.New(nil); !errors.Is(err, floodgate.ErrInvalidOption) {
		t.Errorf("New(nil) error = %v, want ErrInvalidOption", err)
	}
	if _, err := redisstore.New(c); err != nil {
		t.Errorf("New() with defaults: %v", err)
	}
}

func TestKeyLayout(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	s, err := redisstore.New(c, redisstore.WithPrefix("rl"), redisstore.WithName("push"))
	if err != nil {
		t.Fatal(err)
	}
	for subject, want := range map[string]string{
		"user:42":  "rl:{user:42}:push",
		"":         "rl:{}:push",
		"a}{b":     "rl:{a%7D%7Bb}:push",
		"{x}":      "rl:{%7Bx%7D}:push",
		"100%":     "rl:{100%25}:push",
		"%7B":      "rl:{%257B}:push",
		"tenant/é": "rl:{tenant/é}:push",
	} {
		if got := s.Key(subject); got != want {
			t.Errorf("Key(%q) = %q, want %q", subject, got, want)
		}
	}
}

// TestTTLInvariants checks that every key the store writes has an expiry no
// longer than the time until its bucket is full (plus rounding and, on a
// client clock, the skew slack of 1 s).
func TestTTLInvariants(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock))
	limits := []floodgate.Limit{
		floodgate.PerSecond(10, 5), floodgate.PerSecond(0, 3), floodgate.PerSecond(1e6, 1000),
		floodgate.PerSecond(0.001, 2), floodgate.PerSecond(5000, 1),
	}
	for i := range 200 {
		lim := limits[i%len(limits)]
		key := string(rune('a' + i%7))
		res, err := s.TakeN(bg, key, lim, 1+i%3)
		if errors.Is(err, floodgate.ErrExceedsBurst) && 1+i%3 > lim.Burst {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			s.Refund(bg, key, lim, 1)
		}
		clock.Advance(time.Duration(i%4) * 300 * time.Microsecond)
		if res.Allowed {
			pttl, err := c.PTTL(bg, s.Key(key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if pttl == -1 { // -2 (gone) happens with 1 ms TTLs
				t.Fatalf("after TakeN(%v) the key has PTTL %v", lim, pttl)
			}
			if res.ResetAfter != floodgate.Never && pttl > res.ResetAfter+redisstore.Linger+time.Millisecond {
				t.Fatalf("after TakeN(%v) PTTL %v exceeds ResetAfter %v", lim, pttl, res.ResetAfter)
			}
		}
	}
	var cursor uint64
	seen := 0
	for {
		keys, next, err := c.Scan(bg, cursor, s.Key("*"), 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			seen++
			if pttl := c.PTTL(bg, k).Val(); pttl == -1 {
				t.Errorf("key %s has no expiry", k)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if seen == 0 {
		t.Error("no keys written")
	}
}

func TestPeekRefundReset(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock))
	lim := floodgate.PerSecond(1, 10)
	if res, err := s.TakeN(bg, "k", lim, 7); err != nil || !res.Allowed || res.Remaining != 3 {
		t.Fatalf("TakeN(7) = %+v, %v, want allowed, 3 left", res, err)
	}
	res, err := s.Peek(bg, "k", lim)
	if err != nil || res.Remaining != 3 || res.ResetAfter != 7*time.Second {
		t.Fatalf("Peek = %+v, %v, want 3 left, full in 7s", res, err)
	}
	if err := s.Refund(bg, "k", lim, 2); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.Peek(bg, "k", lim); res.Remaining != 5 {
		t.Fatalf("Peek after Refund(2) = %+v, want 5 left", res)
	}
	if err := s.Refund(bg, "k", lim, 100); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.Peek(bg, "k", lim); res.Remaining != 10 {
		t.Errorf("Peek after a refund to full = %+v, want full", res)
	}
	if pttl := c.PTTL(bg, s.Key("k")).Val(); pttl <= 0 || pttl > redisstore.Linger {
		t.Errorf("a full bucket's PTTL %v, want it to linger at most %v", pttl, redisstore.Linger)
	}
	s.TakeN(bg, "k", lim, 10)
	if err := s.Reset(bg, "k"); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.Peek(bg, "k", lim); res.Remaining != 10 {
		t.Fatalf("Peek after Reset = %+v, want full", res)
	}
	if err := s.Refund(bg, "k", lim, -1); !errors.Is(err, floodgate.ErrNegativeN) {
		t.Errorf("Refund(-1) = %v, want ErrNegativeN", err)
	}
}

// TestServerClock runs on Redis TIME: a drained bucket refills in real time.
func TestServerClock(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	s := newStore(t, c)
	lim := floodgate.PerSecond(1000, 10)
	res, err := s.TakeN(bg, "k", lim, 10)
	if err != nil || !res.Allowed {
		t.Fatalf("TakeN(10) = %+v, %v", res, err)
	}
	res, _ = s.TakeN(bg, "k", lim, 10)
	if res.Allowed || res.RetryAfter <= 0 || res.RetryAfter > 10*time.Millisecond {
		t.Fatalf("second TakeN(10) = %+v, want a denial with a retry within 10ms", res)
	}
	if err := floodgate.Wait(bg, s, "k", lim, 10); err != nil {
		t.Fatalf("Wait = %v", err)
	}
}

// TestConcurrentClients hammers one key from several clients (each with its
// own connections) for about a second and checks that admissions stay
// within burst + rate·t, and that batching changes nothing about that.
func TestConcurrentClients(t *testing.T) {
	srv := sharedServer(t)
	for _, batched := range []bool{false, true} {
		name := "single"
		if batched {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			lim := floodgate.PerSecond(500, 50)
			pfx := prefix(t)
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			stop := start.Add(time.Second)
			for range 4 {
				c := newClient(t, srv.Addr)
				opts := []redisstore.Option{redisstore.WithPrefix(pfx), redisstore.WithDeadline(5 * time.Second)}
				if batched {
					opts = append(opts, redisstore.WithBatching(64))
				}
				s, err := redisstore.New(c, opts...)
				if err != nil {
					t.Fatal(err)
				}
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(stop) {
							res, err := s.TakeN(bg, "hot", lim, 1)
							if err != nil || res.Source != floodgate.SourceRedis {
								t.Errorf("TakeN = %+v, %v", res, err)
								return
							}
							if res.Allowed {
								admitted.Add(1)
							} else {
								denied.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			elapsed := time.Since(start)
			bound := float64(lim.Burst) + lim.Rate*elapsed.Seconds()
			if got := float64(admitted.Load()); got > bound {
				t.Errorf("admitted %v in %v, more than burst + rate·t = %v", got, elapsed, bound)
			}
			if denied.Load() == 0 {
				t.Errorf("no denials: the load did not reach the limit")
			}
			t.Logf("admitted %d, denied %d in %v (bound %.0f)", admitted.Load(), denied.Load(), elapsed, bound)
		})
	}
}

// TestBatchedExact fires many concurrent takes at one fixed instant: exactly
// burst of them succeed, whatever the batching.
func TestBatchedExact(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock), redisstore.WithBatching(16))
	lim := floodgate.PerSecond(1, 100)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				key := "k" + string(rune('a'+(g+i)%3))
				res, err := s.TakeN(bg, key, lim, 1)
				if err != nil || res.Source != floodgate.SourceRedis {
					t.Errorf("TakeN = %+v, %v", res, err)
					return
				}
				if res.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got, want := admitted.Load(), int64(3*lim.Burst); got != want {
		t.Errorf("admitted %d of 500 takes on 3 buckets of %d, want %d", got, lim.Burst, want)
	}
}

// TestScriptFlushUnderLoad flushes the script cache repeatedly while
// decisions run, per request and batched: none may fail.
func TestScriptFlushUnderLoad(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	var errs atomic.Int64
	onErr := redisstore.WithOnError(func(error) { errs.Add(1) })
	single := newStore(t, c, onErr)
	batched := newStore(t, c, onErr, redisstore.WithBatching(32))
	lim := floodgate.PerSecond(1e6, 1000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var decisions atomic.Int64
	for g := range 8 {
		s := single
		if g%2 == 1 {
			s = batched
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res, err := s.TakeN(bg, "k"+string(rune('a'+i%5)), lim, 1)
				if err != nil || res.Source != floodgate.SourceRedis {
					t.Errorf("TakeN = %+v, %v", res, err)
					return
				}
				decisions.Add(1)
			}
		}()
	}
	for range 20 {
		time.Sleep(20 * time.Millisecond)
		if err := c.ScriptFlush(bg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if errs.Load() != 0 {
		t.Errorf("%d errors under SCRIPT FLUSH", errs.Load())
	}
	if decisions.Load() == 0 {
		t.Error("no decisions")
	}
}

func TestDenyCache(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock), redisstore.WithDenyCache(2))
	lim := floodgate.PerSecond(10, 5)
	s.TakeN(bg, "k", lim, 5)
	res, _ := s.TakeN(bg, "k", lim, 2)
	if res.Allowed || res.Source != floodgate.SourceRedis || res.RetryAfter != 200*time.Millisecond {
		t.Fatalf("TakeN(2) on an empty bucket = %+v, want a Redis denial, retry 200ms", res)
	}
	clock.Advance(50 * time.Millisecond)
	res, _ = s.TakeN(bg, "k", lim, 2)
	if res.Allowed || res.Source != floodgate.SourceCache || res.RetryAfter != 150*time.Millisecond {
		t.Fatalf("TakeN(2) 50ms later = %+v, want a cached denial, retry 150ms", res)
	}
	clock.Advance(60 * time.Millisecond) // 1.1 tokens: 1 fits, so Redis decides
	res, _ = s.TakeN(bg, "k", lim, 1)
	if !res.Allowed || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN(1) with 1.1 tokens = %+v, want allowed by Redis", res)
	}
	// Bounded: of three more denied keys, the cache keeps the last two.
	for _, k := range []string{"x", "y", "z"} {
		s.TakeN(bg, k, lim, 5)
		s.TakeN(bg, k, lim, 5) // denied by Redis, cached
	}
	for _, tc := range []struct {
		key  string
		want floodgate.Source
	}{{"z", floodgate.SourceCache}, {"x", floodgate.SourceRedis}} {
		if res, _ := s.TakeN(bg, tc.key, lim, 5); res.Allowed || res.Source != tc.want {
			t.Errorf("TakeN(%q) = %+v, want denied by %v", tc.key, res, tc.want)
		}
	}
	if got, want := s.Stats().Cache, uint64(2); got != want {
		t.Errorf("Stats().Cache = %d, want %d", got, want)
	}
}

func TestLeases(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock), redisstore.WithLeases(100*time.Millisecond, 10))
	lim := floodgate.PerSecond(100, 50) // a lease: 6 tokens, an eighth of the burst
	var sources [8]int
	for range 12 {
		res, err := s.TakeN(bg, "hot", lim, 1)
		if err != nil || !res.Allowed {
			t.Fatalf("TakeN = %+v, %v", res, err)
		}
		sources[res.Source]++
	}
	// 1st: plain take; 2nd: leases 1+6; 3rd..8th: spend the 6; 9th:
	// leases again; 10th..12th: spend 3 of its 6.
	if sources[floodgate.SourceRedis] != 3 || sources[floodgate.SourceLease] != 9 {
		t.Errorf("sources = redis %d, lease %d, want 3 and 9", sources[floodgate.SourceRedis], sources[floodgate.SourceLease])
	}
	if res, _ := s.Peek(bg, "hot", lim); res.Remaining != 50-12 {
		t.Errorf("shared bucket has %d left, want %d", res.Remaining, 50-12)
	}
	// An expired lease is not spent.
	s.TakeN(bg, "hot", lim, 1) // from the lease, 2 left
	clock.Advance(101 * time.Millisecond)
	if res, _ := s.TakeN(bg, "hot", lim, 1); res.Source == floodgate.SourceLease {
		t.Errorf("TakeN after the lease expired = %+v, want not from the lease", res)
	}
}

// TestLeaseAtLeastHalf: a lease takes at least half its extra tokens; a
// bucket that holds less gives the request its own tokens only, never a
// refusal while it holds them.
func TestLeaseAtLeastHalf(t *testing.T) {
	srv := sharedServer(t)
	clock := newFakeClock()
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(clock),
		redisstore.WithLeases(100*time.Millisecond, 10), redisstore.WithDenyCache(10))
	lim := floodgate.PerSecond(100, 38) // a lease: 1 + 4 tokens (an eighth of the burst), at least 1 + 2
	admitted := 0
	var res floodgate.Result
	var sources []floodgate.Source
	for range 60 { // no time passes: the bucket and the leases drain
		var err error
		if res, err = s.TakeN(bg, "k", lim, 1); err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			break
		}
		admitted++
		sources = append(sources, res.Source)
	}
	// 1 plain take and seven leases of 1 + 4 (36), then 2 left: under
	// 1 + 2, so each of the last two takes its own from Redis.
	if admitted != 38 || res.Allowed || res.Source != floodgate.SourceRedis || res.RetryAfter != 10*time.Millisecond {
		t.Fatalf("after %d admitted, TakeN = %+v; want all 38 admitted, then refused until a token refills (10 ms)", admitted, res)
	}
	if got := sources[len(sources)-3:]; !slices.Equal(got, []floodgate.Source{floodgate.SourceLease, floodgate.SourceRedis, floodgate.SourceRedis}) {
		t.Errorf("the last three takes' sources %v, want a lease's, then Redis's: too little left to lease", got)
	}
	clock.Advance(5 * time.Millisecond)
	if res, _ := s.TakeN(bg, "k", lim, 1); res.Allowed || res.Source != floodgate.SourceCache {
		t.Errorf("TakeN with half a token = %+v; want refused by the deny cache", res)
	}
	clock.Advance(5 * time.Millisecond)
	if res, _ := s.TakeN(bg, "k", lim, 1); !res.Allowed || res.Source != floodgate.SourceRedis {
		t.Errorf("TakeN with a token = %+v; want allowed by Redis", res)
	}
}

// TestLeasesPaced: a key decided every 30 ms (33/s) leases a quarter of
// the lease time at that pace, 8 tokens beyond its own, and spends them
// before it asks again; the others see the bucket less the lease.
func TestLeasesPaced(t *testing.T) {
	srv := sharedServer(t)
	clock := newFakeClock()
	c := newClient(t, srv.Addr)
	pfx := redisstore.WithPrefix(prefix(t))
	s := newStore(t, c, redisstore.WithClientClock(clock), redisstore.WithLeases(time.Second, 10), pfx)
	other := newStore(t, c, redisstore.WithClientClock(clock), pfx)
	lim := floodgate.PerSecond(100, 80)
	var sources []floodgate.Source
	for range 12 {
		res, err := s.TakeN(bg, "paced", lim, 1)
		if err != nil || !res.Allowed {
			t.Fatalf("TakeN = %+v, %v", res, err)
		}
		sources = append(sources, res.Source)
		if len(sources) == 2 {
			// 79 refilled to the burst, 80, less 1 + the lease's 8.
			if p, _ := other.Peek(bg, "paced", lim); p.Remaining != 71 {
				t.Errorf("after the first lease another store sees %d, want 71: a lease of 1+8", p.Remaining)
			}
			if p, _ := s.Peek(bg, "paced", lim); p.Remaining != 79 {
				t.Errorf("after the first lease its store sees %d, want 79: the bucket and its own lease", p.Remaining)
			}
		}
		clock.Advance(30 * time.Millisecond)
	}
	r, l := floodgate.SourceRedis, floodgate.SourceLease
	want := []floodgate.Source{r, r, l, l, l, l, l, l, l, l, r, l}
	if !slices.Equal(sources, want) {
		t.Errorf("sources = %v, want %v", sources, want)
	}
}

// TestLeasesBounded: a store tracks at most its lease keys. Two keys that
// take in turn are both hot, and lease, when two keys are tracked; with
// one, each evicts the other and neither is ever seen twice.
func TestLeasesBounded(t *testing.T) {
	srv := sharedServer(t)
	for _, tc := range []struct {
		keys   int
		leased bool
	}{{2, true}, {1, false}} {
		t.Run(fmt.Sprint(tc.keys), func(t *testing.T) {
			s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(newFakeClock()),
				redisstore.WithLeases(100*time.Millisecond, tc.keys))
			for i := range 8 {
				if res, err := s.TakeN(bg, fmt.Sprint("k", i%2), floodgate.PerSecond(100, 50), 1); err != nil || !res.Allowed {
					t.Fatalf("TakeN = %+v, %v", res, err)
				}
			}
			if got := s.Stats().Lease > 0; got != tc.leased {
				t.Errorf("with %d lease keys and 2 hot keys, Stats().Lease = %d, want leases %v", tc.keys, s.Stats().Lease, tc.leased)
			}
		})
	}
}

// TestConcurrentLeasesKeepTheirTokens: a burst spent by concurrent callers
// on one store loses no token: what was admitted and what the bucket and
// the store's lease still hold make the burst. Without refill, fewer
// tokens than a lease's minimum (1 + half of 6) stay in the bucket.
func TestConcurrentLeasesKeepTheirTokens(t *testing.T) {
	srv := sharedServer(t)
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(newFakeClock()), // no refill
		redisstore.WithLeases(100*time.Millisecond, 16))
	lim := floodgate.PerSecond(50, 50) // a lease is 6 tokens
	for round := range 100 {
		key := fmt.Sprint("burst", round)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					if res, err := s.TakeN(bg, key, lim, 1); err != nil {
						t.Error(err)
						return
					} else if res.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		p, err := s.Peek(bg, key, lim)
		if err != nil {
			t.Fatal(err)
		}
		if got := admitted.Load(); got+int64(p.Remaining) != int64(lim.Burst) || got < int64(lim.Burst)-3 {
			t.Fatalf("round %d: 8 callers admitted %d of a burst of %d with leases and no refill, and %d are left; want all but at most 3 admitted, and none lost",
				round, got, lim.Burst, p.Remaining)
		}
	}
}

// TestLeaseBound checks the documented bound under concurrency from several
// stores on real time: admitted ≤ burst + rate·t, leases or not.
func TestLeaseBound(t *testing.T) {
	srv := sharedServer(t)
	pfx := prefix(t)
	lim := floodgate.PerSecond(1000, 20)
	lease := 20 * time.Millisecond
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(700 * time.Millisecond)
	for range 3 {
		s, err := redisstore.New(newClient(t, srv.Addr), redisstore.WithPrefix(pfx), redisstore.WithLeases(lease, 100), redisstore.WithDeadline(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					if res, _ := s.TakeN(bg, "hot", lim, 1); res.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := float64(lim.Burst) + lim.Rate*elapsed.Seconds()
	if got := float64(admitted.Load()); got > bound {
		t.Errorf("admitted %v in %v, more than burst + rate·t = %v", got, elapsed, bound)
	}
}

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 cl.Addrs,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
	})
	t.Cleanup(func() { c.Close() })
	var errs atomic.Int64
	var firstErr atomic.Value
	onErr := redisstore.WithOnError(func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err)
	})
	lim := floodgate.PerSecond(1, 3)
	for _, batched := range []bool{false, true} {
		// Flushed script caches: the batched run meets NOSCRIPT inside
		// pipelines on every node.
		if err := c.ForEachMaster(bg, func(ctx context.Context, m *redis.Client) error {
			return m.ScriptFlush(ctx).Err()
		}); err != nil {
			t.Fatal(err)
		}
		opts := []redisstore.Option{onErr, redisstore.WithDeadline(time.Second)}
		if batched {
			opts = append(opts, redisstore.WithBatching(64))
		}
		s := newStore(t, c, opts...)
		var wg sync.WaitGroup
		var admitted atomic.Int64
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					key := fmt.Sprintf("user%03d", (g*50+i)%200)
					res, err := s.TakeN(bg, key, lim, 1)
					if err != nil || res.Source != floodgate.SourceRedis {
						t.Errorf("TakeN(%q) = %+v, %v", key, res, err)
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		// 200 keys × burst 3 = 600 tokens, 800 takes within well under a second.
		if got := admitted.Load(); got < 600 || got > 600+200 {
			t.Errorf("batched=%v: admitted %d, want about 600", batched, got)
		}
		perNode := map[string]int{}
		for i := range 200 {
			key := s.Key(fmt.Sprintf("user%03d", i))
			if c.Exists(bg, key).Val() != 1 {
				t.Errorf("key %s missing", key)
			}
			node, err := c.MasterForKey(bg, key)
			if err != nil {
				t.Fatal(err)
			}
			perNode[node.Options().Addr]++
		}
		if len(perNode) != 3 {
			t.Errorf("keys on %d nodes, want 3: %v", len(perNode), perNode)
		}
	}
	if errs.Load() != 0 {
		t.Errorf("%d Redis errors, first: %v", errs.Load(), firstErr.Load())
	}
}

func TestUnavailableErrors(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	s := newStore(t, c, redisstore.WithDeadline(20*time.Millisecond))
	srv.Kill()
	lim := floodgate.PerSecond(1, 1)
	if _, err := s.Peek(bg, "k", lim); !errors.Is(err, redisstore.ErrUnavailable) || err.Error() != "redisstore: redis unavailable" {
		t.Errorf("Peek with Redis down = %v, want ErrUnavailable with a fixed text", err)
	}
	if err := s.Refund(bg, "k", lim, 1); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Errorf("Refund with Redis down = %v, want ErrUnavailable", err)
	}
	if err := s.Reset(bg, "k"); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Errorf("Reset with Redis down = %v, want ErrUnavailable", err)
	}
}

// TestKeyTooLong: a key over MaxKeyLen bytes is refused before any call,
// by every method, with an error that says so; a key of exactly MaxKeyLen
// bytes works, escaped or not.
func TestKeyTooLong(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	var rec recorder
	s := newStore(t, c, redisstore.WithObserver(&rec))
	lim := floodgate.PerSecond(10, 10)
	long := strings.Repeat("k", redisstore.MaxKeyLen+1)
	if _, err := s.TakeN(bg, long, lim, 1); !errors.Is(err, floodgate.ErrKeyTooLong) {
		t.Errorf("TakeN(%d-byte key) error = %v, want ErrKeyTooLong", len(long), err)
	}
	if _, err := s.Peek(bg, long, lim); !errors.Is(err, floodgate.ErrKeyTooLong) {
		t.Errorf("Peek(%d-byte key) error = %v, want ErrKeyTooLong", len(long), err)
	}
	if err := s.Refund(bg, long, lim, 1); !errors.Is(err, floodgate.ErrKeyTooLong) {
		t.Errorf("Refund(%d-byte key) error = %v, want ErrKeyTooLong", len(long), err)
	}
	if err := s.Reset(bg, long); !errors.Is(err, floodgate.ErrKeyTooLong) {
		t.Errorf("Reset(%d-byte key) error = %v, want ErrKeyTooLong", len(long), err)
	}
	if calls, _, _ := rec.snapshot(); len(calls) != 0 {
		t.Errorf("%d calls to Redis for oversized keys, want none", len(calls))
	}
	for _, key := range []string{strings.Repeat("k", redisstore.MaxKeyLen), strings.Repeat("{", redisstore.MaxKeyLen)} {
		if res, err := s.TakeN(bg, key, lim, 1); err != nil || !res.Allowed || res.Source != floodgate.SourceRedis {
			t.Errorf("TakeN(%d-byte key) = %+v, %v, want allowed by Redis", len(key), res, err)
		}
	}
}

// TestExceedsBurst: a take of more than a positive burst fails at once with
// floodgate.ErrExceedsBurst and a refusal for good, as every store and
// floodgate.Wait say, and takes nothing; the zero Limit refuses without an
// error; a refund of more than the burst fills the bucket.
func TestExceedsBurst(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	var rec recorder
	s := newStore(t, c, redisstore.WithObserver(&rec))
	lim := floodgate.PerSecond(10, 5)
	res, err := s.TakeN(bg, "k", lim, 6)
	if !errors.Is(err, floodgate.ErrExceedsBurst) || res.Allowed || res.RetryAfter != floodgate.Never {
		t.Errorf("TakeN(n 6 > burst 5) = %+v, %v; want refused for good with ErrExceedsBurst", res, err)
	}
	if err := floodgate.Wait(bg, s, "k", lim, 6); !errors.Is(err, floodgate.ErrExceedsBurst) {
		t.Errorf("Wait(n 6 > burst 5) = %v, want ErrExceedsBurst", err)
	}
	if calls, _, _ := rec.snapshot(); len(calls) != 0 {
		t.Errorf("%d calls to Redis for takes above the burst, want none", len(calls))
	}
	res, err = s.TakeN(bg, "z", floodgate.Limit{}, 1)
	if err != nil || res.Allowed || res.RetryAfter != floodgate.Never {
		t.Errorf("TakeN(zero Limit, 1) = %+v, %v; want refused for good, no error", res, err)
	}
	if err := floodgate.Wait(bg, s, "z", floodgate.Limit{}, 1); !errors.Is(err, floodgate.ErrWouldExceedDeadline) {
		t.Errorf("Wait(zero Limit) = %v, want ErrWouldExceedDeadline", err)
	}
	if res, _ := s.TakeN(bg, "k", lim, 5); !res.Allowed {
		t.Fatalf("TakeN(5) = %+v", res)
	}
	if err := s.Refund(bg, "k", lim, 6); err != nil {
		t.Errorf("Refund(6 > burst 5) = %v", err)
	}
	if res, _ := s.Peek(bg, "k", lim); res.Remaining != 5 {
		t.Errorf("Peek after Refund(6) = %+v, want full", res)
	}
}
