package rls_test

import (
	"context"
	"errors"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/optiontest"
	"github.com/floodgate-go/floodgate/keyed"
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
// report interval (so a 4 s TTL).
type quotaEnv struct {
	svc       *rls.Service
	qs        *rls.QuotaServer
	client    rlqspb.RateLimitQuotaServiceClient
	clock     *fakeClock
	processed chan struct{}
}

func newQuotaEnv(t *testing.T, cfg string, opts ...rls.QuotaOption) *quotaEnv {
	t.Helper()
	clock := newFakeClock()
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, mustParse(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
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
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.client = rlqspb.NewRateLimitQuotaServiceClient(conn)
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

// idName names a BucketId: its keys sorted.
func idName(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + id[k] + ";")
	}
	return b.String()
}

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
		{"unknown domain", "nowhere", map[string]string{"api": "orders", "tenant": "t1"}, false},
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
	const capacity = 98 // 100 less the 2% reserve
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
				return n == 98
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
	a.await(orders, "98 tokens", func(x *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		n, _, _ := tokens(x)
		return n == 98
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
		return n == 49
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
	m, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, nil)
	if err != nil {
		t.Fatal(err)
	}
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
	m, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	optiontest.Check(t, func(opts ...rls.QuotaOption) error {
		_, err := rls.NewQuotaServer(svc, opts...)
		return err
	}, []optiontest.Case[rls.QuotaOption]{
		{Option: "WithReportInterval", Bad: rls.WithReportInterval(-time.Second), Good: rls.WithReportInterval(time.Second)},
		{Option: "WithAssignmentTTL", Bad: rls.WithAssignmentTTL(1500 * time.Millisecond), Good: rls.WithAssignmentTTL(20 * time.Second)},
		{Option: "WithMaxBucketsPerStream", Bad: rls.WithMaxBucketsPerStream(0), Good: rls.WithMaxBucketsPerStream(5)},
	})
}

func TestQuotaMaxBucketsPerStream(t *testing.T) {
	e := newQuotaEnv(t, quotaConfig, rls.WithMaxBucketsPerStream(1))
	c := e.open(t, "edge")
	other := map[string]string{"api": "orders", "tenant": "t2"}
	c.report(usage{id: orders, allowed: 1}, usage{id: other, allowed: 1})
	c.await(orders, "an assignment", func(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		_, _, ok := tokens(a)
		return ok
	})
	c.await(other, "an abandon action", func(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
		return a.GetAbandonAction() != nil
	})
}
