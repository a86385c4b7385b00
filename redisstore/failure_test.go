package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/floodgate-go/floodgate/remote"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestRedisFailure puts a store under load, kills (SIGKILL) or hangs
// (SIGSTOP) its Redis, then restarts or resumes it. Decisions made while
// Redis is away must follow the policy, the breaker must open, and Redis
// must decide again after recovery. (How long decisions take is checked on
// a fake clock, by TestHungRedisTiming.)
func TestRedisFailure(t *testing.T) {
	policies := []redisstore.Policy{redisstore.Local, redisstore.Open, redisstore.Closed}
	i := 0
	for _, fault := range []string{"kill", "stop"} {
		for _, p := range policies {
			batched := i%2 == 1
			i++
			t.Run(fmt.Sprintf("%s/%v/batched=%v", fault, p, batched), func(t *testing.T) {
				srv := redistest.Start(t)
				c := newClient(t, srv.Addr)
				failureRun(t, srv, c, fault, p, batched)
			})
		}
	}
}

// TestRedisFailureIgnoredDeadline is the hang with a client that ignores
// context deadlines (ContextTimeoutEnabled false, go-redis's default).
func TestRedisFailureIgnoredDeadline(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	t.Cleanup(func() {
		srv.Cont()
		c.Close()
	})
	failureRun(t, srv, c, "stop", redisstore.Local, false)
}

func failureRun(t *testing.T, srv *redistest.Server, c redis.UniversalClient, fault string, p redisstore.Policy, batched bool) {
	const deadline = 30 * time.Millisecond
	const cooldown = 200 * time.Millisecond
	opts := []redisstore.Option{
		redisstore.WithDeadline(deadline),
		redisstore.WithBreaker(3, cooldown),
		redisstore.WithFailurePolicy(p),
		redisstore.WithLocalDivisor(2),
	}
	if batched {
		opts = append(opts, redisstore.WithBatching(32))
	}
	s := newStore(t, c, opts...)
	lim := floodgate.PerSecond(200, 20)
	local := lim.Scale(0.5)

	// Warm up: the first calls dial, which on a loaded machine under the
	// race detector can miss a 30 ms deadline and open the breaker.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		if res, _ := s.TakeN(context.Background(), "warm", lim, 1); res.Source == floodgate.SourceRedis {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	var phase atomic.Int32 // 0 healthy, 1 Redis away, 2 recovered
	var slowest atomic.Int64
	var redisAfter, awayDecisions atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", g%4)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ph := phase.Load()
				t0 := time.Now()
				res, err := s.TakeN(context.Background(), key, lim, 1)
				d := time.Since(t0)
				storeMax(&slowest, int64(d))
				if err != nil {
					t.Errorf("TakeN error %v", err)
					return
				}
				if ph == 1 && phase.Load() != 1 {
					ph = 0 // Redis came back during the call
				}
				switch ph {
				case 1:
					awayDecisions.Add(1)
					ok := false
					switch p {
					case redisstore.Local:
						ok = res.Source == floodgate.SourceFallback && res.Limit == local
					case redisstore.Open:
						ok = res.Source == floodgate.SourceFailOpen && res.Allowed
					case redisstore.Closed:
						ok = res.Source == floodgate.SourceFailClosed && !res.Allowed && res.RetryAfter > 0
					}
					if !ok {
						t.Errorf("with Redis away, policy %v decided %+v", p, res)
						return
					}
				case 2:
					if res.Source == floodgate.SourceRedis {
						redisAfter.Add(1)
					}
				}
				if res.Source != floodgate.SourceRedis || !res.Allowed {
					time.Sleep(200 * time.Microsecond) // keep the load bounded
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	if got := s.Stats().Redis; got == 0 {
		t.Errorf("no Redis decisions before the fault")
	}
	switch fault {
	case "kill":
		srv.Kill()
	case "stop":
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	phase.Store(1)
	time.Sleep(700 * time.Millisecond)
	st := s.Stats()
	if !st.Open || st.Trips == 0 {
		t.Errorf("with Redis away for 700ms, breaker open %v after %d trips, want open", st.Open, st.Trips)
	}
	phase.Store(0) // the recovery itself is racy: check nothing during it
	switch fault {
	case "kill":
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	case "stop":
		srv.Cont()
	}
	phase.Store(2)
	for end := time.Now().Add(3 * time.Second); redisAfter.Load() < 10 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if redisAfter.Load() < 10 {
		t.Errorf("Redis decided %d times within 3s of recovery, want ≥ 10", redisAfter.Load())
	}
	// Under the suite's load a call after the recovery may still miss the
	// 30 ms deadline, and a few in a row trip the breaker again: what must
	// hold is that it closes again once its probe finds Redis.
	closed := false
	for end := time.Now().Add(3 * time.Second); !closed && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		res, _ := s.TakeN(context.Background(), "after", lim, 1)
		closed = res.Source == floodgate.SourceRedis && !s.Stats().Open
	}
	if !closed {
		t.Errorf("breaker still open 3s after the load stopped, Redis answering; stats %+v", s.Stats())
	}
	if awayDecisions.Load() == 0 {
		t.Errorf("no decisions while Redis was away")
	}
	t.Logf("slowest decision %v (deadline %v); stats %+v", time.Duration(slowest.Load()), deadline, s.Stats())
}

// storeMax raises a to v if v is larger.
func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// TestShortCallerDeadline: with Redis hung, callers whose own deadline (5
// ms) is far shorter than the store's get their context's error, never a
// decision of the failure policy, and their calls count for nothing against
// Redis: no errors, the breaker closed.
func TestShortCallerDeadline(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			srv := redistest.Start(t)
			t.Cleanup(srv.Cont)
			var rec recorder
			opts := []redisstore.Option{redisstore.WithDeadline(50 * time.Millisecond), redisstore.WithObserver(&rec)}
			if batched {
				opts = append(opts, redisstore.WithBatching(16))
			}
			s := newStore(t, newClient(t, srv.Addr), opts...)
			lim := floodgate.PerSecond(100, 10)
			// Warm up: the first call dials, which on a loaded machine can
			// miss 50 ms.
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				res, err := s.TakeN(bg, "k", lim, 1)
				if err == nil && res.Source == floodgate.SourceRedis && !s.Stats().Open {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("TakeN before the hang = %+v, %v", res, err)
				}
			}
			before := s.Stats()
			warm, _, _ := rec.snapshot()
			if err := srv.Stop(); err != nil {
				t.Fatal(err)
			}
			const callers, calls = 8, 25
			var wg sync.WaitGroup
			var decided atomic.Int64
			var latest atomic.Int64
			for range callers {
				wg.Go(func() {
					for range calls {
						ctx, cancel := context.WithTimeout(bg, 5*time.Millisecond)
						dl, _ := ctx.Deadline()
						res, err := s.TakeN(ctx, "k", lim, 1)
						storeMax(&latest, int64(time.Since(dl)))
						cancel()
						if !errors.Is(err, context.DeadlineExceeded) {
							decided.Add(1)
							t.Logf("TakeN with Redis hung and 5ms to go = %+v, %v", res, err)
						}
					}
				})
			}
			wg.Wait()
			if n := decided.Load(); n > 0 {
				t.Errorf("%d of %d calls decided with Redis hung, want only the context's error", n, callers*calls)
			}
			t.Logf("the latest call returned %v after its deadline", time.Duration(latest.Load()))
			if st := s.Stats(); st.Errors != before.Errors || st.Trips != before.Trips || st.Fallback != before.Fallback {
				t.Errorf("Stats = %+v, %+v before the hang: callers' deadlines counted against Redis", st, before)
			}
			if !batched {
				// Each call was its own round trip, cut short by its caller.
				calls, _, _ := rec.snapshot()
				for _, k := range calls[len(warm):] {
					if k != remote.KindCanceled {
						t.Errorf("observed a call ending with %v, want canceled", k)
						break
					}
				}
			}
		})
	}
}

// TestHungRedisTiming runs a store on a Redis that hangs, then heals, in a
// testing/synctest bubble, where time moves only while every goroutine
// waits: the durations it checks are exact, whatever the machine's load.
// With and without batching, on a client that honours context deadlines
// and on one that ignores them:
//
//   - a caller whose deadline is earlier than the store's gets its
//     context's error at that deadline, held against nothing;
//   - a decision returns by the store's deadline, made by the fallback;
//   - once failures open the breaker, decisions return at once;
//   - Redis decides again within a cooldown of healing.
func TestHungRedisTiming(t *testing.T) {
	// Long enough that no real scheduling delay of this process passes for
	// starvation (a quarter of the deadline), which would stretch calls.
	const deadline, cooldown = time.Minute, 5 * time.Minute
	const step = time.Second // between decisions while waiting for recovery
	lim := floodgate.PerSecond(1, 1)
	for _, ignoreCtx := range []bool{false, true} {
		for _, batched := range []bool{false, true} {
			t.Run(fmt.Sprintf("ignoreCtx=%v/batched=%v", ignoreCtx, batched), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					r := &hungRedis{ignoreCtx: ignoreCtx, healed: make(chan struct{})}
					c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: !ignoreCtx})
					c.AddHook(r)
					defer c.Close()
					defer r.heal() // ends calls that ignored their context
					opts := []redisstore.Option{redisstore.WithDeadline(deadline), redisstore.WithBreaker(2, cooldown)}
					if batched {
						opts = append(opts, redisstore.WithBatching(8))
					}
					s, err := redisstore.New(c, opts...)
					if err != nil {
						t.Fatal(err)
					}
					take := func(ctx context.Context) (floodgate.Result, error, time.Duration) {
						start := time.Now()
						res, err := s.TakeN(ctx, "k", lim, 1)
						return res, err, time.Since(start)
					}

					ctx, cancel := context.WithTimeout(bg, deadline/10)
					res, err, d := take(ctx)
					cancel()
					if !errors.Is(err, context.DeadlineExceeded) || d != deadline/10 {
						t.Errorf("TakeN with a caller deadline of %v = %+v, %v after %v; want the context's error at its deadline", deadline/10, res, err, d)
					}
					if st := s.Stats(); st.Errors != 0 || st.Fallback != 0 {
						t.Errorf("Stats after the caller's deadline = %+v, want no error, no fallback", st)
					}
					for i, want := range []time.Duration{deadline, deadline, 0} {
						res, err, d := take(bg)
						if err != nil || res.Source != floodgate.SourceFallback || d > want {
							t.Errorf("TakeN %d with Redis hung = %+v, %v after %v; want the fallback's decision within %v", i, res, err, d, want)
						}
					}
					if st := s.Stats(); st.Trips != 1 || !st.Open {
						t.Errorf("Stats after two failed calls = %+v, want the breaker open", st)
					}

					r.heal()
					healed := time.Now()
					for {
						res, err, _ := take(bg)
						if err != nil {
							t.Fatal(err)
						}
						if res.Source == floodgate.SourceRedis {
							break
						}
						if time.Since(healed) > cooldown {
							t.Fatalf("Redis did not decide within the cooldown %v of healing; %+v", cooldown, s.Stats())
						}
						time.Sleep(step)
					}
				})
			})
		}
	}
}

// hungRedis is a go-redis hook that stands in for a server: every command
// hangs until heal, or until its context ends unless ignoreCtx (as go-redis
// without ContextTimeoutEnabled); after heal, every take is admitted. It
// dials nothing, so a client that uses it can run in a synctest bubble.
type hungRedis struct {
	ignoreCtx bool
	healed    chan struct{}
	once      sync.Once
}

func (r *hungRedis) heal() { r.once.Do(func() { close(r.healed) }) }

func (r *hungRedis) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *hungRedis) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return r.answer(ctx, []redis.Cmder{cmd}) }
}

func (r *hungRedis) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return r.answer
}

func (r *hungRedis) answer(ctx context.Context, cmds []redis.Cmder) error {
	done := ctx.Done()
	if r.ignoreCtx {
		done = nil
	}
	select {
	case <-r.healed:
	case <-done:
		for _, cmd := range cmds {
			cmd.SetErr(ctx.Err())
		}
		return ctx.Err()
	}
	for _, cmd := range cmds {
		// EVALSHA sha numkeys key… arg…: each key's take is admitted,
		// leaving an empty bucket.
		var vals []any
		for range cmd.Args()[2].(int) {
			vals = append(vals, int64(1), int64(0), int64(1))
		}
		cmd.(*redis.Cmd).SetVal(vals)
	}
	return nil
}
