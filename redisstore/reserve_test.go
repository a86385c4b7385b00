package redisstore_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/remote"
)

// A reserveStep is one call of the reservation scenario and what it must
// give, on every store.
type reserveStep struct {
	advance time.Duration // the clock moves first
	op      string        // take N, reserve N, settle N, or settle-again N
	n       int

	want  outcome
	calls int // script calls a Redis store makes: reserve and settle are one each
}

// outcome is what a step returned, without the source, which differs
// between stores.
type outcome struct {
	Allowed           bool
	Remaining, Owed   int
	RetryAfter, Reset time.Duration
	Err               string
}

// reserveScenario walks one bucket (10/s, burst 10, a debt limit of one
// burst) through a refund, an overrun into debt, refusals while in debt,
// its repayment and a charge beyond the debt limit.
var reserveScenario = []reserveStep{
	{op: "reserve", n: 5, want: outcome{Allowed: true, Remaining: 5, Reset: 500 * time.Millisecond}, calls: 1},
	{op: "settle", n: 2, want: outcome{Allowed: true, Remaining: 8, Reset: 200 * time.Millisecond}, calls: 1},
	{op: "reserve", n: 5, want: outcome{Allowed: true, Remaining: 3, Reset: 700 * time.Millisecond}, calls: 1},
	{op: "settle", n: 12, want: outcome{Allowed: true, Owed: 4, Reset: 1400 * time.Millisecond}, calls: 1},
	{op: "take", n: 1, want: outcome{Owed: 4, RetryAfter: 500 * time.Millisecond, Reset: 1400 * time.Millisecond}, calls: 1},
	{op: "reserve", n: 0, want: outcome{Owed: 4, RetryAfter: 400 * time.Millisecond, Reset: 1400 * time.Millisecond}, calls: 1},
	{op: "reserve", n: 3, want: outcome{Owed: 4, RetryAfter: 700 * time.Millisecond, Reset: 1400 * time.Millisecond}, calls: 1},
	// A refused reservation settles to nothing, without a call.
	{op: "settle", n: 9, want: outcome{Owed: 4, RetryAfter: 700 * time.Millisecond, Reset: 1400 * time.Millisecond}},
	{advance: 400 * time.Millisecond, op: "reserve", n: 0, want: outcome{Allowed: true, Reset: time.Second}, calls: 1},
	// 25 due, 10 fit: the bucket owes its debt limit.
	{op: "settle", n: 25, want: outcome{Allowed: true, Owed: 10, Reset: 2 * time.Second,
		Err: "floodgate: charge exceeds the debt limit: 15 tokens not charged"}, calls: 1},
	{op: "settle-again", n: 1, want: outcome{Err: floodgate.ErrSettled.Error()}},
	{advance: 1200 * time.Millisecond, op: "reserve", n: 2, want: outcome{Allowed: true, Reset: time.Second}, calls: 1},
	// As reserved: nothing changes, and no call.
	{op: "settle", n: 2, want: outcome{Allowed: true, Reset: time.Second}},
	{advance: 3 * time.Second, op: "take", n: 1, want: outcome{Allowed: true, Remaining: 9, Reset: 100 * time.Millisecond}, calls: 1},
}

// runScenario runs reserveScenario on store, advancing time with advance,
// and checks each step; calls, when not nil, counts the script calls Redis
// served so far.
func runScenario(t *testing.T, store floodgate.Reserver, advance func(time.Duration), calls func() int) {
	t.Helper()
	lim := floodgate.PerSecond(10, 10)
	var r floodgate.Reservation
	for i, st := range reserveScenario {
		advance(st.advance)
		before := 0
		if calls != nil {
			before = calls()
		}
		var res floodgate.Result
		var err error
		switch st.op {
		case "take":
			res, err = store.TakeN(bg, "k", lim, st.n)
		case "reserve":
			r, err = store.ReserveN(bg, "k", lim, st.n)
			res = r.Result
		case "settle", "settle-again":
			res, err = r.Settle(bg, st.n)
		}
		got := outcome{Allowed: res.Allowed, Remaining: res.Remaining, Owed: res.Owed, RetryAfter: res.RetryAfter, Reset: res.ResetAfter}
		if err != nil {
			got.Err = err.Error()
		}
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Errorf("step %d: %s %d (-want +got):\n%s", i, st.op, st.n, diff)
		}
		if calls != nil {
			if n := calls() - before; n != st.calls {
				t.Errorf("step %d: %s %d made %d script calls, want %d", i, st.op, st.n, n, st.calls)
			}
		}
	}
}

// scriptCalls returns a function that counts the EVALSHA and EVAL calls
// the servers at addrs have served, from their command statistics.
func scriptCalls(t *testing.T, addrs []string) func() int {
	return func() int {
		total := 0
		for _, a := range addrs {
			info, err := redistest.Do(a, "INFO", "commandstats")
			if err != nil {
				t.Fatal(err)
			}
			for line := range strings.Lines(info) {
				name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
				if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
					continue
				}
				n, _ := strconv.Atoi(rest[:strings.IndexByte(rest+",", ',')])
				total += n
			}
		}
		return total
	}
}

// registered is an Observer that reports the store's first count of
// instances, so that a test can wait for the registration, a script call
// of its own, before it counts the bucket's.
type registered struct{ done chan struct{} }

func (registered) ObserveCall(time.Duration, remote.ErrorKind) {}
func (registered) ObserveBreaker(_, _ remote.BreakerState)     {}
func (registered) ObserveFallback(floodgate.Source)            {}
func (registered) ObserveStarved()                             {}
func (r registered) ObserveInstances(int)                      { close(r.done) }

// countedStore returns a store on c with a client clock, whose instance
// registration has run (once an hour from now on), with the bucket script
// loaded on the node of key "k".
func countedStore(t *testing.T, c redis.UniversalClient, clock *fakeClock, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	t.Cleanup(redisstore.SetInstancePeriod(time.Hour))
	reg := registered{done: make(chan struct{})}
	s := newStore(t, c, append(opts, redisstore.WithClientClock(clock), redisstore.WithObserver(reg))...)
	// A peek loads the script (EVAL after NOSCRIPT) and starts the
	// registration; neither changes the bucket.
	if _, err := s.Peek(bg, "k", floodgate.PerSecond(10, 10)); err != nil {
		t.Fatal(err)
	}
	<-reg.done
	return s
}

// TestReserveSettle runs the scenario on the keyed store and on Redis,
// standalone and Cluster, each call alone and batched, and counts the
// script calls each step makes on Redis: reserve and settle are one round
// trip each.
func TestReserveSettle(t *testing.T) {
	t.Run("keyed", func(t *testing.T) {
		clock := newFakeClock()
		m, err := keyed.New(keyed.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		runScenario(t, m, clock.Advance, nil)
	})
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	for _, target := range []struct {
		name    string
		addrs   []string
		connect func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", []string{srv.Addr}, func(t *testing.T) redis.UniversalClient { return newClient(t, srv.Addr) }},
		{"cluster", cl.Addrs, func(t *testing.T) redis.UniversalClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
			t.Cleanup(func() { c.Close() })
			return c
		}},
	} {
		for _, batched := range []bool{false, true} {
			name := target.name
			var opts []redisstore.Option
			if batched {
				name += "/batched"
				opts = append(opts, redisstore.WithBatching(16))
			}
			t.Run(name, func(t *testing.T) {
				clock := newFakeClock()
				s := countedStore(t, target.connect(t), clock, opts...)
				runScenario(t, s, clock.Advance, scriptCalls(t, target.addrs))
				if st := s.Stats(); st.Errors != 0 {
					t.Errorf("Stats = %+v, want no errors", st)
				}
			})
		}
	}
}

// peekTokens returns key's whole tokens on s, negative while it owes.
func peekTokens(t *testing.T, s *redisstore.Store, key string, lim floodgate.Limit) int {
	t.Helper()
	res, err := s.Peek(bg, key, lim)
	if err != nil {
		t.Fatal(err)
	}
	return res.Remaining - res.Owed
}

// TestSettleBadInput: every bad input gets an error or does what its
// documentation says, and no token is lost or created: the bucket's tokens
// before and after are checked each time (a frozen client clock: no
// refill).
func TestSettleBadInput(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	lim := floodgate.PerSecond(1, 10)
	must := func(t *testing.T, s *redisstore.Store, n int) floodgate.Reservation {
		t.Helper()
		r, err := s.ReserveN(bg, "k", lim, n)
		if err != nil || !r.Result.Allowed {
			t.Fatalf("ReserveN(%d) = %+v, %v", n, r.Result, err)
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		do      func(t *testing.T, s *redisstore.Store) error
		want    int
		wantErr error
	}{
		{"negative reservation", func(t *testing.T, s *redisstore.Store) error {
			_, err := s.ReserveN(bg, "k", lim, -1)
			return err
		}, 10, floodgate.ErrNegativeN},
		{"negative cost", func(t *testing.T, s *redisstore.Store) error {
			r := must(t, s, 4)
			if _, err := r.Settle(bg, -1); !errors.Is(err, floodgate.ErrNegativeN) {
				return err
			}
			_, err := r.Settle(bg, 1)
			return err
		}, 9, nil},
		{"negative SettleN", func(t *testing.T, s *redisstore.Store) error {
			_, err := s.SettleN(bg, "k", lim, 2, -1)
			return err
		}, 10, floodgate.ErrNegativeN},
		{"reservation above the burst", func(t *testing.T, s *redisstore.Store) error {
			r, err := s.ReserveN(bg, "k", lim, 11)
			if r.Result.Allowed || r.Result.RetryAfter != floodgate.Never {
				t.Errorf("ReserveN(11) = %+v, want refused for good", r.Result)
			}
			if _, err := r.Settle(bg, 11); err != nil {
				return err
			}
			return err
		}, 10, floodgate.ErrExceedsBurst},
		{"cost above the debt limit", func(t *testing.T, s *redisstore.Store) error {
			r := must(t, s, 1)
			_, err := r.Settle(bg, 30)
			return err
		}, -10, floodgate.ErrDebtLimit},
		{"settled twice", func(t *testing.T, s *redisstore.Store) error {
			r := must(t, s, 4)
			if _, err := r.Settle(bg, 1); err != nil {
				return err
			}
			_, err := r.Settle(bg, 0)
			return err
		}, 9, floodgate.ErrSettled},
		{"settled after the limit changed", func(t *testing.T, s *redisstore.Store) error {
			low := floodgate.PerSecond(1, 3)
			r := must(t, s, 4)                                    // 6
			if res, _ := s.TakeN(bg, "k", low, 1); !res.Allowed { // capped at 3, then 2
				t.Error("take under the new limit refused")
			}
			if _, err := r.Settle(bg, 1); err != nil { // 3 back under lim: 5
				return err
			}
			if got := peekTokens(t, s, "k", low); got != 3 {
				t.Errorf("tokens under the new limit = %d, want 3", got)
			}
			return nil
		}, 5, nil},
		{"refused reservation", func(t *testing.T, s *redisstore.Store) error {
			if _, err := s.TakeN(bg, "k", lim, 10); err != nil {
				return err
			}
			r, err := s.ReserveN(bg, "k", lim, 1)
			if err != nil || r.Result.Allowed {
				t.Errorf("ReserveN on an empty bucket = %+v, %v; want refused", r.Result, err)
			}
			_, err = r.Settle(bg, 5)
			return err
		}, 0, nil},
		{"invalid limit", func(t *testing.T, s *redisstore.Store) error {
			_, err := s.SettleN(bg, "k", floodgate.Limit{Rate: 1, Burst: 10, Debt: -3}, 0, 3)
			return err
		}, 10, floodgate.ErrInvalidLimit},
		{"key too long", func(t *testing.T, s *redisstore.Store) error {
			_, err := s.SettleN(bg, strings.Repeat("k", redisstore.MaxKeyLen+1), lim, 0, 3)
			return err
		}, 10, floodgate.ErrKeyTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, c, redisstore.WithClientClock(newFakeClock()))
			if got := peekTokens(t, s, "k", lim); got != 10 {
				t.Fatalf("tokens before = %d, want 10", got)
			}
			if err := tc.do(t, s); !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("error = %v, want %v", err, tc.wantErr)
			}
			if got := peekTokens(t, s, "k", lim); got != tc.want {
				t.Errorf("tokens after = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestSettleLargeBurst: at the largest burst and debt limit, a charge stops
// exactly at the debt limit: the script's arithmetic is exact there too.
func TestSettleLargeBurst(t *testing.T) {
	srv := sharedServer(t)
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithClientClock(newFakeClock()))
	lim := floodgate.Limit{Rate: 0, Burst: floodgate.MaxBurst, Debt: floodgate.MaxBurst}
	r, err := s.ReserveN(bg, "k", lim, floodgate.MaxBurst-1) // one token left
	if err != nil || !r.Result.Allowed || r.Result.Remaining != 1 {
		t.Fatalf("ReserveN = %+v, %v", r.Result, err)
	}
	res, err := r.Settle(bg, 2*floodgate.MaxBurst+5) // MaxBurst+6 more: MaxBurst+1 fit
	var dle *floodgate.DebtLimitError
	if !errors.As(err, &dle) || dle.Uncharged != 5 {
		t.Errorf("Settle error = %v, want 5 tokens not charged", err)
	}
	if res.Owed != floodgate.MaxBurst {
		t.Errorf("Owed = %d, want %d", res.Owed, floodgate.MaxBurst)
	}
	if got, _ := s.SettleN(bg, "k", lim, floodgate.MaxBurst, 0); got.Owed != 0 || got.Remaining != 0 {
		t.Errorf("a refund of the debt = %+v, want an empty bucket", got)
	}
}

// TestReserveFallback: with Redis down, a reservation the Local policy's
// fallback decided settles on the fallback, under the scaled limit; one the
// Open policy admitted settles to nothing.
func TestReserveFallback(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	local := newStore(t, c, redisstore.WithDeadline(50*time.Millisecond), redisstore.WithFallback(m), redisstore.WithLocalDivisor(2),
		redisstore.WithClientClock(clock))
	open := newStore(t, c, redisstore.WithDeadline(50*time.Millisecond), redisstore.WithFailurePolicy(redisstore.Open))
	srv.Kill()
	lim := floodgate.PerSecond(20, 20) // the fallback's share: 10/s, burst 10
	// The fallback starts empty, and refills at its share of the rate.
	if r, err := local.ReserveN(bg, "k", lim, 4); err != nil || r.Result.Allowed || r.Result.Source != floodgate.SourceFallback {
		t.Fatalf("ReserveN as Redis went down = %+v, %v; want the fallback's refusal", r.Result, err)
	}
	clock.Advance(900 * time.Millisecond)
	r, err := local.ReserveN(bg, "k", lim, 4)
	if err != nil || !r.Result.Allowed || r.Result.Source != floodgate.SourceFallback || r.Result.Remaining != 5 {
		t.Fatalf("ReserveN with Redis down = %+v, %v; want the fallback's, 5 left", r.Result, err)
	}
	res, err := r.Settle(bg, 12)
	if err != nil || res.Owed != 3 {
		t.Errorf("Settle(12) on the fallback = %+v, %v; want 3 owed", res, err)
	}
	if got := m.Tokens("k", lim.Scale(0.5)); got != -3 {
		t.Errorf("fallback tokens = %v, want -3", got)
	}
	if r, err := local.ReserveN(bg, "k", lim, 0); err != nil || r.Result.Allowed {
		t.Errorf("ReserveN(0) on the fallback in debt = %+v, %v; want refused", r.Result, err)
	}
	r, err = open.ReserveN(bg, "k", lim, 4)
	if err != nil || !r.Result.Allowed || r.Result.Source != floodgate.SourceFailOpen {
		t.Fatalf("ReserveN under Open = %+v, %v", r.Result, err)
	}
	if res, err := r.Settle(bg, 50); err != nil || res != r.Result {
		t.Errorf("Settle of a fail-open reservation = %+v, %v; want its Result, nil", res, err)
	}
	if _, err := local.SettleN(bg, "k", lim, 0, 1); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Errorf("SettleN with Redis down = %v, want ErrUnavailable", err)
	}
}

// TestSettleCacheAndLeases: a refund clears this process's cached denial,
// and a settle that leaves the bucket in debt ends its lease, so that its
// next take is refused at once.
func TestSettleCacheAndLeases(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock), redisstore.WithDenyCache(16),
		redisstore.WithLeases(100*time.Millisecond, 16))
	lim := floodgate.PerSecond(100, 20) // leases of up to 10 extra tokens
	r, err := s.ReserveN(bg, "cached", lim, 20)
	if err != nil || !r.Result.Allowed {
		t.Fatal(r.Result, err)
	}
	if res, _ := s.TakeN(bg, "cached", lim, 5); res.Allowed || res.Source != floodgate.SourceRedis {
		t.Fatalf("TakeN on the drained bucket = %+v, want refused by Redis", res)
	}
	if res, _ := s.TakeN(bg, "cached", lim, 5); res.Source != floodgate.SourceCache {
		t.Fatalf("second TakeN = %+v, want the cached denial", res)
	}
	if _, err := r.Settle(bg, 10); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.TakeN(bg, "cached", lim, 5); !res.Allowed || res.Source != floodgate.SourceRedis {
		t.Errorf("TakeN after the refund = %+v, want allowed by Redis", res)
	}

	// Two takes make the key hot; the second leases.
	s.TakeN(bg, "leased", lim, 1)
	if res, _ := s.TakeN(bg, "leased", lim, 1); !res.Allowed {
		t.Fatalf("TakeN = %+v", res)
	}
	r, err = s.ReserveN(bg, "leased", lim, 1)
	if err != nil || r.Result.Source != floodgate.SourceLease {
		t.Fatalf("ReserveN on a leased key = %+v, %v; want a lease's", r.Result, err)
	}
	// 20 − 1 − (1 + 2 leased) = 16 on Redis; 24 more leave it owing 8.
	if res, err := r.Settle(bg, 25); err != nil || res.Owed != 8 {
		t.Fatalf("Settle(25) = %+v, %v; want the bucket owing 8", res, err)
	}
	if res, _ := s.TakeN(bg, "leased", lim, 1); res.Allowed || res.Source != floodgate.SourceRedis || res.Owed == 0 {
		t.Errorf("TakeN after the overrun = %+v, want refused by Redis for the debt", res)
	}
}

// TestReserveLeasesBound: four stores with leases share a bucket and
// reserve and settle on it, overrunning their estimates, while the client
// clock advances, asking for more than the bucket gives (about 2,200
// against 1,760), their estimates often long and now and then far short.
// The actual cost they admitted stays within burst + rate·t + the debt
// limit, plus what they were told was not charged: leases add nothing.
func TestReserveLeasesBound(t *testing.T) {
	srv := sharedServer(t)
	clock := newFakeClock()
	const d = 50 * time.Millisecond
	lim := floodgate.PerSecond(800, 80) // leases of up to 10 extra tokens, at least half of them
	var stores []*redisstore.Store
	pre := prefix(t)
	for range 4 {
		stores = append(stores, newStore(t, newClient(t, srv.Addr), redisstore.WithPrefix(pre),
			redisstore.WithClientClock(clock), redisstore.WithLeases(d, 16)))
	}
	const steps = 2000
	step := time.Millisecond
	var demand, admitted, uncharged, leased int
	for i := range steps {
		s := stores[i%len(stores)]
		actual := i % 2 // 0 or 1: under the estimate or on it
		if i%100 == 0 {
			actual = 60 // beyond any debt limit
		}
		demand += actual
		r, err := s.ReserveN(bg, "k", lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Result.Allowed {
			if r.Result.Source == floodgate.SourceLease {
				leased++
			}
			_, err := r.Settle(bg, actual)
			var dle *floodgate.DebtLimitError
			if errors.As(err, &dle) {
				uncharged += dle.Uncharged
			} else if err != nil {
				t.Fatal(err)
			}
			admitted += actual
		}
		clock.Advance(step)
	}
	elapsed := time.Duration(steps) * step
	bound := float64(lim.Burst) + lim.Rate*elapsed.Seconds() + float64(lim.DebtLimit()) + float64(uncharged)
	if float64(demand) <= bound {
		t.Fatalf("a demand of %d never exceeds the bound %.0f: the test tests nothing", demand, bound)
	}
	if float64(admitted) > bound {
		t.Errorf("admitted a cost of %d in %v, more than burst + rate·t + debt + uncharged = %v", admitted, elapsed, bound)
	}
	if leased == 0 {
		t.Error("no reservation was served from a lease: the test tests nothing of leases")
	}
	if got := peekTokens(t, stores[0], "k", lim); got < -lim.DebtLimit() {
		t.Errorf("the bucket holds %d tokens, below the debt limit", got)
	}
	t.Logf("admitted %d (bound %.0f), %d from leases, %d not charged", admitted, bound, leased, uncharged)
}
