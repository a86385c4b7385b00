package rls_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/remote"
	"github.com/floodgate-go/floodgate/rls"
	"github.com/floodgate-go/floodgate/rls/rlqstest"
)

// TestQuotaReplicasWithEnvoys runs three quota servers on one Redis, each
// with two of six Envoy-faithful clients, all asking for one tenant's quota
// of 100 a second with Zipf-skewed demands (82 down to 14 a second, twice
// the quota together). On a fake clock, with a report every second and a
// round on Redis every quarter second, the replicas divide the quota as
// one server would: what the clients enforce together never exceeds it, no
// 10 s window from their start together admits more than 3% over it,
// windows after the first
// reports admit at least 95% of it, and the client wanting less than an
// equal part gets what it wants although the clients wanting most are on
// other replicas.
//
// At 20 s one of three things happens:
//   - shutdown: replica 0 closes, marking its grant draining; its clients
//     come back on replica 1, which claims the grant as they arrive: every
//     window stays in the band;
//   - crash: replica 0 stops without a word; its grant stays held on Redis
//     for its hold, covering the assignments its clients may still enforce:
//     the bound holds, and the band is back once the hold has passed;
//   - reload: each replica's config halves the quota, 300 ms apart, as
//     replicas reloading one file do: every window holds the quota in force
//     over it, and the band returns within 3 s;
//   - flush: Redis loses every grant (FLUSHDB, as a restart without
//     persistence does): the replicas' next rounds grant anew within the
//     quota, and every window stays in the band.
func TestQuotaReplicasWithEnvoys(t *testing.T) {
	// The store, and a function that empties its Redis.
	standalone := func(t *testing.T, clock *fakeClock) (rls.QuotaStore, func() error) {
		st, c := sharedStore(t, clock)
		return st, func() error { return c.FlushDB(bg).Err() }
	}
	// The RLS tests' Cluster backend: a 3-master Cluster, the quota's hash
	// on the master of its slot.
	cluster := func(t *testing.T, clock *fakeClock) (rls.QuotaStore, func() error) {
		return backends[3].store(t, clock).(*redisstore.Store), nil
	}
	for _, event := range []string{"shutdown", "crash", "reload", "flush"} {
		t.Run(event, func(t *testing.T) { testQuotaReplicas(t, standalone, event) })
	}
	t.Run("cluster/shutdown", func(t *testing.T) { testQuotaReplicas(t, cluster, "shutdown") })
}

func testQuotaReplicas(t *testing.T, store func(*testing.T, *fakeClock) (rls.QuotaStore, func() error), event string) {
	clock := newFakeClock()
	st, flush := store(t, clock)
	reports := make(chan struct{}, 1024)
	replicas := make([]*rls.QuotaServer, 3)
	services := make([]*rls.Service, 3)
	switches := make([]*quotaSwitch, 3)
	envoys := make([]*rlqstest.Envoy, 0, 6)
	for r := range replicas {
		services[r] = quotaService(t, clock, quotaConfig)
		qs, err := rls.NewQuotaServer(services[r], rls.WithReportInterval(time.Second), rls.WithQuotaClock(clock), rls.WithQuotaStore(st))
		if err != nil {
			t.Fatal(err)
		}
		rls.SetQuotaReportHook(qs, func() { reports <- struct{}{} })
		t.Cleanup(qs.Close)
		replicas[r] = qs
		switches[r] = &quotaSwitch{}
		switches[r].cur.Store(qs)
		lis := bufconn.Listen(1 << 20)
		gs := grpc.NewServer()
		rlqspb.RegisterRateLimitQuotaServiceServer(gs, switches[r])
		go func() { _ = gs.Serve(lis) }()
		t.Cleanup(gs.Stop)
		envoys = append(envoys, dialEnvoys(t, lis, clock, 2)...)
	}
	// Client i is on replica i/2; the demands go to replicas 0, 0, 1, 1, 2, 2
	// as 82, 20, 41, 16, 27, 14: each replica has a large and a small one.
	demands := []float64{82, 20, 41, 16, 27, 14}
	const smallest = 5
	bucket := map[string]string{"api": "orders", "tenant": "acme"}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	received := func() []int { return handled(envoys) }
	settle := func(n int, seen []int) { settled(t, ctx, reports, envoys, n, seen) }
	crashed := false
	ends := 0 // streams that ended, each an event a client counts
	rounds := func() {
		for r, qs := range replicas {
			if r == 0 && crashed {
				continue
			}
			qs.Round(bg)
		}
		quiesce(t, ctx, switches, envoys, ends)
	}

	const (
		step     = 10 * time.Millisecond
		duration = 40 * time.Second
		warm     = 3 * time.Second // the first two reports
		eventAt  = 20 * time.Second
		window   = 10 * time.Second
	)
	// limitAt is the quota in force at now: halved by the reload, once
	// every replica has applied it (at its first report after its reload).
	limitAt := func(now time.Duration) float64 {
		if event == "reload" && now > eventAt+time.Second {
			return 50
		}
		return 100
	}
	// The reload: replica r takes the halved quota at 20 s + r × stagger.
	halved := mustParse(t, strings.Replace(quotaConfig, "requests_per_unit: 100", "requests_per_unit: 50", 1))
	const stagger = 300 * time.Millisecond
	pace := newPacer(demands)
	steps := int(duration / step)
	admitted := make([]int, steps+1) // the fleet's, by step
	offered := make([]int, len(envoys))
	got := make([]int, len(envoys))
	seen := received()
	for _, e := range envoys {
		e.Request(bucket)
	}
	settle(len(envoys), seen)
	rounds()
	for k := 1; k <= steps; k++ {
		now := time.Duration(k) * step
		clock.Advance(step)
		pace.step(envoys, bucket, step, func(i int, ok bool) {
			if ok {
				admitted[k]++
			}
			if now > warm && now <= eventAt {
				offered[i]++
				if ok {
					got[i]++
				}
			}
		})
		if since := now - eventAt; event == "reload" && since >= 0 && since%stagger == 0 && since/stagger < 3 {
			services[since/stagger].SetConfig(halved)
		}
		if now%replicas[1].RoundPeriod() == 0 {
			rounds()
		}
		if now%time.Second != 0 {
			continue
		}
		seen := received()
		for _, e := range envoys {
			if err := e.Report(); err != nil {
				t.Fatal(err)
			}
		}
		settle(len(envoys), seen)
		for r, qs := range replicas {
			if r != 0 || !crashed {
				qs.Tick()
			}
		}
		quiesce(t, ctx, switches, envoys, ends)
		enforced := 0.0
		for _, e := range envoys {
			enforced += e.Stats()[rlqstest.Key(bucket)].Rate
		}
		if lim := limitAt(now); now > warm && (now <= eventAt || now >= eventAt+2*time.Second) && enforced > lim {
			t.Errorf("%v: the clients enforce %.1f/s together, over the quota of %.0f", now, enforced, lim)
		}
		if now == eventAt && event == "flush" {
			if err := flush(); err != nil {
				t.Fatal(err)
			}
		}
		if now == eventAt && (event == "shutdown" || event == "crash") {
			// Replica 0 ends its streams; its clients keep their
			// assignments and reach replica 1 on their next report.
			seen := received()
			if event == "crash" {
				rls.Crash(replicas[0])
			} else {
				replicas[0].Close()
			}
			crashed = true
			ends += 2
			for i := range 2 {
				if err := envoys[i].WaitReceived(ctx, seen[i]+1); err != nil {
					t.Fatal(err)
				}
			}
			switches[0].cur.Store(replicas[1])
		}
	}
	per := int(window / step)
	// After a crash, replica 0's grant is held for the TTL and two rounds,
	// then divided again within two reports.
	settled := eventAt
	switch event {
	case "crash":
		settled += replicas[1].TTL() + 2*replicas[1].RoundPeriod() + 2*time.Second
	case "reload":
		settled += 3 * time.Second
	}
	lowR, highR := math.Inf(1), 0.0 // admitted ÷ the quota in force, over the band's span
	for from := 0; from+per <= steps; from++ {
		n, quota := 0, 0.0
		for k := from + 1; k <= from+per; k++ {
			n += admitted[k]
			quota += limitAt(time.Duration(k)*step) * step.Seconds()
		}
		at := time.Duration(from) * step
		if float64(n) > 1.03*quota {
			t.Errorf("the fleet admitted %d in the 10 s from %v, over 103%% of the quota in force (%.0f)", n, at, quota)
		}
		if at >= warm && (at+window <= eventAt || at >= settled) {
			lowR, highR = min(lowR, float64(n)/quota), max(highR, float64(n)/quota)
			if float64(n) < 0.95*quota {
				t.Errorf("the fleet admitted %d in the 10 s from %v, under 95%% of the quota in force (%.0f)", n, at, quota)
			}
		}
	}
	t.Logf("10 s windows in the band's span: %.3f–%.3f of the quota in force", lowR, highR)
	for i := range envoys {
		t.Logf("client %d (replica %d): wants %.0f/s, admitted %d of %d before the crash", i, i/2, demands[i], got[i], offered[i])
	}
	if float64(got[smallest]) < 0.95*float64(offered[smallest]) {
		t.Errorf("the client wanting %.0f/s, under an equal part, had %d of its %d admitted, under 95%%",
			demands[smallest], got[smallest], offered[smallest])
	}
}

// TestQuotaReplicaRedisDown: a replica whose Redis stops answering keeps
// dividing the grant it last held, answers every report as before, counts
// each failed round and blocks on none longer than a round's timeout; once
// Redis is back, its next round holds its grant there again.
func TestQuotaReplicaRedisDown(t *testing.T) {
	skipWithoutRedis(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	st, err := redisstore.New(c, redisstore.WithPrefix(prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	e := newQuotaEnv(t, quotaConfig, rls.WithQuotaStore(st))
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.qs.Collectors()...)
	failed := func() float64 { return gather(t, reg)["floodgate_rls_quota_share_errors_total{}"] }

	q := e.open(t, "edge")
	q.report(usage{id: orders, allowed: 1})
	e.qs.Round(bg)
	e.clock.Advance(time.Second)
	q.report(usage{id: orders, allowed: 60, elapsed: time.Second})
	e.qs.Round(bg)
	q.await(orders, "a share of the grant", func(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		n, _, ok := tokens(a)
		return ok && n >= 60
	})
	if got := failed(); got != 0 {
		t.Fatalf("%v failed rounds with Redis up", got)
	}

	srv.Kill()
	start := time.Now()
	e.qs.Round(bg)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a round with Redis down took %v", d)
	}
	if got := failed(); got != 1 {
		t.Errorf("%v failed rounds counted after one with Redis down, want 1", got)
	}
	// The next report is answered from the grant held before.
	e.clock.Advance(time.Second)
	q.report(usage{id: orders, allowed: 70, elapsed: time.Second})
	q.await(orders, "a share of the last grant", func(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		n, _, ok := tokens(a)
		return ok && n >= 60
	})

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		before := failed()
		e.qs.Round(bg)
		if failed() == before {
			break // the pool may need a round to redial
		}
		if ctx.Err() != nil {
			t.Fatal("no round succeeded within 10 s of Redis's restart")
		}
		time.Sleep(50 * time.Millisecond)
	}
	keys, err := redistest.Do(srv.Addr, "KEYS", "*rlqs:*")
	if err != nil || keys == "" {
		t.Fatalf("no quota hash on the restarted Redis: %q, %v", keys, err)
	}
	if n, err := redistest.Do(srv.Addr, "HLEN", keys); n != "1" {
		t.Errorf("the quota's hash on the restarted Redis has %q members (%v), want this replica", n, err)
	}
}

// fakeShares is a QuotaStore that grants what is asked, records every
// request, and notes whether two calls ever overlapped.
type fakeShares struct {
	mu       sync.Mutex
	inFlight int
	overlap  bool
	reqs     []fakeShareCall
}

type fakeShareCall struct {
	key string
	req remote.ShareRequest
}

func (f *fakeShares) Share(_ context.Context, key string, req remote.ShareRequest) (remote.ShareReply, error) {
	f.mu.Lock()
	f.inFlight++
	f.overlap = f.overlap || f.inFlight > 1
	f.reqs = append(f.reqs, fakeShareCall{key, req})
	f.mu.Unlock()
	time.Sleep(time.Millisecond) // long enough for another round to start
	f.mu.Lock()
	f.inFlight--
	f.mu.Unlock()
	return remote.ShareReply{Granted: req.Want, Claimed: req.Claim}, nil
}

// TestQuotaRoundsInTurn: rounds called at once, and Close among them, run
// one after another: a claim is sent once, and the draining round is the
// last one Redis sees.
func TestQuotaRoundsInTurn(t *testing.T) {
	f := &fakeShares{}
	e := newQuotaEnv(t, quotaConfig, rls.WithQuotaStore(f))
	q := e.open(t, "edge")
	// A returning subscriber: 100 allowed over its first report's 2 s.
	q.report(usage{id: orders, allowed: 100, elapsed: 2 * time.Second})
	q.await(orders, "an assignment", anyAction)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				e.qs.Round(bg)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	e.qs.Close()
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.overlap {
		t.Error("two rounds called the store at once")
	}
	claimed := 0.0
	for _, c := range f.reqs {
		claimed += c.req.Claim
	}
	if claimed != 50 {
		t.Errorf("claims sent add up to %v, want the 50 a second held, once", claimed)
	}
	if n := len(f.reqs); n == 0 || !f.reqs[n-1].req.Draining {
		t.Errorf("the last of %d requests is not the draining one", n)
	}
}

// TestQuotaShareKeys: a quota whose key is too long for a store is shared
// under its hash; a round publishes at most remote.MaxShareDemands
// demands, keeping their sum.
func TestQuotaShareKeys(t *testing.T) {
	f := &fakeShares{}
	e := newQuotaEnv(t, quotaConfig, rls.WithQuotaStore(f))
	long := map[string]string{"api": "orders", "tenant": strings.Repeat("x", 2000)}
	q := e.open(t, "edge")
	q.report(usage{id: long, allowed: 1})
	q.await(long, "an assignment", anyAction)
	e.qs.Round(bg)
	f.mu.Lock()
	for _, c := range f.reqs {
		if !strings.HasPrefix(c.key, "rlqs#") || len(c.key) > 100 {
			t.Errorf("a long quota shared under %.40q (%d bytes), want rlqs# and its hash", c.key, len(c.key))
		}
	}
	f.mu.Unlock()

	many := make([]float64, remote.MaxShareDemands+10)
	sum := 0.0
	for i := range many {
		many[i] = float64(i % 7)
		sum += many[i]
	}
	got := rls.Publishable(many)
	gotSum := 0.0
	for _, x := range got {
		gotSum += x
	}
	if len(got) != remote.MaxShareDemands || gotSum != sum {
		t.Errorf("publishable: %d demands summing to %v, want %d summing to %v", len(got), gotSum, remote.MaxShareDemands, sum)
	}
	if few := []float64{3, 1}; &rls.Publishable(few)[0] != &few[0] {
		t.Error("publishable copied demands within the bound")
	}
}
