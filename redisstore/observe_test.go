package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/floodgate-go/floodgate/remote"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
)

// recorder is an Observer that keeps everything it sees.
type recorder struct {
	mu          sync.Mutex
	calls       []remote.ErrorKind
	transitions []transition
	fallbacks   map[floodgate.Source]int
	starved     int
	instances   []int
}

func (r *recorder) ObserveStarved() {
	r.mu.Lock()
	r.starved++
	r.mu.Unlock()
}

func (r *recorder) ObserveInstances(n int) {
	r.mu.Lock()
	r.instances = append(r.instances, n)
	r.mu.Unlock()
}

type transition struct{ From, To remote.BreakerState }

func (r *recorder) ObserveCall(d time.Duration, kind remote.ErrorKind) {
	r.mu.Lock()
	r.calls = append(r.calls, kind)
	r.mu.Unlock()
}

func (r *recorder) ObserveBreaker(from, to remote.BreakerState) {
	r.mu.Lock()
	r.transitions = append(r.transitions, transition{from, to})
	r.mu.Unlock()
}

func (r *recorder) ObserveFallback(source floodgate.Source) {
	r.mu.Lock()
	if r.fallbacks == nil {
		r.fallbacks = map[floodgate.Source]int{}
	}
	r.fallbacks[source]++
	r.mu.Unlock()
}

// snapshot returns copies of what r saw.
func (r *recorder) snapshot() ([]remote.ErrorKind, []transition, map[floodgate.Source]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fb := map[floodgate.Source]int{}
	for k, v := range r.fallbacks {
		fb[k] = v
	}
	return append([]remote.ErrorKind(nil), r.calls...), append([]transition(nil), r.transitions...), fb
}

// logRecord is one line a logHandler received.
type logRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// logHandler is a slog.Handler that keeps its records.
type logHandler struct {
	mu      sync.Mutex
	records []logRecord
}

func (h *logHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *logHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logHandler) WithGroup(string) slog.Handler            { return h }

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

func (h *logHandler) snapshot() []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]logRecord(nil), h.records...)
}

// redisErr is an error reply as go-redis returns it.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestKindOf(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  error
		want remote.ErrorKind
	}{
		{nil, remote.KindNone},
		{context.DeadlineExceeded, remote.KindTimeout},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), remote.KindTimeout},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, remote.KindTimeout},
		{redis.ErrPoolTimeout, remote.KindTimeout},
		{context.Canceled, remote.KindCanceled},
		{refused, remote.KindConnection},
		{io.EOF, remote.KindConnection},
		{redis.ErrClosed, remote.KindConnection},
		{net.ErrClosed, remote.KindConnection},
		{&net.DNSError{Err: "no such host", Name: "redis"}, remote.KindConnection},
		{redisErr("MOVED 3999 127.0.0.1:6381"), remote.KindCluster},
		{redisErr("ASK 3999 127.0.0.1:6381"), remote.KindCluster},
		{redisErr("CLUSTERDOWN The cluster is down"), remote.KindCluster},
		{redisErr("TRYAGAIN Multiple keys request during rehashing of slot"), remote.KindCluster},
		{redisErr("READONLY You can't write against a read only replica."), remote.KindCluster},
		{redisErr("LOADING Redis is loading the dataset in memory"), remote.KindCluster},
		{redis.ErrCrossSlot, remote.KindCluster},
		{redisErr("ERR user_script:12: attempt to compare nil with number script: 1f2e"), remote.KindScript},
		{redisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), remote.KindScript},
		{redisErr("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT."), remote.KindScript},
		{redis.ErrNoScript, remote.KindScript},
		{redisErr("NOAUTH Authentication required."), remote.KindOther},
		{redisErr("OOM command not allowed when used memory > 'maxmemory'."), remote.KindOther},
		{errors.New("something else"), remote.KindOther},
	} {
		if got := redisstore.KindOf(tc.err); got != tc.want {
			t.Errorf("KindOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestKindOfBreakerOpen: once the breaker has opened, Reset fails without a
// call, and says so.
func TestKindOfBreakerOpen(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithBreaker(1, time.Hour), redisstore.WithDeadline(time.Second))
	srv.Kill()
	err := s.Reset(bg, "k")
	if k := redisstore.KindOf(err); !errors.Is(err, redisstore.ErrUnavailable) || k != remote.KindConnection {
		t.Fatalf("Reset with Redis down = %v (%v), want ErrUnavailable of kind connection", err, k)
	}
	err = s.Reset(bg, "k")
	if k := redisstore.KindOf(err); !errors.Is(err, redisstore.ErrUnavailable) || k != remote.KindBreakerOpen {
		t.Errorf("Reset with the breaker open = %v (%v), want ErrUnavailable of kind breaker_open", err, k)
	}
	if got := remote.KindBreakerOpen.String(); got != "breaker_open" {
		t.Errorf("remote.KindBreakerOpen.String() = %q", got)
	}
}

// TestKindOfAllocs checks that classifying the errors of a failing Redis
// allocates nothing: the observer runs on every failed call.
func TestKindOfAllocs(t *testing.T) {
	errs := []error{
		nil,
		fmt.Errorf("wrapped: %w", context.DeadlineExceeded),
		&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}},
		&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)},
		redisErr("MOVED 3999 127.0.0.1:6381"),
		redisErr("ERR user_script:12: attempt to compare nil with number"),
		errors.New("something else"),
	}
	var sink remote.ErrorKind
	if n := testing.AllocsPerRun(100, func() {
		for _, err := range errs {
			sink += redisstore.KindOf(err)
		}
	}); n != 0 {
		t.Errorf("KindOf allocates %v times per run of %d errors, want 0", n, len(errs))
	}
}

// TestKindOfServerErrors provokes each kind of failure on real servers and
// checks what the observer and WithOnError see.
func TestKindOfServerErrors(t *testing.T) {
	lim := floodgate.PerSecond(10, 10)
	for _, tc := range []struct {
		name   string
		want   remote.ErrorKind
		client func(t *testing.T) redis.UniversalClient
		// key returns a key whose decision fails; "k" when nil.
		key func(t *testing.T, c redis.UniversalClient, s *redisstore.Store) string
	}{
		{
			name:   "wrong type",
			want:   remote.KindScript,
			client: func(t *testing.T) redis.UniversalClient { return newClient(t, sharedServer(t).Addr) },
			key: func(t *testing.T, c redis.UniversalClient, s *redisstore.Store) string {
				if err := c.LPush(bg, s.Key("list"), "not a bucket").Err(); err != nil {
					t.Fatal(err)
				}
				return "list"
			},
		},
		{
			name: "refused",
			want: remote.KindConnection,
			client: func(t *testing.T) redis.UniversalClient {
				srv := redistest.Start(t)
				c := newClient(t, srv.Addr)
				srv.Kill()
				return c
			},
		},
		{
			name: "hung",
			want: remote.KindTimeout,
			client: func(t *testing.T) redis.UniversalClient {
				srv := redistest.Start(t)
				c := newClient(t, srv.Addr)
				if err := c.Ping(bg).Err(); err != nil { // a pooled connection
					t.Fatal(err)
				}
				if err := srv.Stop(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(srv.Cont)
				return c
			},
		},
		{
			name: "moved",
			want: remote.KindCluster,
			client: func(t *testing.T) redis.UniversalClient {
				// A plain client on one node of a Cluster: keys in the
				// other nodes' slots are answered with MOVED.
				return newClient(t, redistest.StartCluster(t, 3).Addrs[0])
			},
			key: func(t *testing.T, c redis.UniversalClient, s *redisstore.Store) string {
				for i := range 100 {
					key := fmt.Sprintf("k%d", i)
					if err := c.Get(bg, s.Key(key)).Err(); err != nil && err != redis.Nil {
						return key
					}
				}
				t.Fatal("none of 100 keys is on another node")
				return ""
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(t)
			var rec recorder
			var mu sync.Mutex
			var onErr []error
			s := newStore(t, c, redisstore.WithObserver(&rec), redisstore.WithDeadline(500*time.Millisecond),
				redisstore.WithOnError(func(err error) {
					mu.Lock()
					onErr = append(onErr, err)
					mu.Unlock()
				}))
			key := "k"
			if tc.key != nil {
				key = tc.key(t, c, s)
			}
			res, err := s.TakeN(bg, key, lim, 1)
			if err != nil || res.Source != floodgate.SourceFallback {
				t.Fatalf("TakeN = %+v, %v, want a fallback decision", res, err)
			}
			calls, _, fallbacks := rec.snapshot()
			if diff := cmp.Diff([]remote.ErrorKind{tc.want}, calls); diff != "" {
				t.Errorf("observed calls (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[floodgate.Source]int{floodgate.SourceFallback: 1}, fallbacks); diff != "" {
				t.Errorf("observed fallbacks (-want +got):\n%s", diff)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(onErr) != 1 {
				t.Fatalf("WithOnError saw %v, want one error", onErr)
			}
			if got := redisstore.KindOf(onErr[0]); got != tc.want {
				t.Errorf("KindOf(%v) = %v, want %v", onErr[0], got, tc.want)
			}
		})
	}
}

// TestObserverCalls checks that a healthy store reports one call per round
// trip, whether batched or not, and the decisions the cache and leases make.
func TestObserverCalls(t *testing.T) {
	srv := sharedServer(t)
	lim := floodgate.PerSecond(1000, 1000)

	t.Run("single", func(t *testing.T) {
		var rec recorder
		s := newStore(t, newClient(t, srv.Addr), redisstore.WithObserver(&rec))
		for range 5 {
			if res, err := s.TakeN(bg, "k", lim, 1); err != nil || res.Source != floodgate.SourceRedis {
				t.Fatalf("TakeN = %+v, %v", res, err)
			}
		}
		if _, err := s.Peek(bg, "k", lim); err != nil {
			t.Fatal(err)
		}
		if err := s.Refund(bg, "k", lim, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Reset(bg, "k"); err != nil {
			t.Fatal(err)
		}
		s.TakeN(bg, "k", floodgate.Inf, 1) // no call
		calls, transitions, fallbacks := rec.snapshot()
		want := make([]remote.ErrorKind, 8)
		if diff := cmp.Diff(want, calls); diff != "" {
			t.Errorf("observed calls (-want +got):\n%s", diff)
		}
		if len(transitions) != 0 || len(fallbacks) != 0 {
			t.Errorf("observed transitions %v and fallbacks %v on a healthy Redis, want none", transitions, fallbacks)
		}
	})

	t.Run("batched", func(t *testing.T) {
		var rec recorder
		s := newStore(t, newClient(t, srv.Addr), redisstore.WithObserver(&rec), redisstore.WithBatching(64))
		const decisions = 200
		var wg sync.WaitGroup
		for g := range decisions {
			wg.Go(func() {
				if res, err := s.TakeN(bg, fmt.Sprintf("k%d", g%20), lim, 1); err != nil || res.Source != floodgate.SourceRedis {
					t.Errorf("TakeN = %+v, %v", res, err)
				}
			})
		}
		wg.Wait()
		calls, _, _ := rec.snapshot()
		if len(calls) == 0 || len(calls) > decisions {
			t.Errorf("%d decisions made %d observed calls, want 1 to %d", decisions, len(calls), decisions)
		}
		for _, k := range calls {
			if k != remote.KindNone {
				t.Errorf("observed a call failing with %v on a healthy Redis", k)
			}
		}
		t.Logf("%d decisions in %d round trips", decisions, len(calls))
	})

	t.Run("cache and leases", func(t *testing.T) {
		var rec recorder
		clock := newFakeClock()
		s := newStore(t, newClient(t, srv.Addr), redisstore.WithObserver(&rec), redisstore.WithClientClock(clock),
			redisstore.WithDenyCache(10), redisstore.WithLeases(100*time.Millisecond, 10))
		hot := floodgate.PerSecond(100, 80) // a lease is 10 tokens, an eighth of the burst
		for range 12 {                      // 1st: a take, 2nd: a lease of 1+10, then 10 from it
			s.TakeN(bg, "hot", hot, 1)
		}
		tight := floodgate.PerSecond(1, 1)
		s.TakeN(bg, "cold", tight, 1)
		s.TakeN(bg, "other", tight, 1)
		s.TakeN(bg, "cold", tight, 1) // denied by Redis, cached
		s.TakeN(bg, "cold", tight, 1) // denied by the cache
		calls, _, fallbacks := rec.snapshot()
		if got, want := len(calls), 5; got != want {
			t.Errorf("observed %d calls, want %d", got, want)
		}
		want := map[floodgate.Source]int{floodgate.SourceLease: 10, floodgate.SourceCache: 1}
		if diff := cmp.Diff(want, fallbacks); diff != "" {
			t.Errorf("observed fallbacks (-want +got):\n%s", diff)
		}
	})
}

// TestObserverBreaker kills Redis under a store with a short cooldown, then
// restarts it: the observer and the log must see the same transitions, in
// an order the breaker allows, one log line each, from closed back to
// closed.
func TestObserverBreaker(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	var rec recorder
	var logs logHandler
	s := newStore(t, c, redisstore.WithObserver(&rec), redisstore.WithLogger(slog.New(&logs)),
		redisstore.WithName("limits"), redisstore.WithFailurePolicy(redisstore.Closed),
		redisstore.WithBreaker(2, time.Millisecond), redisstore.WithDeadline(time.Second))
	lim := floodgate.PerSecond(1000, 1000)
	if res, _ := s.TakeN(bg, "k", lim, 1); res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN before the fault = %+v, want decided by Redis", res)
	}
	srv.Kill()
	failClosed := 0
	for range 10 {
		res, err := s.TakeN(bg, "k", lim, 1)
		if err != nil || res.Source != floodgate.SourceFailClosed {
			t.Fatalf("TakeN with Redis down = %+v, %v, want fail-closed", res, err)
		}
		failClosed++
	}
	if got := s.Stats().Breaker; got == remote.BreakerClosed {
		t.Errorf("breaker %v after 10 failed decisions, want open or half-open", got)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The pool may take a second to dial again after many failed dials.
	for end := time.Now().Add(10 * time.Second); ; {
		res, err := s.TakeN(bg, "k", lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Source == floodgate.SourceRedis {
			break
		}
		failClosed++
		if time.Now().After(end) {
			t.Fatalf("Redis did not decide within 10s of its restart; last %+v", res)
		}
	}

	if got := s.Stats().Breaker; got != remote.BreakerClosed {
		t.Errorf("breaker %v after recovery, want closed", got)
	}
	calls, transitions, fallbacks := rec.snapshot()
	if diff := cmp.Diff(map[floodgate.Source]int{floodgate.SourceFailClosed: failClosed}, fallbacks); diff != "" {
		t.Errorf("observed fallbacks (-want +got):\n%s", diff)
	}
	// A healthy call, failed ones while Redis was down, then the probe that
	// closed the breaker and the decision that went to Redis.
	down := calls[1:max(len(calls)-2, 1)]
	for _, k := range down {
		if k != remote.KindConnection {
			t.Errorf("observed a call failing with %v while Redis was down, want connection", k)
		}
	}
	if len(down) == 0 {
		t.Errorf("observed calls %v, want failed ones while Redis was down", calls)
	}
	for _, k := range append([]remote.ErrorKind{calls[0]}, calls[len(calls)-2:]...) {
		if k != remote.KindNone {
			t.Errorf("observed calls %v: the first and the last two must succeed", calls)
			break
		}
	}
	allowed := map[transition]bool{
		{remote.BreakerClosed, remote.BreakerOpen}:     true,
		{remote.BreakerOpen, remote.BreakerHalfOpen}:   true,
		{remote.BreakerHalfOpen, remote.BreakerOpen}:   true,
		{remote.BreakerHalfOpen, remote.BreakerClosed}: true,
		{remote.BreakerOpen, remote.BreakerClosed}:     true,
	}
	state := remote.BreakerClosed
	for i, tr := range transitions {
		if tr.From != state || !allowed[tr] {
			t.Errorf("transition %d: %v → %v from state %v", i, tr.From, tr.To, state)
		}
		state = tr.To
	}
	if len(transitions) < 2 || transitions[0].To != remote.BreakerOpen || state != remote.BreakerClosed {
		t.Errorf("transitions %v, want from closed to open and back to closed", transitions)
	}

	t.Logf("%d calls, %d transitions, %d fail-closed decisions", len(calls), len(transitions), failClosed)
	records := logs.snapshot()
	if len(records) != len(transitions) {
		t.Fatalf("%d log lines for %d transitions, want one each", len(records), len(transitions))
	}
	for i, r := range records {
		tr := transitions[i]
		wantLevel := slog.LevelInfo
		if tr.To == remote.BreakerOpen {
			wantLevel = slog.LevelWarn
			if got := r.Attrs["error"]; got != "connection" {
				t.Errorf("line %d, to open: error = %q, want connection", i, got)
			}
		}
		if r.Msg != "redisstore: breaker state change" || r.Level != wantLevel ||
			r.Attrs["from"] != tr.From.String() || r.Attrs["to"] != tr.To.String() || r.Attrs["name"] != "limits" {
			t.Errorf("line %d = %+v, want %v → %v at %v", i, r, tr.From, tr.To, wantLevel)
		}
	}
	if _, ok := records[len(records)-1].Attrs["open_for"]; !ok {
		t.Errorf("the line closing the breaker has no open_for: %+v", records[len(records)-1])
	}
}

// TestObserverNoAllocs checks that observation adds no allocation to a
// decision: on the deny cache's path (no Redis call), with and without an
// observer; on a Redis call, the same count with an observer as without.
func TestObserverNoAllocs(t *testing.T) {
	srv := sharedServer(t)
	lim := floodgate.PerSecond(1, 1)
	var calls atomic.Int64
	for _, tc := range []struct {
		name string
		obs  redisstore.Observer
	}{{"none", nil}, {"observer", countingObserver{&calls}}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			opts := []redisstore.Option{redisstore.WithClientClock(clock), redisstore.WithDenyCache(10)}
			if tc.obs != nil {
				opts = append(opts, redisstore.WithObserver(tc.obs))
			}
			s := newStore(t, newClient(t, srv.Addr), opts...)
			s.TakeN(bg, "k", lim, 1)
			waitRegistered(t, s)
			if res, _ := s.TakeN(bg, "k", lim, 1); res.Source != floodgate.SourceRedis || res.Allowed {
				t.Fatalf("second TakeN = %+v, want denied by Redis", res)
			}
			if n := testing.AllocsPerRun(100, func() {
				if res, _ := s.TakeN(bg, "k", lim, 1); res.Source != floodgate.SourceCache {
					t.Fatalf("TakeN = %+v, want denied by the cache", res)
				}
			}); n != 0 {
				t.Errorf("a cached denial allocates %v times, want 0", n)
			}
		})
	}
	if calls.Load() == 0 {
		t.Error("the counting observer saw no call")
	}

	// A call to Redis allocates in go-redis; observing it must add nothing.
	// go-redis's count is not a whole number per call: its buffers come
	// from sync.Pools, which the race detector empties at random. So the
	// mean over many calls is compared, and an observer that allocated
	// even once a call would add a whole allocation to it. Each store
	// registers once, before the count: a registration due during it
	// allocates on a goroutine of its own.
	t.Cleanup(redisstore.SetInstancePeriod(time.Hour))
	redisAllocs := func(obs redisstore.Observer) float64 {
		var opts []redisstore.Option
		if obs != nil {
			opts = append(opts, redisstore.WithObserver(obs))
		}
		c := newClient(t, srv.Addr)
		defer c.Close()
		s := newStore(t, c, opts...)
		big := floodgate.PerSecond(1e6, 1e6)
		s.TakeN(bg, "k", big, 1) // dial
		waitRegistered(t, s)
		return meanAllocs(1000, func() {
			if res, _ := s.TakeN(bg, "k", big, 1); res.Source != floodgate.SourceRedis {
				t.Fatalf("TakeN = %+v, want decided by Redis", res)
			}
		})
	}
	// What earlier stores leave running adds to later counts: alternate
	// which goes first, and compare the least of each.
	without, with := math.Inf(1), math.Inf(1)
	for i := range 4 {
		if i%2 == 0 {
			without = min(without, redisAllocs(nil))
		}
		with = min(with, redisAllocs(countingObserver{&calls}))
		if i%2 == 1 {
			without = min(without, redisAllocs(nil))
		}
	}
	t.Logf("a Redis decision allocates %.2f times with an observer, %.2f without", with, without)
	if with > without+0.5 {
		t.Errorf("a Redis decision allocates %.2f times with an observer, %.2f without", with, without)
	}
}

// meanAllocs is testing.AllocsPerRun without its rounding down to a whole
// number: the mean count of allocations of a call of f over runs calls.
func meanAllocs(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f() // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}

// waitRegistered waits until s has counted the instances on Redis: the
// registration that a store's first Redis decision starts allocates on a
// goroutine of its own, which allocation counts would include.
func waitRegistered(t testing.TB, s *redisstore.Store) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); s.Stats().Instances == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the store did not count the instances within 5s")
		}
	}
	time.Sleep(10 * time.Millisecond) // for the goroutine to end
}

// countingObserver counts calls, in an atomic, as a metrics library would.
type countingObserver struct{ n *atomic.Int64 }

func (o countingObserver) ObserveCall(time.Duration, remote.ErrorKind) { o.n.Add(1) }
func (o countingObserver) ObserveBreaker(from, to remote.BreakerState) {}
func (o countingObserver) ObserveFallback(floodgate.Source)            { o.n.Add(1) }
func (o countingObserver) ObserveStarved()                             {}
func (o countingObserver) ObserveInstances(int)                        {}

// BenchmarkObserver measures a decision on Redis and a decision by the deny
// cache with and without an observer: the observer's cost is two clock
// reads and an interface call per round trip.
func BenchmarkObserver(b *testing.B) {
	srv := sharedServer(b)
	var n atomic.Int64
	for _, path := range []string{"redis", "redis-batched", "cache"} {
		for _, obs := range []redisstore.Observer{nil, countingObserver{&n}} {
			name := path + "/none"
			opts := []redisstore.Option{}
			if obs != nil {
				name = path + "/observer"
				opts = append(opts, redisstore.WithObserver(obs))
			}
			b.Run(name, func(b *testing.B) {
				lim := floodgate.PerSecond(1e9, 1e9)
				switch path {
				case "redis-batched":
					opts = append(opts, redisstore.WithBatching(256))
				case "cache":
					lim = floodgate.PerSecond(1e-6, 1)
					opts = append(opts, redisstore.WithDenyCache(16))
				}
				s := newStore(b, newClient(b, srv.Addr), opts...)
				s.TakeN(bg, "k", lim, 1)
				if path == "cache" {
					if res, _ := s.TakeN(bg, "k", lim, 1); res.Allowed {
						b.Fatalf("TakeN = %+v, want a denial to cache", res)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				if path == "redis-batched" {
					b.SetParallelism(16)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							s.TakeN(bg, "k", lim, 1)
						}
					})
					return
				}
				for b.Loop() {
					s.TakeN(bg, "k", lim, 1)
				}
			})
		}
	}
}
