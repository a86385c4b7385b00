package rls_test

import (
	"context"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/rls"
	"github.com/floodgate-go/floodgate/rls/rlqstest"
)

// TestQuotaWithEnvoys drives the quota server with three clients that
// behave as Envoy's rate_limit_quota filter does (rlqstest), each on its
// own connection, all asking for one tenant's quota of 100 a second: one
// wants 10 a second, one 100, one 300, four times the quota together. On
// a fake clock, in steps of 10 ms, for 20 s with a report every second:
// after the first seconds, the fleet admits at most the quota plus the
// buckets' bursts, and at least 90% of it, and the client that wants less
// than an equal part gets what it wants.
func TestQuotaWithEnvoys(t *testing.T) {
	const limit = 100
	clock := newFakeClock()
	svc := quotaService(t, clock, quotaConfig)
	qs, err := rls.NewQuotaServer(svc, rls.WithReportInterval(time.Second), rls.WithQuotaClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	reports := make(chan struct{}, 1024)
	rls.SetQuotaReportHook(qs, func() { reports <- struct{}{} })
	clock.Advance(qs.TTL()) // past the learning window: no earlier instance
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	qs.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { qs.Close(); gs.Stop() })

	demands := []float64{10, 100, 300}
	envoys := dialEnvoys(t, lis, clock, len(demands))
	bucket := map[string]string{"api": "orders", "tenant": "acme"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	settle := func(n int, seen []int) { settled(t, ctx, reports, envoys, n, seen) }
	received := func() []int { return handled(envoys) }

	const (
		step     = 10 * time.Millisecond
		duration = 20 * time.Second
		warm     = 5 * time.Second
	)
	pace := newPacer(demands)
	admitted := make([]int, len(envoys)) // after the warm-up
	offered := make([]int, len(envoys))
	// The first requests subscribe: each client reports its new bucket at
	// once, and the server answers it at once.
	seen := received()
	for _, e := range envoys {
		e.Request(bucket)
	}
	settle(len(envoys), seen)
	for now := step; now <= duration; now += step {
		clock.Advance(step)
		pace.step(envoys, bucket, step, func(i int, ok bool) {
			if now > warm {
				offered[i]++
				if ok {
					admitted[i]++
				}
			}
		})
		if now%time.Second == 0 {
			seen := received()
			for _, e := range envoys {
				if err := e.Report(); err != nil {
					t.Fatal(err)
				}
			}
			settle(len(envoys), seen)
			qs.Tick()
		}
	}
	window := (duration - warm).Seconds()
	total := 0
	burst := 0
	for i, e := range envoys {
		total += admitted[i]
		st := e.Stats()[rlqstest.Key(bucket)]
		burst += int(st.Burst)
		t.Logf("client %d: wants %.0f/s, offered %d, admitted %d (%.1f/s), assignment %.1f/s burst %d", i, demands[i], offered[i], admitted[i], float64(admitted[i])/window, st.Rate, st.Burst)
	}
	bound := float64(limit)*window + float64(2*burst)
	if float64(total) > bound {
		t.Errorf("the fleet admitted %d in %.0f s, over the quota plus the buckets' bursts, %.0f", total, window, bound)
	}
	if float64(total) < 0.9*limit*window {
		t.Errorf("the fleet admitted %d in %.0f s with 4× the quota asked for, under 90%% of the quota (%.0f)", total, window, 0.9*limit*window)
	}
	if got, want := float64(admitted[0]), 0.95*float64(offered[0]); got < want {
		t.Errorf("the client wanting 10/s had %d of its %d admitted, under 95%%", admitted[0], offered[0])
	}
}

// quotaSwitch serves RLQS with whichever QuotaServer is current, so that a
// test can restart the server while the clients' connections stay up.
// It counts the responses sent (sent), so that a test can wait until its
// clients have applied them (quiesce).
type quotaSwitch struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	cur  atomic.Pointer[rls.QuotaServer]
	sent atomic.Int64
}

func (w *quotaSwitch) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	return w.cur.Load().StreamRateLimitQuotas(&countingStream{st, &w.sent})
}

type countingStream struct {
	rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer
	sent *atomic.Int64
}

func (s *countingStream) Send(r *rlqspb.RateLimitQuotaResponse) error {
	err := s.RateLimitQuotaService_StreamRateLimitQuotasServer.Send(r)
	if err == nil {
		s.sent.Add(1)
	}
	return err
}

// quiesce waits until the clients have handled every response the
// switches sent, ends beyond (streams that ended, each an event a client
// counts) aside, and nothing more was sent for half a millisecond: the
// servers push changed shares from goroutines of their own, in a number a
// test cannot know in advance, and a fake clock must not move on before
// they are applied.
func quiesce(t *testing.T, ctx context.Context, switches []*quotaSwitch, envoys []*rlqstest.Envoy, ends int) {
	t.Helper()
	var since time.Time
	last := int64(-1)
	for {
		var sent int64
		for _, w := range switches {
			sent += w.sent.Load()
		}
		got := int64(-ends)
		for _, e := range envoys {
			got += int64(e.Received())
		}
		switch {
		case sent != got || sent != last:
			since, last = time.Now(), sent
		case time.Since(since) >= 500*time.Microsecond:
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("responses sent %d, handled %d: %v", sent, got, ctx.Err())
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// TestQuotaRestartWithEnvoys runs TestQuotaWithEnvoys's three clients
// against a server that is closed and replaced by a new one at 20 s. The
// clients keep enforcing the old assignments and come back to the new
// server 1, 2 and 3 s later; while it learns, it gives each back what it
// held, so that what they enforce, old assignments and new, stays within
// the quota at every report. No
// 10 s window admits more than 3% over the quota, and once the learning
// window has passed the division is back within 95–103% of it.
func TestQuotaRestartWithEnvoys(t *testing.T) {
	const limit = 100
	clock := newFakeClock()
	svc := quotaService(t, clock, quotaConfig)
	reports := make(chan struct{}, 1024)
	start := func() *rls.QuotaServer {
		qs, err := rls.NewQuotaServer(svc, rls.WithReportInterval(time.Second), rls.WithQuotaClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		rls.SetQuotaReportHook(qs, func() { reports <- struct{}{} })
		t.Cleanup(qs.Close)
		return qs
	}
	qs := start()
	clock.Advance(qs.TTL()) // the first server has no predecessor
	var sw quotaSwitch
	sw.cur.Store(qs)
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, &sw)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	demands := []float64{10, 100, 300}
	envoys := dialEnvoys(t, lis, clock, len(demands))
	bucket := map[string]string{"api": "orders", "tenant": "acme"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	received := func() []int { return handled(envoys) }
	answered := func(seen []int) { settled(t, ctx, nil, envoys, 0, seen) }
	settle := func(n int, seen []int) { settled(t, ctx, reports, envoys, n, seen) }

	const (
		step      = 10 * time.Millisecond
		duration  = 40 * time.Second
		warm      = 5 * time.Second
		restartAt = 20 * time.Second
		window    = 10 * time.Second
	)
	pace := newPacer(demands)
	steps := int(duration / step)
	admitted := make([]int, steps+1) // the fleet's, by step
	seen := received()
	for _, e := range envoys {
		e.Request(bucket)
	}
	settle(len(envoys), seen)
	for k := 1; k <= steps; k++ {
		now := time.Duration(k) * step
		clock.Advance(step)
		pace.step(envoys, bucket, step, func(_ int, ok bool) {
			if ok {
				admitted[k]++
			}
		})
		if now%time.Second != 0 {
			continue
		}
		// After the restart, client i comes back i seconds late: real
		// Envoys report on timers of their own.
		seen := received()
		n := 0
		for i, e := range envoys {
			if now > restartAt && now < restartAt+time.Duration(i+1)*time.Second {
				seen[i]-- // nothing to wait for
				continue
			}
			if err := e.Report(); err != nil {
				t.Fatal(err)
			}
			n++
		}
		settle(n, seen)
		qs.Tick()
		// What the clients enforce, old assignments and new, adds up to no
		// more than the quota once the first division has settled.
		enforced := 0.0
		for i, e := range envoys {
			st := e.Stats()[rlqstest.Key(bucket)]
			if st.Source != rlqstest.Assigned {
				t.Fatalf("%v: client %d enforces %v, want an assignment", now, i, st.Source)
			}
			enforced += st.Rate
		}
		if now > warm && enforced > limit {
			t.Errorf("%v: the clients enforce %.0f/s together, over the quota", now, enforced)
		}
		if now == restartAt {
			// The streams end; the clients keep their assignments and
			// open a stream to the new server on their next report.
			seen := received()
			qs.Close()
			answered(seen)
			qs = start()
			sw.cur.Store(qs)
		}
	}
	per := int(window / step)
	learnt := restartAt + qs.TTL() + 2*time.Second // and two rounds to measure demand
	worst, low, high := 0, math.MaxInt, 0
	for from := int(warm / step); from+per <= steps; from++ {
		n := 0
		for k := from + 1; k <= from+per; k++ {
			n += admitted[k]
		}
		worst = max(worst, n)
		if float64(n) > 1.03*limit*window.Seconds() {
			t.Errorf("the fleet admitted %d in the 10 s from %v, over 103%% of the quota", n, time.Duration(from)*step)
		}
		if time.Duration(from)*step >= learnt {
			low, high = min(low, n), max(high, n)
			if float64(n) < 0.95*limit*window.Seconds() {
				t.Errorf("the fleet admitted %d in the 10 s from %v, after learning, under 95%% of the quota", n, time.Duration(from)*step)
			}
		}
	}
	t.Logf("10 s windows: at most %d; after learning %d–%d (quota %d)", worst, low, high, limit*int(window.Seconds()))
	for i, e := range envoys {
		st := e.Stats()[rlqstest.Key(bucket)]
		t.Logf("client %d: wants %.0f/s, assignment %.1f/s burst %d", i, demands[i], st.Rate, st.Burst)
		if got, want := e.Reconnects(), 1; got != want {
			t.Errorf("client %d: Reconnects() = %d, want %d", i, got, want)
		}
	}
}

// A pacer sends each Envoy's demand, in requests a second, as whole
// requests spread evenly over the steps of a fake clock.
type pacer struct {
	demands, owed []float64
}

func newPacer(demands []float64) *pacer {
	return &pacer{demands: demands, owed: make([]float64, len(demands))}
}

// step sends, for one step of length d, the requests each Envoy owes for
// bucket, and calls done with the Envoy's index and whether it admitted
// each.
func (p *pacer) step(envoys []*rlqstest.Envoy, bucket map[string]string, d time.Duration, done func(i int, ok bool)) {
	for i, e := range envoys {
		p.owed[i] += p.demands[i] * d.Seconds()
		for ; p.owed[i] >= 1; p.owed[i]-- {
			done(i, e.Request(bucket))
		}
	}
}

// dialEnvoys connects n Envoy-faithful clients to the quota server on
// lis, each on a connection of its own, in domain edge, on clock, with a
// report every second.
func dialEnvoys(t *testing.T, lis *bufconn.Listener, clock *fakeClock, n int) []*rlqstest.Envoy {
	t.Helper()
	settings := make([]rlqstest.Settings, n)
	for i := range settings {
		settings[i] = rlqstest.Settings{ReportInterval: time.Second, Now: clock.Now}
	}
	return dialEnvoysWith(t, lis, settings)
}

// dialEnvoysWith is dialEnvoys with each client's settings.
func dialEnvoysWith(t *testing.T, lis *bufconn.Listener, settings []rlqstest.Settings) []*rlqstest.Envoy {
	t.Helper()
	envoys := make([]*rlqstest.Envoy, len(settings))
	for i := range envoys {
		var err error
		if envoys[i], err = rlqstest.NewEnvoy(dialBufconn(t, lis), "edge", settings[i]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { envoys[i].Close() })
	}
	return envoys
}

// handled returns how many of the server's events each client has
// handled.
func handled(envoys []*rlqstest.Envoy) []int {
	seen := make([]int, len(envoys))
	for i, e := range envoys {
		seen[i] = e.Received()
	}
	return seen
}

// TestQuotaServerDownWithEnvoys: with floodgate's server gone (closed, its
// listener refusing every dial), Envoy-faithful clients keep enforcing
// their assignments until the TTL, and no report or request blocks; then
// each follows its configured behaviour: Envoy's default goes back to its
// no-assignment behaviour, ALLOW_ALL, and one configured with an expired
// fallback applies it for its timeout.
func TestQuotaServerDownWithEnvoys(t *testing.T) {
	clock := newFakeClock()
	svc := quotaService(t, clock, quotaConfig)
	qs, err := rls.NewQuotaServer(svc, rls.WithReportInterval(time.Second), rls.WithQuotaClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(qs.TTL())
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	qs.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { qs.Close(); gs.Stop() })

	fallback := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: 5, TokensPerFill: wrapperspb.UInt32(5), FillInterval: durationpb.New(time.Second)}}}
	settings := []rlqstest.Settings{
		{ReportInterval: time.Second, Now: clock.Now}, // Envoy's defaults
		{ReportInterval: time.Second, Now: clock.Now, ExpiredFallback: fallback, ExpiredTimeout: time.Hour},
	}
	bucket := map[string]string{"api": "orders", "tenant": "acme"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	envoys := dialEnvoysWith(t, lis, settings)
	for i := range envoys {
		seen := envoys[i].Received()
		envoys[i].Request(bucket)
		if err := envoys[i].WaitReceived(ctx, seen+1); err != nil {
			t.Fatal(err)
		}
	}
	// Both hold a share of the quota of 100 a second.
	assigned := make([]float64, len(envoys))
	for i, e := range envoys {
		st := e.Stats()[rlqstest.Key(bucket)]
		if st.Source != rlqstest.Assigned || st.Rate <= 0 || st.Rate >= 100 {
			t.Fatalf("client %d before the server goes: %+v, want an assignment under the quota", i, st)
		}
		assigned[i] = st.Rate
	}

	seen := handled(envoys)
	qs.Close()
	for i, e := range envoys {
		if err := e.WaitReceived(ctx, seen[i]+1); err != nil {
			t.Fatalf("client %d: its stream did not end: %v", i, err)
		}
	}
	gs.Stop()
	_ = lis.Close() // every dial fails from now on

	// drive sends 1000 requests a second for d, reporting every second,
	// and returns what each client admitted.
	drive := func(d time.Duration) []int {
		t.Helper()
		got := make([]int, len(envoys))
		for k := time.Duration(0); k < d; k += 10 * time.Millisecond {
			clock.Advance(10 * time.Millisecond)
			for i, e := range envoys {
				for range 10 {
					if e.Request(bucket) {
						got[i]++
					}
				}
			}
			if (k+10*time.Millisecond)%time.Second == 0 {
				for i, e := range envoys {
					start := time.Now()
					if err := e.Report(); err == nil {
						t.Errorf("client %d: a report with the server down succeeded", i)
					}
					if took := time.Since(start); took > 5*time.Second {
						t.Errorf("client %d: a report with the server down took %v", i, took)
					}
				}
			}
		}
		return got
	}
	ttl := qs.TTL()
	got := drive(ttl - 2*time.Second) // within the TTL, counted from the last answer
	for i, e := range envoys {
		st := e.Stats()[rlqstest.Key(bucket)]
		if st.Source != rlqstest.Assigned {
			t.Errorf("client %d within the TTL: source %v, want its assignment", i, st.Source)
		}
		if most := assigned[i]*(ttl-2*time.Second).Seconds() + float64(st.Burst) + 1; float64(got[i]) > most {
			t.Errorf("client %d within the TTL admitted %d of 1000/s, over its assignment of %.1f/s (at most %.0f)", i, got[i], assigned[i], most)
		}
	}
	drive(3 * time.Second) // past the TTL
	got = drive(2 * time.Second)
	if st := envoys[0].Stats()[rlqstest.Key(bucket)]; st.Source != rlqstest.NoAssignment || got[0] != 2000 {
		t.Errorf("Envoy's defaults past the TTL: source %v, admitted %d of 2000, want its no-assignment ALLOW_ALL", st.Source, got[0])
	}
	if st := envoys[1].Stats()[rlqstest.Key(bucket)]; st.Source != rlqstest.Fallback || got[1] > 2*5+5 || got[1] < 2*5 {
		t.Errorf("the client with a fallback past the TTL: source %v, admitted %d in 2 s, want its fallback of 5/s", st.Source, got[1])
	}
}

// quotaService returns a Service of the config text cfg over buckets in
// memory on clock.
func quotaService(t *testing.T, clock *fakeClock, cfg string) *rls.Service {
	t.Helper()
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, mustParse(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// settled waits until the servers took n reports (each a receive on
// reports) and every client handled an event after seen[i], so that the
// clock moves on only once the assignments are in force.
func settled(t *testing.T, ctx context.Context, reports <-chan struct{}, envoys []*rlqstest.Envoy, n int, seen []int) {
	t.Helper()
	for range n {
		select {
		case <-reports:
		case <-ctx.Done():
			t.Fatal("the server took no report")
		}
	}
	for i, e := range envoys {
		if err := e.WaitReceived(ctx, seen[i]+1); err != nil {
			t.Fatalf("client %d: no answer: %v", i, err)
		}
	}
}

// dialBufconn returns a client connection to lis, closed at t's cleanup.
func dialBufconn(t *testing.T, lis *bufconn.Listener) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
