package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/floodgate-go/floodgate/bench/internal/fair"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/rls"
	"github.com/floodgate-go/floodgate/rls/rlqstest"
)

// fakeClock is the one clock of a run: servers, Envoys and the RLS store.
type fakeClock = fakeclock.Clock

// replicas is how many floodgate servers the replicas variant runs.
const replicas = 3

// The quota every variant divides, in floodgate-rls's config: one tenant's
// 1000 a second, shared by every Envoy that sees its traffic.
const (
	limit    = 1000
	confText = `domain: edge
descriptors:
- key: api
  value: orders
  descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000}
`
	// burstSeconds is floodgate's β (rls/quotaoptions.go): an assignment's
	// max_tokens is half a second of its rate. The fake servers use it too,
	// so that only the division differs.
	burstSeconds = 0.5
	step         = 10 * time.Millisecond
	window       = 10 * time.Second
)

var bucket = map[string]string{"api": "orders", "tenant": "acme"}

// Variants.
const (
	vFloodgate = "floodgate"
	vReplicas  = "replicas" // floodgate, three replicas on one Redis
	vStatic    = "static"
	vEven      = "even"
	vRLS       = "rls"
)

// Scenarios.
const (
	sSteady  = "steady"
	sShift   = "shift"
	sRestart = "restart"
	sCrash   = "crash" // the replicas': the first one stops without a last round
)

// zipf returns n demands, in requests a second, ∝ 1/rank^s and summing to
// total; the first is the top.
func zipf(n int, s, total float64) []float64 {
	w := make([]float64, n)
	sum := 0.0
	for i := range w {
		w[i] = 1 / math.Pow(float64(i+1), s)
		sum += w[i]
	}
	for i := range w {
		w[i] *= total / sum
	}
	return w
}

// run is one variant under one scenario at one report interval.
type run struct {
	variant, scenario string
	interval          time.Duration // Envoy's report interval; 0 for rls
	envoys            int
	duration          time.Duration
	eventAt           time.Duration // the shift or the restart
	skew              float64
	demand            float64 // the fleet's, ÷ limit
}

// trace is what a run records, step by step and window by window.
type trace struct {
	admitted []int // the fleet's, by step (index k covers ((k−1)·step, k·step])
	// By window and Envoy.
	envAdmitted [][]int
	envOffered  [][]int
	fair        [][]float64 // max-min fair share, per second
	rpcs        []int       // reports sent and responses received
	offered     []int
}

// simulate drives one run on a fake clock. Every 10 ms each Envoy is
// owed its demand × 10 ms and sends the whole requests it is owed, the
// Envoys taking turns one request at a time. Envoy i reports every
// interval, i/N of an interval after Envoy 0, as real Envoys report on
// timers of their own; the server ticks with Envoy 0. Before the clock
// moves on, every answer and push the server sent has been applied.
func simulate(ctx context.Context, r run) (*trace, error) {
	clock := fakeclock.New(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	cfg, err := rls.ParseConfig("edge.yaml", []byte(confText))
	if err != nil {
		return nil, err
	}
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		return nil, err
	}
	svc, err := rls.New(m, cfg, rls.WithClock(clock))
	if err != nil {
		return nil, err
	}
	demands := zipf(r.envoys, r.skew, r.demand*limit)
	steps := int(r.duration / step)
	nwin := int(r.duration / window)
	tr := &trace{admitted: make([]int, steps+1), rpcs: make([]int, nwin), offered: make([]int, nwin),
		envAdmitted: make([][]int, nwin), envOffered: make([][]int, nwin), fair: make([][]float64, nwin)}
	for w := range nwin {
		tr.envAdmitted[w] = make([]int, r.envoys)
		tr.envOffered[w] = make([]int, r.envoys)
	}

	var decide func(i int) bool
	var h *harness
	if r.variant == vRLS {
		req := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{
			{Key: "api", Value: "orders"}, {Key: "tenant", Value: "acme"}}}}}
		decide = func(int) bool {
			resp, err := svc.ShouldRateLimit(ctx, req)
			return err == nil && resp.GetOverallCode() == pb.RateLimitResponse_OK
		}
	} else {
		if h, err = newHarness(ctx, r, svc, clock); err != nil {
			return nil, err
		}
		defer h.close()
		decide = func(i int) bool { return h.envoys[i].Request(bucket) }
		if err := h.subscribe(); err != nil {
			return nil, err
		}
	}

	owed := make([]float64, r.envoys)
	due := make([]int, r.envoys)
	offset := make([]int, r.envoys) // each Envoy's report phase, in steps
	every := int(r.interval / step)
	rounds := 0 // the replicas' rounds on Redis, in steps, as QuotaServer.Run takes them
	if h != nil && len(h.qss) > 0 {
		rounds = int(h.qss[0].RoundPeriod() / step)
	}
	for i := range offset {
		if every > 0 {
			offset[i] = i * every / r.envoys
		}
	}
	for k := 1; k <= steps; k++ {
		now := time.Duration(k) * step
		w := min(int((now-step)/window), nwin-1)
		if r.scenario == sShift && now-step == r.eventAt {
			last := len(demands) - 1
			demands[0], demands[last] = demands[last], demands[0]
		}
		if tr.fair[w] == nil {
			tr.fair[w] = fair.MaxMin(limit, demands)
		}
		clock.Advance(step)
		for i := range owed {
			owed[i] += demands[i] * step.Seconds()
			due[i] = int(owed[i])
			owed[i] -= float64(due[i])
		}
		// The Envoys take turns, one request at a time, from a first one
		// that rotates step by step, so that the one shared bucket of RLS
		// favours none of them.
		for more := true; more; {
			more = false
			for j := range due {
				i := (j + k) % len(due)
				if due[i] == 0 {
					continue
				}
				due[i]--
				more = true
				tr.envOffered[w][i]++
				tr.offered[w]++
				if decide(i) {
					tr.envAdmitted[w][i]++
					tr.admitted[k]++
				}
			}
		}
		if h == nil {
			continue
		}
		for i := range r.envoys {
			if k%every != offset[i] {
				continue
			}
			if err := h.report(i); err != nil {
				return nil, fmt.Errorf("%v: envoy %d: %w", now, i, err)
			}
			if i == 0 && len(h.qss) > 0 {
				for _, qs := range h.qss {
					qs.Tick()
				}
				if err := h.quiesce(); err != nil {
					return nil, fmt.Errorf("%v: tick: %w", now, err)
				}
			}
		}
		if r.variant == vReplicas && k%rounds == 0 {
			for _, qs := range h.qss {
				qs.Round(ctx)
			}
			if err := h.quiesce(); err != nil {
				return nil, fmt.Errorf("%v: round: %w", now, err)
			}
		}
		if (r.scenario == sRestart || r.scenario == sCrash) && now == r.eventAt {
			if err := h.restart(r.scenario == sCrash); err != nil {
				return nil, fmt.Errorf("%v: restart: %w", now, err)
			}
		}
		if k%int(window/step) == 0 || k == steps {
			tr.rpcs[w] = h.takeRPCs()
		}
	}
	if h == nil {
		copy(tr.rpcs, tr.offered) // RLS: one call a request
	}
	return tr, nil
}

// harness is the RLQS side of a run: a server behind a switch, over
// bufconn (three for the replicas variant, Envoy i on replica i mod 3),
// and N Envoys, each on its own connection.
type harness struct {
	ctx        context.Context
	r          run
	svc        *rls.Service
	clock      *fakeClock
	sws        []*quotaSwitch
	qss        []*rls.QuotaServer // floodgate's; none for a fake
	store      *redisstore.Store  // the replicas' Redis
	closeStore func()
	gss        []*grpc.Server
	conns      []*grpc.ClientConn
	envoys     []*rlqstest.Envoy
	ends       int // streams that ended, each an event an Envoy counts
	rpcs       int // reports sent, since the last takeRPCs
	sent0      int64
}

func newHarness(ctx context.Context, r run, svc *rls.Service, clock *fakeClock) (*harness, error) {
	h := &harness{ctx: ctx, r: r, svc: svc, clock: clock}
	n := 1
	switch r.variant {
	case vFloodgate:
	case vReplicas:
		n = replicas
		st, closeStore, err := replicaStore(clock)
		if err != nil {
			return nil, err
		}
		h.store, h.closeStore = st, closeStore
	case vStatic, vEven:
	default:
		return nil, fmt.Errorf("unknown variant %q", r.variant)
	}
	var lis []*bufconn.Listener
	for range n {
		sw := &quotaSwitch{}
		switch r.variant {
		case vFloodgate, vReplicas:
			qs, err := h.newQuotaServer()
			if err != nil {
				h.close()
				return nil, err
			}
			h.qss = append(h.qss, qs)
			sw.set(qs)
		case vStatic:
			sw.set(&fixedServer{rate: limit, ttl: ttlFor(r.interval)})
		case vEven:
			sw.set(&fixedServer{rate: limit / r.envoys, ttl: ttlFor(r.interval)})
		}
		l := bufconn.Listen(1 << 20)
		gs := grpc.NewServer()
		rlqspb.RegisterRateLimitQuotaServiceServer(gs, sw)
		go func() { _ = gs.Serve(l) }()
		h.sws, h.gss, lis = append(h.sws, sw), append(h.gss, gs), append(lis, l)
	}
	if r.variant == vFloodgate {
		clock.Advance(h.qss[0].TTL()) // past the learning window: no earlier instance
	}
	// Envoy's filter as docs/rlqs.md configures it: allow all before the
	// first assignment, 50 a second for an hour once one lapses.
	fallback := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: 50, TokensPerFill: wrapperspb.UInt32(50), FillInterval: durationpb.New(time.Second)}}}
	for i := range r.envoys {
		l := lis[i%len(lis)]
		conn, err := grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			h.close()
			return nil, err
		}
		h.conns = append(h.conns, conn)
		e, err := rlqstest.NewEnvoy(conn, "edge", rlqstest.Settings{ReportInterval: r.interval,
			ExpiredFallback: fallback, ExpiredTimeout: time.Hour, Now: clock.Now})
		if err != nil {
			h.close()
			return nil, err
		}
		h.envoys = append(h.envoys, e)
	}
	return h, nil
}

func (h *harness) newQuotaServer() (*rls.QuotaServer, error) {
	opts := []rls.QuotaOption{rls.WithReportInterval(h.r.interval), rls.WithQuotaClock(h.clock)}
	if h.store != nil {
		opts = append(opts, rls.WithQuotaStore(h.store))
	}
	return rls.NewQuotaServer(h.svc, opts...)
}

// ttlFor is floodgate's default TTL, 2I + 2 s in whole seconds, which the
// fake servers use too.
func ttlFor(interval time.Duration) time.Duration {
	return (2*interval + 2*time.Second + time.Second - 1).Truncate(time.Second)
}

func (h *harness) close() {
	for _, e := range h.envoys {
		e.Close()
	}
	for _, c := range h.conns {
		c.Close()
	}
	for _, qs := range h.qss {
		qs.Close()
	}
	for _, gs := range h.gss {
		gs.Stop()
	}
	if h.closeStore != nil {
		h.closeStore()
	}
}

// subscribe sends each Envoy's first request, which subscribes its bucket
// with a one-bucket report; the Envoys subscribe one after another.
func (h *harness) subscribe() error {
	for i, e := range h.envoys {
		seen := e.Received()
		e.Request(bucket)
		h.rpcs++
		if err := e.WaitReceived(h.ctx, seen+1); err != nil {
			return fmt.Errorf("envoy %d: no answer to its subscription: %w", i, err)
		}
		if err := h.quiesce(); err != nil {
			return err
		}
	}
	return nil
}

// report sends Envoy i's periodic report and waits until its answer, and
// every push the report caused, has been applied.
func (h *harness) report(i int) error {
	e := h.envoys[i]
	seen := e.Received()
	if err := e.Report(); err != nil {
		return err
	}
	h.rpcs++
	if err := e.WaitReceived(h.ctx, seen+1); err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	return h.quiesce()
}

// quietFor is how long, in real time, the counts of responses sent and
// applied must stay equal before the run goes on. The server pushes a
// changed share to other streams from its own goroutines, in a number the
// harness cannot know in advance; in process they arrive in microseconds.
const quietFor = 500 * time.Microsecond

// quiesce waits until every response the server sent has been applied by
// its Envoy, and nothing more is sent for quietFor.
func (h *harness) quiesce() error {
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	var since time.Time
	last := int64(-1)
	for {
		sent := h.sent()
		got := int64(-h.ends)
		for _, e := range h.envoys {
			got += int64(e.Received())
		}
		switch {
		case sent != got || sent != last:
			since, last = time.Now(), sent
		case time.Since(since) >= quietFor:
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("responses sent %d, applied %d: %w", sent, got, ctx.Err())
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// restart closes floodgate's server (the first replica's) and puts a new
// one behind its switch, as TestQuotaRestartWithEnvoys does: every stream
// of it ends with UNAVAILABLE, and each of its Envoys keeps its assignment
// and opens a stream to the new server on its next report. With crash,
// the server is not closed: its streams are cut, and it is called no more,
// so that it takes no last round on Redis.
func (h *harness) restart(crash bool) error {
	if len(h.qss) == 0 {
		return errors.New("a restart is floodgate's alone")
	}
	seen := make([]int, len(h.envoys))
	for i, e := range h.envoys {
		seen[i] = e.Received()
	}
	if crash {
		h.sws[0].cut()
	} else {
		h.qss[0].Close()
	}
	for i, e := range h.envoys {
		if i%len(h.qss) != 0 {
			continue
		}
		if err := e.WaitReceived(h.ctx, seen[i]+1); err != nil {
			return fmt.Errorf("envoy %d: its stream did not end: %w", i, err)
		}
		h.ends++
	}
	qs, err := h.newQuotaServer()
	if err != nil {
		return err
	}
	h.qss[0] = qs
	h.sws[0].set(qs)
	return h.quiesce()
}

// sent returns the responses every server has sent.
func (h *harness) sent() int64 {
	var n int64
	for _, sw := range h.sws {
		n += sw.sent.Load()
	}
	return n
}

// takeRPCs returns the reports sent and the responses received since its
// last call.
func (h *harness) takeRPCs() int {
	sent := h.sent()
	n := h.rpcs + int(sent-h.sent0)
	h.rpcs, h.sent0 = 0, sent
	return n
}

// quotaSwitch serves RLQS with whichever server is current, so that a run
// can restart it while the Envoys' connections stay up, and counts the
// responses sent.
type quotaSwitch struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	cur  atomic.Pointer[current]
	sent atomic.Int64

	mu      sync.Mutex
	cancels []context.CancelFunc // the streams', for cut
}

type current struct {
	rlqspb.RateLimitQuotaServiceServer
}

func (w *quotaSwitch) set(s rlqspb.RateLimitQuotaServiceServer) { w.cur.Store(&current{s}) }

func (w *quotaSwitch) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	w.mu.Lock()
	w.cancels = append(w.cancels, cancel)
	w.mu.Unlock()
	return w.cur.Load().StreamRateLimitQuotas(&countingStream{st, ctx, &w.sent})
}

// cut ends every stream served so far, as a crash of their server would.
func (w *quotaSwitch) cut() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancels {
		c()
	}
	w.cancels = nil
}

type countingStream struct {
	rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer
	ctx  context.Context
	sent *atomic.Int64
}

func (s *countingStream) Context() context.Context { return s.ctx }

func (s *countingStream) Send(r *rlqspb.RateLimitQuotaResponse) error {
	err := s.RateLimitQuotaService_StreamRateLimitQuotasServer.Send(r)
	if err == nil {
		s.sent.Add(1)
	}
	return err
}

// fixedServer answers every bucket of every report with the same token
// bucket, rate a second with floodgate's burst, whatever the demand: with
// the whole limit it is jukie/rlqs's static strategy, with limit/N an even
// split.
type fixedServer struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	rate int
	ttl  time.Duration
}

func (f *fixedServer) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	strat := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(max(1, math.Ceil(float64(f.rate)*burstSeconds))),
		TokensPerFill: wrapperspb.UInt32(uint32(f.rate)),
		FillInterval:  durationpb.New(time.Second)}}}
	for {
		rep, err := st.Recv()
		if err != nil {
			return nil
		}
		resp := &rlqspb.RateLimitQuotaResponse{}
		for _, u := range rep.GetBucketQuotaUsages() {
			resp.BucketAction = append(resp.BucketAction, &rlqspb.RateLimitQuotaResponse_BucketAction{
				BucketId: u.GetBucketId(),
				BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
					QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
						AssignmentTimeToLive: durationpb.New(f.ttl), RateLimitStrategy: strat}}})
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}
