package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// The Redis benchmarks put redisstore and go-redis/redis_rate (v10.0.1) side
// by side on one redis-server that each run starts on loopback, with the
// same go-redis client options (context deadlines on, no retries, the
// default pool of 10 connections per GOMAXPROCS), over the same 1k keys with
// a limit no take exhausts: every decision runs the full accept path, and a
// rejection fails the benchmark.
//
//   - serial: one caller, one round trip per decision;
//   - parallel64: 64 concurrent callers (b.SetParallelism over GOMAXPROCS);
//   - redisstore batched: WithBatching(256), so concurrent decisions share
//     round trips.
//
// BenchmarkRedisHung measures decision latency while the server is stopped
// with SIGSTOP: the p99 must stay within the store's deadline (50 ms) plus
// 5 ms.

func redisClient(b testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	b.Cleanup(func() { c.Close() })
	return c
}

var redisKeys = func() []string {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	return keys
}()

// A limit no benchmark run exhausts on one of 1k keys.
var (
	fgLimit = floodgate.PerSecond(1e6, 1_000_000)
	rrLimit = redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second}
)

type redisTaker func(ctx context.Context, key string) (bool, error)

func redisImpls(b *testing.B) map[string]redisTaker {
	srv := redistest.Start(b) // closed when the benchmark ends
	c := redisClient(b, srv.Addr)
	rr := redis_rate.NewLimiter(c)
	// A deadline of 1 s: a stall of this shared machine must not turn a
	// decision into a (much faster) fallback decision.
	single, err := redisstore.New(c, redisstore.WithPrefix("bench1"), redisstore.WithDeadline(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	batched, err := redisstore.New(c, redisstore.WithPrefix("bench2"), redisstore.WithBatching(256), redisstore.WithDeadline(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	fg := func(s *redisstore.Store) redisTaker {
		return func(ctx context.Context, key string) (bool, error) {
			res, err := s.TakeN(ctx, key, fgLimit, 1)
			if err == nil && res.Source != floodgate.SourceRedis {
				return false, fmt.Errorf("decided by %v, not Redis", res.Source)
			}
			return res.Allowed, err
		}
	}
	return map[string]redisTaker{
		"redis_rate": func(ctx context.Context, key string) (bool, error) {
			res, err := rr.Allow(ctx, key, rrLimit)
			if err != nil {
				return false, err
			}
			return res.Allowed > 0, nil
		},
		"redisstore":         fg(single),
		"redisstore-batched": fg(batched),
	}
}

func BenchmarkRedis(b *testing.B) {
	impls := redisImpls(b)
	for _, name := range redisOrder {
		take := impls[name]
		b.Run(name+"/serial", func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ok, err := take(ctx, redisKeys[i%len(redisKeys)])
				if err != nil || !ok {
					b.Fatalf("take = %v, %v", ok, err)
				}
				i++
			}
		})
		b.Run(name+"/parallel64", func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism((64 + parallelism() - 1) / parallelism())
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(97))
				for pb.Next() {
					ok, err := take(ctx, redisKeys[i%len(redisKeys)])
					if err != nil || !ok {
						b.Errorf("take = %v, %v", ok, err)
						return
					}
					i++
				}
			})
		})
	}
}

var redisOrder = []string{"redis_rate", "redisstore", "redisstore-batched"}

// BenchmarkRedisInterleaved compares the implementations under the same
// conditions at the same moment: on this shared machine, throughput drifts
// by 2× over minutes, so sequential sub-benchmarks compare badly.
//
//   - serial: each iteration makes one decision with each implementation in
//     turn; ns/op is the sum, and <impl>-ns the mean of each.
//   - parallel64: rounds of 250 ms per implementation with 64 callers, the
//     order rotating each round (6 rounds); <impl>-kops/s is the median
//     over the rounds. It runs once whatever b.N asks.
func BenchmarkRedisInterleaved(b *testing.B) {
	impls := redisImpls(b)
	b.Run("serial", func(b *testing.B) {
		ctx := context.Background()
		var spent [3]time.Duration
		i := 0
		for b.Loop() {
			for j, name := range redisOrder {
				t0 := time.Now()
				ok, err := impls[name](ctx, redisKeys[i%len(redisKeys)])
				spent[j] += time.Since(t0)
				if err != nil || !ok {
					b.Fatalf("%s: take = %v, %v", name, ok, err)
				}
			}
			i++
		}
		for j, name := range redisOrder {
			b.ReportMetric(float64(spent[j])/float64(b.N), name+"-ns")
		}
	})
	b.Run("parallel64", func(b *testing.B) {
		const rounds = 6
		rates := make(map[string][]float64)
		for r := range rounds {
			for j := range redisOrder {
				name := redisOrder[(j+r)%len(redisOrder)]
				ops, err := parallelRound(impls[name], 64, 250*time.Millisecond)
				if err != nil {
					b.Fatalf("%s: %v", name, err)
				}
				rates[name] = append(rates[name], ops)
			}
		}
		for _, name := range redisOrder {
			xs := rates[name]
			slices.Sort(xs)
			b.ReportMetric((xs[len(xs)/2-1]+xs[len(xs)/2])/2/1e3, name+"-kops/s")
		}
	})
}

// parallelRound runs take from callers goroutines for d and returns the
// decisions per second.
func parallelRound(take redisTaker, callers int, d time.Duration) (float64, error) {
	ctx := context.Background()
	var total atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := int64(0)
			for i := g * 97; time.Now().Before(end); i++ {
				ok, err := take(ctx, redisKeys[i%len(redisKeys)])
				if err != nil || !ok {
					firstErr.CompareAndSwap(nil, fmt.Errorf("take = %v, %v", ok, err))
					break
				}
				n++
			}
			total.Add(n)
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(total.Load()) / time.Since(start).Seconds(), nil
}

// parallelism is GOMAXPROCS as RunParallel uses it.
func parallelism() int { return max(1, runtime.GOMAXPROCS(0)) }

// BenchmarkRedisHung stops the server and times decisions from 64
// concurrent callers. "breaker" runs the default breaker (after 5 failures
// decisions skip Redis for a second); "nobreaker" keeps every decision on
// the hung server, so each one waits for the deadline; "go-redis" is the
// control: a bare EVALSHA with a 50 ms context on the same client setup,
// which shows what the client and the machine add without the store. It
// reports p50, p99 and max latency in ms, and stall-ms, the worst oversleep
// of a 1 ms sleep during the run: the machine's scheduling delay, which no
// library can beat.
func BenchmarkRedisHung(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts []redisstore.Option
	}{
		{"breaker", nil},
		{"nobreaker", []redisstore.Option{redisstore.WithBreaker(1<<30, time.Second)}},
		{"go-redis", nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if !redistest.Installed() {
				b.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
			}
			srv, err := redistest.Launch()
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
			defer c.Close()
			s, err := redisstore.New(c, tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			decide := func(key string) error {
				res, err := s.TakeN(context.Background(), key, fgLimit, 1)
				if err == nil && res.Source != floodgate.SourceFallback {
					err = fmt.Errorf("decided by %v, want the fallback", res.Source)
				}
				return err
			}
			if tc.name == "go-redis" {
				decide = func(key string) error {
					ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
					defer cancel()
					c.EvalSha(ctx, "0000000000000000000000000000000000000000", []string{key}).Err()
					return nil
				}
			}
			for _, k := range redisKeys[:64] { // warm the pool
				s.TakeN(context.Background(), k, fgLimit, 1)
			}
			if err := srv.Stop(); err != nil {
				b.Fatal(err)
			}
			defer srv.Cont()
			stop := make(chan struct{})
			stalled := make(chan time.Duration)
			go func() {
				var worst time.Duration
				for {
					select {
					case <-stop:
						stalled <- worst
						return
					default:
					}
					t0 := time.Now()
					time.Sleep(time.Millisecond)
					worst = max(worst, time.Since(t0)-time.Millisecond)
				}
			}()
			var mu sync.Mutex
			lat := make([]time.Duration, 0, 1024)
			b.SetParallelism((64 + parallelism() - 1) / parallelism())
			var next atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1))
				var mine []time.Duration
				for pb.Next() {
					t0 := time.Now()
					err := decide(redisKeys[i%len(redisKeys)])
					mine = append(mine, time.Since(t0))
					if err != nil {
						b.Errorf("decision with Redis hung: %v", err)
						return
					}
					i++
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			close(stop)
			stall := <-stalled
			slices.Sort(lat)
			if len(lat) == 0 {
				b.Fatal("no decisions")
			}
			q := func(p float64) float64 {
				return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / 1e6
			}
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
			b.ReportMetric(float64(stall)/1e6, "stall-ms")
		})
	}
}

// TestRedisImpls runs every Redis implementation briefly, so that make test
// checks the benchmark's paths.
func TestRedisImpls(t *testing.T) {
	srv := redistest.Start(t)
	c := redisClient(t, srv.Addr)
	rr := redis_rate.NewLimiter(c)
	s, err := redisstore.New(c, redisstore.WithPrefix("benchtest"), redisstore.WithBatching(64))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range redisKeys[:100] {
		if res, err := rr.Allow(ctx, k, rrLimit); err != nil || res.Allowed != 1 {
			t.Fatalf("redis_rate Allow(%q) = %+v, %v", k, res, err)
		}
		if res, err := s.TakeN(ctx, k, fgLimit, 1); err != nil || !res.Allowed || res.Source != floodgate.SourceRedis {
			t.Fatalf("redisstore TakeN(%q) = %+v, %v", k, res, err)
		}
	}
}
