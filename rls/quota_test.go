package rls_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/floodgate-go/floodgate/rls/rlqstest"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/optiontest"
	"github.com/floodgate-go/floodgate/rls"
	"github.com/floodgate-go/floodgate/rls/internal/share"
)

const quotaConfig = `
domain: edge
descriptors:
- key: api
  value: orders
  descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
- key: path
  value: "/v1/*"
  rate_limit: {unit: second, requests_per_unit: 50}
- key: shadow
  shadow_mode: true
  rate_limit: {unit: second, requests_per_unit: 5}
- key: open
  rate_limit: {unlimited: true}
`

// quotaEnv is a QuotaServer over bufconn, on a fake clock, with a 1 s
// report interval (so a 4 s TTL), past its learning window unless
// newLearningQuotaEnv made it.
type quotaEnv struct {
	svc       *rls.Service
	qs        *rls.QuotaServer
	client    rlqspb.RateLimitQuotaServiceClient
	clock     *fakeClock
	processed chan struct{}
}

func newQuotaEnv(t *testing.T, cfg string, opts ...rls.QuotaOption) *quotaEnv {
	t.Helper()
	e := newLearningQuotaEnv(t, cfg, opts...)
	e.clock.Advance(e.qs.TTL())
	return e
}

// newLearningQuotaEnv is newQuotaEnv at the server's start.
func newLearningQuotaEnv(t *testing.T, cfg string, opts ...rls.QuotaOption) *quotaEnv {
	t.Helper()
	clock := newFakeClock()
	svc := quotaService(t, clock, cfg)
	qs, err := rls.NewQuotaServer(svc, append([]rls.QuotaOption{rls.WithReportInterval(time.Second), rls.WithQuotaClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e := &quotaEnv{svc: svc, qs: qs, clock: clock, processed: make(chan struct{}, 1024)}
	rls.SetQuotaReportHook(qs, func() { e.processed <- struct{}{} })
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	qs.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { qs.Close(); gs.Stop() })
	e.client = rlqspb.NewRateLimitQuotaServiceClient(dialBufconn(t, lis))
	return e
}

// quotaClient is a raw RLQS stream: it keeps the last action per bucket
// and checks every TTL it receives.
type quotaClient struct {
	t      *testing.T
	e      *quotaEnv
	domain string
	stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc

	mu      sync.Mutex
	latest  map[string]*rlqspb.RateLimitQuotaResponse_BucketAction
	badTTL  []*durationpb.Duration
	err     error
	updates chan struct{}
	done    chan struct{}
}

func (e *quotaEnv) open(t *testing.T, domain string) *quotaClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.client.StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &quotaClient{t: t, e: e, domain: domain, stream: stream, cancel: cancel,
		latest:  map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{},
		updates: make(chan struct{}, 1), done: make(chan struct{})}
	go c.recv()
	t.Cleanup(func() {
		cancel()
		<-c.done
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.badTTL) > 0 {
			t.Errorf("assignment TTLs not whole seconds ≥ 1s: %v", c.badTTL)
		}
	})
	return c
}

func (c *quotaClient) recv() {
	defer close(c.done)
	for {
		resp, err := c.stream.Recv()
		c.mu.Lock()
		if err != nil {
			c.err = err
			c.mu.Unlock()
			return
		}
		for _, a := range resp.GetBucketAction() {
			c.latest[idName(a.GetBucketId().GetBucket())] = a
			if qa := a.GetQuotaAssignmentAction(); qa != nil {
				if ttl := qa.GetAssignmentTimeToLive(); ttl.GetSeconds() < 1 || ttl.GetNanos() != 0 {
					c.badTTL = append(c.badTTL, ttl)
				}
			}
		}
		c.mu.Unlock()
		select {
		case c.updates <- struct{}{}:
		default:
		}
	}
}

// idName names a BucketId, as the test client does.
func idName(id map[string]string) string { return rlqstest.Key(id) }

// usage is one bucket's line of a report.
type usage struct {
	id      map[string]string
	allowed uint64
	elapsed time.Duration
}

// report sends one report and waits until the server has taken it.
func (c *quotaClient) report(us ...usage) {
	c.t.Helper()
	rep := &rlqspb.RateLimitQuotaUsageReports{Domain: c.domain}
	for _, u := range us {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: u.id}, TimeElapsed: durationpb.New(u.elapsed),
			NumRequestsAllowed: u.allowed})
	}
	c.send(rep)
}

// send sends rep as it is and waits until the server has taken it.
func (c *quotaClient) send(rep *rlqspb.RateLimitQuotaUsageReports) {
	c.t.Helper()
	if err := c.stream.Send(rep); err != nil {
		c.t.Fatalf("Send: %v", err)
	}
	select {
	case <-c.e.processed:
	case <-time.After(10 * time.Second):
		c.t.Fatal("report not taken within 10s")
	}
}

// await waits until the last action for id satisfies ok, and returns it.
func (c *quotaClient) await(id map[string]string, what string, ok func(*rlqspb.RateLimitQuotaResponse_BucketAction) bool) *rlqspb.RateLimitQuotaResponse_BucketAction {
	c.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		a := c.latest[idName(id)]
		err := c.err
		c.mu.Unlock()
		if a != nil && ok(a) {
			return a
		}
		if err != nil {
			c.t.Fatalf("%v: stream ended (%v) before %s; last action %v", id, err, what, a)
		}
		select {
		case <-c.updates:
		case <-timeout:
			c.t.Fatalf("%v: no %s within 10s; last action %v", id, what, a)
		}
	}
}

func tokens(a *rlqspb.RateLimitQuotaResponse_BucketAction) (perFill uint32, fill time.Duration, ok bool) {
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		return 0, 0, false
	}
	return tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration(), true
}

func blanket(a *rlqspb.RateLimitQuotaResponse_BucketAction) (typev3.RateLimitStrategy_BlanketRule, bool) {
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	if s == nil {
		return 0, false
	}
	if _, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); !ok {
		return 0, false
	}
	return s.GetBlanketRule(), true
}

func anyAction(*rlqspb.RateLimitQuotaResponse_BucketAction) bool { return true }

func TestQuotaFirstReportAndMatching(t *testing.T) {
	e := newQuotaEnv(t, quotaConfig)
	for _, tc := range []struct {
		name, domain string
		id           map[string]string
		limited      bool
	}{
		{"exact then key", "edge", map[string]string{"api": "orders", "tenant": "t1"}, true},
		{"wildcard", "edge", map[string]string{"path": "/v1/users"}, true},
		{"wildcard no match", "edge", map[string]string{"path": "/v2/users"}, false},
		{"path without a rule", "edge", map[string]string{"api": "orders"}, false},
		{"extra key", "edge", map[string]string{"api": "orders", "tenant": "t1", "x": "y"}, false},
		{"wrong value", "edge", map[string]string{"api": "users", "tenant": "t1"}, false},
		{"shadow mode", "edge", map[string]string{"shadow": "s"}, false},
		{"unlimited", "edge", map[string]string{"open": "o"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.open(t, tc.domain)
			c.report(usage{id: tc.id, allowed: 1})
			a := c.await(tc.id, "an assignment", anyAction)
			if diff := cmp.Diff(tc.id, a.GetBucketId().GetBucket()); diff != "" {
				t.Errorf("echoed BucketId (-want +got):\n%s", diff)
			}
			if got, want := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(), 4*time.Second; got != want {
				t.Errorf("TTL = %v, want %v", got, want)
			}
			if tc.limited {
				n, fill, ok := tokens(a)
				if !ok || n < 1 || fill != time.Second {
					t.Errorf("first assignment = %v, want a token bucket of ≥ 1 token per 1s", a)
				}
				return
			}
			if r, ok := blanket(a); !ok || r != typev3.RateLimitStrategy_ALLOW_ALL {
				t.Errorf("assignment = %v, want ALLOW_ALL", a)
			}
			// Refreshed on the next report.
			e.clock.Advance(time.Second)
			c.report(usage{id: tc.id, allowed: 1, elapsed: time.Second})
		})
	}
}

var orders = map[string]string{"api": "orders", "tenant": "t1"}

// round advances the clock a second and has each client report its
// demand for orders.
func round(e *quotaEnv, cs []*quotaClient, demand []uint64) {
	e.clock.Advance(time.Second)
	for i, c := range cs {
		c.report(usage{id: orders, allowed: demand[i], elapsed: time.Second})
	}
}

func TestQuotaDivision(t *testing.T) {
	e := newQuotaEnv(t, quotaConfig)
	a, b := e.open(t, "edge"), e.open(t, "edge")
	a.report(usage{id: orders, allowed: 1})
	b.report(usage{id: orders, allowed: 1})
	for range 5 {
		round(e, []*quotaClient{a, b}, []uint64{10, 100})
	}
	const capacity = 99 // 100 less the 1% reserve
	var got [2]uint32
	a.await(orders, "≈ 11 tokens", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		got[0], _, _ = tokens(x)
		return got[0] >= 10 && got[0] <= 12
	})
	b.await(orders, "the rest", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		got[1], _, _ = tokens(x)
		return got[1] >= 84 && got[1]+got[0] <= capacity
	})

	// A third subscriber gets a newcomer's share in its first answer.
	c := e.open(t, "edge")
	c.report(usage{id: orders, allowed: 1})
	want := uint32(max(1, math.Floor(share.Newcomer(100, capacity, 0.02, 2))))
	c.await(orders, "a newcomer's share", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		n, fill, ok := tokens(x)
		return ok && n == want && fill == time.Second
	})
}

func TestQuotaLeaving(t *testing.T) {
	for _, how := range []string{"stops reporting", "stream ends"} {
		t.Run(how, func(t *testing.T) {
			e := newQuotaEnv(t, quotaConfig)
			a, b := e.open(t, "edge"), e.open(t, "edge")
			a.report(usage{id: orders, allowed: 1})
			b.report(usage{id: orders, allowed: 1})
			for range 4 {
				round(e, []*quotaClient{a, b}, []uint64{100, 100})
			}
			half := func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
				n, _, _ := tokens(x)
				return n >= 47 && n <= 50
			}
			a.await(orders, "half", half)
			b.await(orders, "half", half)
			if how == "stream ends" {
				if err := b.stream.CloseSend(); err != nil {
					t.Fatal(err)
				}
			}
			// For T = 4 s after its last assignment, b's share is held.
			for range 3 {
				e.clock.Advance(time.Second)
				e.qs.Tick()
				a.report(usage{id: orders, allowed: 100, elapsed: time.Second})
				a.await(orders, "half while b's lease runs", half)
			}
			e.clock.Advance(time.Second)
			e.qs.Tick()
			a.report(usage{id: orders, allowed: 100, elapsed: time.Second})
			a.await(orders, "all of it once b's lease lapsed", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
				n, _, _ := tokens(x)
				return n == 99
			})
		})
	}
}

func TestQuotaReload(t *testing.T) {
	e := newQuotaEnv(t, quotaConfig)
	a := e.open(t, "edge")
	a.report(usage{id: orders, allowed: 1})
	for range 3 {
		round(e, []*quotaClient{a}, []uint64{200})
	}
	a.await(orders, "99 tokens", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		n, _, _ := tokens(x)
		return n == 99
	})
	e.svc.SetConfig(mustParse(t, `
domain: edge
descriptors:
- key: api
  value: orders
  descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 50}
`))
	e.qs.Tick() // pushed at once, without a report
	a.await(orders, "49 tokens under the new limit", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		n, _, _ := tokens(x)
		return n == 49 || n == 50 // 50 less the 1% reserve, in whole tokens
	})
	// A limit removed: ALLOW_ALL.
	e.svc.SetConfig(mustParse(t, "domain: edge\n"))
	e.qs.Tick()
	a.await(orders, "ALLOW_ALL", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		r, ok := blanket(x)
		return ok && r == typev3.RateLimitStrategy_ALLOW_ALL
	})
}

func TestQuotaShutdown(t *testing.T) {
	e := newQuotaEnv(t, quotaConfig)
	a := e.open(t, "edge")
	a.report(usage{id: orders, allowed: 1})
	a.await(orders, "an assignment", anyAction)
	e.qs.Close()
	e.qs.Close() // idempotent
	<-a.done
	if got := status.Code(a.err); got != codes.Unavailable {
		t.Errorf("stream ended with %v, want Unavailable", a.err)
	}
	// A stream opened after Close is refused the same way.
	b := e.open(t, "edge")
	<-b.done
	if got := status.Code(b.err); got != codes.Unavailable {
		t.Errorf("new stream ended with %v, want Unavailable", b.err)
	}
}

func TestQuotaOptions(t *testing.T) {
	svc := quotaService(t, newFakeClock(), quotaConfig)
	for _, tc := range []struct {
		name string
		opt  rls.QuotaOption
	}{
		{"interval 0", rls.WithReportInterval(0)},
		{"ttl 0.5s", rls.WithAssignmentTTL(500 * time.Millisecond)},
		{"ttl 1.5s", rls.WithAssignmentTTL(1500 * time.Millisecond)},
		{"max buckets 0", rls.WithMaxBucketsPerStream(0)},
		{"idle below ttl", rls.WithIdleAbandon(time.Second)},
	} {
		if _, err := rls.NewQuotaServer(svc, tc.opt); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("%s: NewQuotaServer error = %v, want ErrInvalidOption", tc.name, err)
		}
	}
	for _, tc := range []struct {
		opts []rls.QuotaOption
		want time.Duration
	}{
		{nil, 12 * time.Second},
		{[]rls.QuotaOption{rls.WithReportInterval(time.Second)}, 4 * time.Second},
		{[]rls.QuotaOption{rls.WithReportInterval(1500 * time.Millisecond)}, 5 * time.Second},
		{[]rls.QuotaOption{rls.WithAssignmentTTL(7 * time.Second)}, 7 * time.Second},
	} {
		qs, err := rls.NewQuotaServer(svc, tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := qs.TTL(); got != tc.want {
			t.Errorf("TTL() = %v, want %v", got, tc.want)
		}
	}
}

// TestQuotaOptionConvention checks the option convention of
// floodgate.ErrInvalidOption on NewQuotaServer.
func TestQuotaOptionConvention(t *testing.T) {
	svc := quotaService(t, newFakeClock(), quotaConfig)
	optiontest.Check(t, func(opts ...rls.QuotaOption) error {
		_, err := rls.NewQuotaServer(svc, opts...)
		return err
	}, []optiontest.Case[rls.QuotaOption]{
		{Option: "WithReportInterval", Bad: rls.WithReportInterval(-time.Second), Good: rls.WithReportInterval(time.Second)},
		{Option: "WithAssignmentTTL", Bad: rls.WithAssignmentTTL(1500 * time.Millisecond), Good: rls.WithAssignmentTTL(20 * time.Second)},
		{Option: "WithMaxBucketsPerStream", Bad: rls.WithMaxBucketsPerStream(0), Good: rls.WithMaxBucketsPerStream(5)},
	})
}

var syncID = map[string]string{"open": "sync"}

// sync reports an ALLOW_ALL bucket and waits for its answer: every action
// the server queued on the stream before it has then been received.
func (c *quotaClient) sync() {
	c.t.Helper()
	c.mu.Lock()
	before := c.latest[idName(syncID)]
	c.mu.Unlock()
	c.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: syncID}, TimeElapsed: &durationpb.Duration{}}}})
	c.await(syncID, "the sync answer", func(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool { return a != before })
}

// actions returns the last action for each bucket the client received,
// the sync bucket left out.
func (c *quotaClient) actions() map[string]*rlqspb.RateLimitQuotaResponse_BucketAction {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{}
	for k, a := range c.latest {
		if k != idName(syncID) {
			out[k] = a
		}
	}
	return out
}

func isTokenBucket(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
	_, _, ok := tokens(a)
	return ok
}

func line(id map[string]string, allowed, denied uint64, elapsed *durationpb.Duration) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{TimeElapsed: elapsed, NumRequestsAllowed: allowed, NumRequestsDenied: denied}
	if id != nil {
		u.BucketId = &rlqspb.BucketId{Bucket: id}
	}
	return u
}

// TestQuotaInvalidReports sends reports no Envoy sends: each ends its stream
// with InvalidArgument naming the field, and none of it is taken. The
// stream's buckets keep their shares held as any ended stream's, and other
// streams go on.
func TestQuotaInvalidReports(t *testing.T) {
	t2 := map[string]string{"api": "orders", "tenant": "t2"}
	sec := durationpb.New(time.Second)
	for _, tc := range []struct {
		name  string
		bad   *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
		field string
	}{
		{"nil bucket_id", line(nil, 1, 0, sec), "bucket_quota_usages[1].bucket_id: missing"},
		{"negative time_elapsed", line(t2, 1, 0, &durationpb.Duration{Seconds: -5}), "bucket_quota_usages[1].time_elapsed: negative"},
		{"invalid time_elapsed", line(t2, 1, 0, &durationpb.Duration{Seconds: 1, Nanos: -1}), "bucket_quota_usages[1].time_elapsed"},
		{"allowed 2^63", line(t2, 1<<63, 0, durationpb.New(5*time.Second)), "bucket_quota_usages[1].num_requests_allowed"},
		{"denied over 1e9/s", line(t2, 0, 3e9, sec), "bucket_quota_usages[1].num_requests_denied"},
		{"sum over 1e9/s", line(t2, 1.6e9, 1.6e9, durationpb.New(2*time.Second)), "bucket_quota_usages[1].num_requests_allowed+num_requests_denied"},
		{"over 1e9/s in 0 s", line(t2, 2e9, 0, nil), "bucket_quota_usages[1].num_requests_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newQuotaEnv(t, quotaConfig)
			good, bad := e.open(t, "edge"), e.open(t, "edge")
			good.report(usage{id: orders, allowed: 1})
			bad.report(usage{id: orders, allowed: 1}, usage{id: t2, allowed: 1})
			bad.sync()
			before := bad.actions()
			for _, a := range before {
				if !isTokenBucket(a) {
					t.Fatalf("before the bad report: %v, want token buckets", a)
				}
			}
			e.clock.Advance(time.Second)
			bad.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge",
				BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{line(orders, 50, 0, sec), tc.bad}})
			<-bad.done
			if got := status.Code(bad.err); got != codes.InvalidArgument {
				t.Fatalf("stream ended with %v, want InvalidArgument", bad.err)
			}
			if msg := status.Convert(bad.err).Message(); !strings.Contains(msg, tc.field) || !strings.HasPrefix(msg, "rls: ") {
				t.Errorf("error message %q, want one starting with %q and naming %q", msg, "rls: ", tc.field)
			}
			if diff := cmp.Diff(before, bad.actions(), cmp.Comparer(func(a, b *rlqspb.RateLimitQuotaResponse_BucketAction) bool { return a == b })); diff != "" {
				t.Errorf("actions after the bad report (-before +after):\n%s", diff)
			}
			// The other stream is answered, its share counted beside the
			// bad stream's, held until it lapses.
			good.report(usage{id: orders, allowed: 100, elapsed: time.Second})
			good.sync()
			n, _, ok := tokens(good.actions()[idName(orders)])
			held, _, _ := tokens(before[idName(orders)])
			if !ok || n+held > 99 {
				t.Errorf("the other stream holds %d tokens beside the %d held for the ended one, want a token bucket, together ≤ 99", n, held)
			}
		})
	}
}

// TestQuotaIgnoredReports sends report lines that an Envoy may send but that
// name nothing to divide: each is left unanswered and counted, and the
// report's other lines and other streams are answered as usual.
func TestQuotaIgnoredReports(t *testing.T) {
	t2 := map[string]string{"api": "orders", "tenant": "t2"}
	e := newQuotaEnv(t, quotaConfig, rls.WithMaxBucketsPerStream(3)) // syncID, orders and t2
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.qs.Collectors()...)
	ignored := func(reason string) float64 {
		return gather(t, reg)["floodgate_rls_quota_reports_ignored_total{reason="+reason+"}"]
	}
	other := e.open(t, "edge")
	other.report(usage{id: orders, allowed: 1})

	c := e.open(t, "edge")
	c.sync()
	lines := []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		line(orders, 1, 0, nil), line(map[string]string{}, 5, 0, nil), line(t2, 1, 0, nil)}
	for i := range 2000 {
		lines = append(lines, line(map[string]string{"api": "orders", "tenant": fmt.Sprint("x", i)}, 1, 0, nil))
	}
	c.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: lines})
	// A domain the config does not have: orders there would be a bucket
	// of its own, and is not answered.
	c.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "nowhere", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		line(map[string]string{"api": "orders", "tenant": "nowhere"}, 1, 0, nil)}})
	c.sync()
	got := c.actions()
	if len(got) != 2 || !isTokenBucket(got[idName(orders)]) || !isTokenBucket(got[idName(t2)]) {
		t.Errorf("actions = %v, want token buckets for orders and t2 only", got)
	}
	for _, tc := range []struct {
		reason string
		want   float64
	}{{"empty_bucket_id", 1}, {"too_many_buckets", 2000}, {"unknown_domain", 1}} {
		if got := ignored(tc.reason); got != tc.want {
			t.Errorf("ignored{reason=%s} = %v, want %v", tc.reason, got, tc.want)
		}
	}
	// Reported again, the buckets past the bound are not answered either,
	// so Envoy does not resubscribe them.
	e.clock.Advance(time.Second)
	c.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: lines})
	c.sync()
	if got, want := ignored("too_many_buckets"), 4000.0; got != want {
		t.Errorf("ignored{reason=too_many_buckets} = %v after a second report, want %v", got, want)
	}
	if got := len(c.actions()); got != 2 {
		t.Errorf("%d buckets answered after a second report, want 2", got)
	}
	other.report(usage{id: orders, allowed: 1, elapsed: time.Second})
	other.sync()
	if a := other.actions()[idName(orders)]; !isTokenBucket(a) {
		t.Errorf("the other stream's orders: %v, want a token bucket", a)
	}
}

// TestQuotaLearning starts a server as Envoys of a previous instance come
// back: for one TTL, a returning subscriber gets back the rate it showed it
// held, within the capacity, a newcomer a newcomer's share, and what no one
// has shown stays held; then the whole limit is divided again.
func TestQuotaLearning(t *testing.T) {
	e := newLearningQuotaEnv(t, quotaConfig)
	t2 := map[string]string{"api": "orders", "tenant": "t2"}
	a, b, c := e.open(t, "edge"), e.open(t, "edge"), e.open(t, "edge")
	// Returning: a first report on the stream covering a second or more.
	a.report(usage{id: orders, allowed: 30, elapsed: time.Second}, usage{id: t2, allowed: 90, elapsed: time.Second})
	b.report(usage{id: t2, allowed: 180, elapsed: 2 * time.Second})
	c.report(usage{id: orders, allowed: 1})
	for _, tc := range []struct {
		c    *quotaClient
		id   map[string]string
		want uint32
	}{{a, orders, 30}, {a, t2, 90}, {b, t2, 99 - 90}, {c, orders, 1}} {
		tc.c.sync()
		if n, _, _ := tokens(tc.c.actions()[idName(tc.id)]); n != tc.want {
			t.Errorf("first assignment for %v: %d tokens, want %d", tc.id, n, tc.want)
		}
	}
	// What no one showed of orders' limit, 67 a second, stays held while
	// a and c want 100 a second each.
	ttl := e.qs.TTL()
	for el := time.Second; el < ttl; el += time.Second {
		e.clock.Advance(time.Second)
		e.qs.Tick()
		a.report(usage{id: orders, allowed: 100, elapsed: time.Second})
		c.report(usage{id: orders, allowed: 100, elapsed: time.Second})
		a.sync()
		c.sync()
		na, _, _ := tokens(a.actions()[idName(orders)])
		nc, _, _ := tokens(c.actions()[idName(orders)])
		if na+nc > 31 {
			t.Errorf("%v after start: a holds %d, c %d, over the 31 they held", el, na, nc)
		}
	}
	// One TTL after start: the whole capacity.
	for range 3 {
		e.clock.Advance(time.Second)
		e.qs.Tick()
		a.report(usage{id: orders, allowed: 100, elapsed: time.Second})
		c.report(usage{id: orders, allowed: 100, elapsed: time.Second})
	}
	a.sync()
	c.sync()
	na, _, _ := tokens(a.actions()[idName(orders)])
	nc, _, _ := tokens(c.actions()[idName(orders)])
	if na+nc < 95 || na+nc > 99 {
		t.Errorf("after learning: a holds %d, c %d, want together 95–99", na, nc)
	}
}
