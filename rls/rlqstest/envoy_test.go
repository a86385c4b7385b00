package rlqstest_test

import (
	"context"
	"errors"
	"math"
	"net"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/rls/rlqstest"
)

// fakeClock is the tests' controlled clock.
type fakeClock = fakeclock.Clock

// wait bounds every wait on the fake server or the client; it is a deadline
// for a hung test, not a pause.
const wait = 5 * time.Second

// fakeServer is an RLQS server scripted by the test: each stream is handed to
// the test, which reads its reports and tells it what to send or when to end.
type fakeServer struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	streams chan *fakeStream
}

type fakeStream struct {
	reports chan *rlqspb.RateLimitQuotaUsageReports
	send    chan *rlqspb.RateLimitQuotaResponse
	end     chan error
}

func (s *fakeServer) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	fs := &fakeStream{
		reports: make(chan *rlqspb.RateLimitQuotaUsageReports, 1000),
		send:    make(chan *rlqspb.RateLimitQuotaResponse),
		end:     make(chan error),
	}
	s.streams <- fs
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			fs.reports <- r
		}
	}()
	for {
		select {
		case r := <-fs.send:
			if err := st.Send(r); err != nil {
				return err
			}
		case err := <-fs.end:
			return err
		case <-st.Context().Done():
			return st.Context().Err()
		}
	}
}

type harness struct {
	t      *testing.T
	clock  *fakeClock
	srv    *fakeServer
	env    *rlqstest.Envoy
	events int // stream events the client must have handled
}

func newHarness(t *testing.T, s rlqstest.Settings) *harness {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := &fakeServer{streams: make(chan *fakeStream, 16)}
	gs := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	clock := fakeclock.New(time.Unix(1_800_000_000, 0))
	s.Now = clock.Now
	env, err := rlqstest.NewEnvoy(cc, "edge", s)
	if err != nil {
		t.Fatalf("NewEnvoy(…) = %v", err)
	}
	t.Cleanup(func() { _ = env.Close() })
	return &harness{t: t, clock: clock, srv: srv, env: env}
}

// stream returns the next stream the client opens.
func (h *harness) stream() *fakeStream {
	h.t.Helper()
	select {
	case fs := <-h.srv.streams:
		return fs
	case <-time.After(wait):
		h.t.Fatal("no stream opened")
		return nil
	}
}

// report returns the next report the server receives on fs.
func (h *harness) report(fs *fakeStream) *rlqspb.RateLimitQuotaUsageReports {
	h.t.Helper()
	select {
	case r := <-fs.reports:
		return r
	case <-time.After(wait):
		h.t.Fatal("no report received")
		return nil
	}
}

// noReport checks that fs has received nothing more.
func (h *harness) noReport(fs *fakeStream) {
	h.t.Helper()
	select {
	case r := <-fs.reports:
		h.t.Fatalf("unexpected report %v", r)
	default:
	}
}

// respond sends actions on fs and waits until the client has applied them.
func (h *harness) respond(fs *fakeStream, actions ...*rlqspb.RateLimitQuotaResponse_BucketAction) {
	h.t.Helper()
	fs.send <- &rlqspb.RateLimitQuotaResponse{BucketAction: actions}
	h.sync()
}

// endStream ends fs from the server and waits until the client has seen it.
func (h *harness) endStream(fs *fakeStream) {
	h.t.Helper()
	fs.end <- nil
	h.sync()
}

func (h *harness) sync() {
	h.t.Helper()
	h.events++
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := h.env.WaitReceived(ctx, h.events); err != nil {
		h.t.Fatalf("WaitReceived(%d) = %v", h.events, err)
	}
}

// subscribe makes the first request of b and returns the stream and the
// bucket's first report, checked.
func (h *harness) subscribe(b map[string]string) *fakeStream {
	h.t.Helper()
	if !h.env.Request(b) {
		h.t.Fatalf("first Request(%v) = false, want true", b)
	}
	fs := h.stream()
	h.report(fs)
	return fs
}

// requests makes n requests of b and returns how many were allowed.
func (h *harness) requests(b map[string]string, n int) int {
	allowed := 0
	for range n {
		if h.env.Request(b) {
			allowed++
		}
	}
	return allowed
}

func (h *harness) stats(b map[string]string) rlqstest.BucketStats {
	h.t.Helper()
	s, ok := h.env.Stats()[rlqstest.Key(b)]
	if !ok {
		h.t.Fatalf("Stats() has no %v", b)
	}
	return s
}

func usage(b map[string]string, elapsed int64, allowed, denied uint64) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqspb.BucketId{Bucket: b},
		TimeElapsed:        &durationpb.Duration{Seconds: elapsed},
		NumRequestsAllowed: allowed,
		NumRequestsDenied:  denied,
	}
}

func reports(u ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqspb.RateLimitQuotaUsageReports {
	return &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: u}
}

func assign(b map[string]string, s *typev3.RateLimitStrategy, ttl *durationpb.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqspb.BucketId{Bucket: b},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl,
				RateLimitStrategy:    s,
			},
		},
	}
}

func abandon(b map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqspb.BucketId{Bucket: b},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func bucketOf(max uint32, perFill *wrapperspb.UInt32Value, fill *durationpb.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{
		TokenBucket: &typev3.TokenBucket{MaxTokens: max, TokensPerFill: perFill, FillInterval: fill},
	}}
}

// tb is a token bucket of rate perFill/fillSec per second. Tests use rates
// that are powers of two and quarter-second steps, so that the float
// arithmetic of TB is exact.
func tb(max, perFill uint32, fillSec int64) *typev3.RateLimitStrategy {
	return bucketOf(max, wrapperspb.UInt32(perFill), durationpb.New(time.Duration(fillSec)*time.Second))
}

func secs(n int64) *durationpb.Duration { return &durationpb.Duration{Seconds: n} }

var (
	bucketA = map[string]string{"api": "orders", "tenant": "a"}
	bucketB = map[string]string{"api": "orders", "tenant": "b"}
)

func TestFirstReportImmediate(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{})
	if err := h.env.Report(); err != nil {
		t.Fatalf("Report() before any bucket = %v, want nil", err)
	}
	if !h.env.Request(bucketA) {
		t.Fatal("Request(a) = false, want true (ALLOW_ALL before any assignment)")
	}
	fs := h.stream()
	if diff := cmp.Diff(reports(usage(bucketA, 0, 1, 0)), h.report(fs), protocmp.Transform()); diff != "" {
		t.Errorf("first report (-want +got):\n%s", diff)
	}
}

func TestFirstRequestDenyAll(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{NoAssignment: blanket(typev3.RateLimitStrategy_DENY_ALL)})
	if h.env.Request(bucketA) {
		t.Fatal("Request(a) = true, want false (no-assignment DENY_ALL)")
	}
	fs := h.stream()
	if diff := cmp.Diff(reports(usage(bucketA, 0, 0, 1)), h.report(fs), protocmp.Transform()); diff != "" {
		t.Errorf("first report (-want +got):\n%s", diff)
	}
}

func TestPeriodicReports(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{})
	fs := h.subscribe(bucketA)
	h.clock.Advance(2700 * time.Millisecond)
	h.env.Request(bucketB)
	if diff := cmp.Diff(reports(usage(bucketB, 0, 1, 0)), h.report(fs), protocmp.Transform()); diff != "" {
		t.Errorf("b's first report (-want +got):\n%s", diff)
	}
	h.requests(bucketA, 2)
	h.clock.Advance(2500 * time.Millisecond)
	if err := h.env.Report(); err != nil {
		t.Fatalf("Report() = %v", err)
	}
	// Whole seconds, truncated: 5.2 s → 5, 2.5 s → 2.
	if diff := cmp.Diff(reports(usage(bucketA, 5, 2, 0), usage(bucketB, 2, 0, 0)), h.report(fs), protocmp.Transform()); diff != "" {
		t.Errorf("tick 1 (-want +got):\n%s", diff)
	}
	h.clock.Advance(1999 * time.Millisecond)
	if err := h.env.Report(); err != nil {
		t.Fatalf("Report() = %v", err)
	}
	// Idle buckets are reported, with their counters reset.
	if diff := cmp.Diff(reports(usage(bucketA, 1, 0, 0), usage(bucketB, 1, 0, 0)), h.report(fs), protocmp.Transform()); diff != "" {
		t.Errorf("tick 2 (-want +got):\n%s", diff)
	}
	h.noReport(fs)
}

func TestTokenBucketEnforcement(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{})
	fs := h.subscribe(bucketA)
	// Burst 8, rate 8 per 2 s = 4/s.
	h.respond(fs, assign(bucketA, tb(8, 8, 2), secs(3600)))
	if got, want := h.requests(bucketA, 20), 8; got != want {
		t.Fatalf("requests at once = %d allowed, want %d (a new bucket starts full)", got, want)
	}
	allowed := 0
	for range 40 { // 10 s in quarter-second steps
		h.clock.Advance(250 * time.Millisecond)
		allowed += h.requests(bucketA, 3)
	}
	if got, want := allowed, 4*10; got != want {
		t.Errorf("allowed over 10 s = %d, want rate·t = %d", got, want)
	}
	st := h.stats(bucketA)
	if st.Rate != 4 || st.Burst != 8 || st.Source != rlqstest.Assigned {
		t.Errorf("Stats() = rate %v burst %d source %v, want 4, 8, Assigned", st.Rate, st.Burst, st.Source)
	}
	if got, want := st.Allowed, uint64(1+8+40); got != want {
		t.Errorf("Stats().Allowed = %d, want %d", got, want)
	}
}

func TestTokenBucketOddRates(t *testing.T) {
	t.Run("fill interval under 1 s is an infinite rate", func(t *testing.T) {
		h := newHarness(t, rlqstest.Settings{})
		fs := h.subscribe(bucketA)
		h.respond(fs, assign(bucketA, bucketOf(2, wrapperspb.UInt32(1), durationpb.New(500*time.Millisecond)), secs(3600)))
		if got := h.stats(bucketA).Rate; !math.IsInf(got, 1) {
			t.Errorf("Stats().Rate = %v, want +Inf", got)
		}
		allowed := 0
		for range 100 {
			h.clock.Advance(time.Nanosecond)
			allowed += h.requests(bucketA, 1)
		}
		if got, want := allowed, 100; got != want {
			t.Errorf("allowed = %d, want %d", got, want)
		}
		// TB takes no token at the instant of its last take: with a clock
		// standing still, one request per reading.
		if got, want := h.requests(bucketA, 5), 0; got != want {
			t.Errorf("allowed at a standing clock = %d, want %d", got, want)
		}
	})
	t.Run("unset tokens_per_fill never refills", func(t *testing.T) {
		h := newHarness(t, rlqstest.Settings{})
		fs := h.subscribe(bucketA)
		h.respond(fs, assign(bucketA, bucketOf(3, nil, secs(1)), secs(1<<20)))
		// Rate 1 token a year: filling 3 tokens takes longer than the
		// simulated host's uptime, so TB starts the bucket empty.
		h.clock.Advance(time.Hour)
		if got, want := h.requests(bucketA, 5), 0; got != want {
			t.Errorf("allowed = %d, want %d", got, want)
		}
	})
}

func TestReplacement(t *testing.T) {
	for _, tc := range []struct {
		name     string
		taken    int    // of the old bucket's 8 tokens
		newMax   uint32 // new bucket: rate 4/s
		wantFull bool   // uint64(newMax × remaining/8) ≥ 1
	}{
		{"idle bucket replaced full", 0, 4, true},
		{"quarter left replaced full", 6, 4, true},   // 4 × 2/8 = 1
		{"eighth left replaced empty", 7, 4, false},  // 4 × 1/8 = 0.5
		{"saturated replaced empty", 8, 100, false},  // 0
		{"larger bucket replaced full", 7, 16, true}, // 16 × 1/8 = 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, rlqstest.Settings{})
			fs := h.subscribe(bucketA)
			h.respond(fs, assign(bucketA, tb(8, 8, 2), secs(3600)))
			if got := h.requests(bucketA, tc.taken); got != tc.taken {
				t.Fatalf("took %d, want %d", got, tc.taken)
			}
			h.respond(fs, assign(bucketA, tb(tc.newMax, 4, 1), secs(3600)))
			want := 0
			if tc.wantFull {
				want = int(tc.newMax)
			}
			if got := h.requests(bucketA, 200); got != want {
				t.Errorf("allowed after replacement = %d, want %d", got, want)
			}
		})
	}
}

func TestIdenticalAssignmentKeepsTokens(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{})
	fs := h.subscribe(bucketA)
	h.respond(fs, assign(bucketA, tb(8, 8, 2), secs(10)))
	h.requests(bucketA, 5)
	h.clock.Advance(5 * time.Second / 4) // +5 tokens at 4/s, capped at 8
	h.requests(bucketA, 8)               // empty again
	// Only fill_interval.seconds differs: Envoy deems it identical, keeps the
	// limiter (and its rate of 4/s) and restarts the TTL.
	h.respond(fs, assign(bucketA, tb(8, 8, 4), secs(10)))
	st := h.stats(bucketA)
	if got, want := st.Rate, 4.0; got != want {
		t.Errorf("Stats().Rate = %v, want %v (old limiter kept)", got, want)
	}
	if got, want := st.Expires, h.clock.Now().Add(10*time.Second); !got.Equal(want) {
		t.Errorf("Stats().Expires = %v, want %v (TTL restarted)", got, want)
	}
	if got, want := h.requests(bucketA, 5), 0; got != want {
		t.Errorf("allowed after identical assignment = %d, want %d (no refill)", got, want)
	}
	h.clock.Advance(9 * time.Second)
	if got, want := h.stats(bucketA).Source, rlqstest.Assigned; got != want {
		t.Errorf("Stats().Source 9 s later = %v, want %v", got, want)
	}
}

func TestExpiry(t *testing.T) {
	t.Run("no fallback reverts to no-assignment", func(t *testing.T) {
		h := newHarness(t, rlqstest.Settings{})
		fs := h.subscribe(bucketA)
		h.respond(fs, assign(bucketA, blanket(typev3.RateLimitStrategy_DENY_ALL), durationpb.New(10*time.Second+900*time.Millisecond)))
		h.clock.Advance(10*time.Second - time.Nanosecond)
		if h.env.Request(bucketA) {
			t.Error("Request before the TTL = true, want false")
		}
		h.clock.Advance(time.Nanosecond) // nanos of the TTL are dropped
		if !h.env.Request(bucketA) {
			t.Error("Request at the TTL = false, want true (ALLOW_ALL)")
		}
		if got, want := h.stats(bucketA).Source, rlqstest.NoAssignment; got != want {
			t.Errorf("Stats().Source = %v, want %v", got, want)
		}
	})
	t.Run("fallback for its timeout, then no-assignment", func(t *testing.T) {
		h := newHarness(t, rlqstest.Settings{
			ExpiredFallback: blanket(typev3.RateLimitStrategy_DENY_ALL),
			ExpiredTimeout:  30*time.Second + 999*time.Millisecond, // whole seconds only
		})
		fs := h.subscribe(bucketA)
		h.respond(fs, assign(bucketA, blanket(typev3.RateLimitStrategy_ALLOW_ALL), secs(10)))
		h.clock.Advance(10 * time.Second)
		if h.env.Request(bucketA) {
			t.Error("Request in the fallback = true, want false")
		}
		st := h.stats(bucketA)
		if got, want := st.Source, rlqstest.Fallback; got != want {
			t.Errorf("Stats().Source = %v, want %v", got, want)
		}
		if got, want := st.Expires, h.clock.Now().Add(30*time.Second); !got.Equal(want) {
			t.Errorf("Stats().Expires = %v, want %v", got, want)
		}
		h.clock.Advance(30 * time.Second)
		if !h.env.Request(bucketA) {
			t.Error("Request after the fallback = false, want true")
		}
	})
	t.Run("fallback with the default timeout of 0 ends at once", func(t *testing.T) {
		h := newHarness(t, rlqstest.Settings{ExpiredFallback: blanket(typev3.RateLimitStrategy_DENY_ALL)})
		fs := h.subscribe(bucketA)
		h.respond(fs, assign(bucketA, blanket(typev3.RateLimitStrategy_DENY_ALL), secs(10)))
		h.clock.Advance(10 * time.Second)
		if !h.env.Request(bucketA) {
			t.Error("Request = false, want true")
		}
	})
	t.Run("token bucket fallback carries the fill ratio", func(t *testing.T) {
		h := newHarness(t, rlqstest.Settings{ExpiredFallback: tb(4, 4, 1), ExpiredTimeout: time.Hour})
		fs := h.subscribe(bucketA)
		// Rate 1/16 s: nothing refills noticeably in 10 s.
		h.respond(fs, assign(bucketA, tb(8, 1, 16), secs(10)))
		h.requests(bucketA, 8)
		h.clock.Advance(10 * time.Second) // 0.625 tokens: 4 × 0.625/8 < 1
		if got, want := h.requests(bucketA, 10), 0; got != want {
			t.Errorf("allowed in the fallback = %d, want %d (replaced empty)", got, want)
		}
	})
	for _, tc := range []struct {
		name string
		ttl  *durationpb.Duration
	}{{"TTL 0 expires at once", secs(0)}, {"unset TTL expires at once", nil}, {"TTL under 1 s expires at once", durationpb.New(999 * time.Millisecond)}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, rlqstest.Settings{})
			fs := h.subscribe(bucketA)
			h.respond(fs, assign(bucketA, blanket(typev3.RateLimitStrategy_DENY_ALL), tc.ttl))
			if !h.env.Request(bucketA) {
				t.Error("Request = false, want true (expired at once, ALLOW_ALL)")
			}
		})
	}
}

func TestIgnoredActions(t *testing.T) {
	rptu := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 1},
	}}
	for _, tc := range []struct {
		name   string
		action *rlqspb.RateLimitQuotaResponse_BucketAction
	}{
		{"requests_per_time_unit", assign(bucketA, rptu, secs(100))},
		{"no strategy", assign(bucketA, nil, secs(100))},
		{"unknown bucket", assign(map[string]string{"api": "other"}, blanket(typev3.RateLimitStrategy_ALLOW_ALL), secs(100))},
		{"empty bucket id", assign(map[string]string{}, blanket(typev3.RateLimitStrategy_ALLOW_ALL), secs(100))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, rlqstest.Settings{})
			fs := h.subscribe(bucketA)
			h.respond(fs, assign(bucketA, blanket(typev3.RateLimitStrategy_DENY_ALL), secs(10)))
			h.clock.Advance(5 * time.Second)
			h.respond(fs, tc.action)
			if h.env.Request(bucketA) {
				t.Error("Request after the ignored action = true, want false (old assignment stays)")
			}
			h.clock.Advance(5 * time.Second) // the old timer still runs
			if !h.env.Request(bucketA) {
				t.Error("Request at the old TTL = false, want true")
			}
		})
	}
}

func TestAbandonResubscribes(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{})
	fs := h.subscribe(bucketA)
	h.respond(fs, assign(bucketA, blanket(typev3.RateLimitStrategy_DENY_ALL), secs(100)))
	h.env.Request(bucketA)
	h.respond(fs, abandon(bucketA))
	st := h.stats(bucketA)
	if st.Source != rlqstest.Abandoned || st.Allowed != 1 || st.Denied != 1 {
		t.Errorf("Stats() = %+v, want Abandoned with 1 allowed, 1 denied", st)
	}
	h.clock.Advance(3 * time.Second)
	if !h.env.Request(bucketA) {
		t.Error("Request after abandon = false, want true (new bucket, ALLOW_ALL)")
	}
	if diff := cmp.Diff(reports(usage(bucketA, 0, 1, 0)), h.report(fs), protocmp.Transform()); diff != "" {
		t.Errorf("resubscription report (-want +got):\n%s", diff)
	}
}

func TestStreamEndedByServer(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{})
	fs := h.subscribe(bucketA)
	h.respond(fs, assign(bucketA, blanket(typev3.RateLimitStrategy_DENY_ALL), secs(60)))
	h.endStream(fs)
	if h.env.Request(bucketA) {
		t.Error("Request after the stream ended = true, want false (assignment runs to its TTL)")
	}
	// b's immediate report is built, resetting its counter, and dropped: no
	// stream. So its first request is never reported.
	h.env.Request(bucketB)
	select {
	case fs := <-h.srv.streams:
		t.Fatalf("stream %v opened before Report", fs)
	default:
	}
	if got, want := h.env.Reconnects(), 0; got != want {
		t.Errorf("Reconnects() = %d, want %d", got, want)
	}
	h.clock.Advance(5 * time.Second)
	if err := h.env.Report(); err != nil {
		t.Fatalf("Report() = %v", err)
	}
	fs2 := h.stream()
	if diff := cmp.Diff(reports(usage(bucketA, 5, 0, 1), usage(bucketB, 5, 0, 0)), h.report(fs2), protocmp.Transform()); diff != "" {
		t.Errorf("first report on the new stream (-want +got):\n%s", diff)
	}
	if got, want := h.env.Reconnects(), 1; got != want {
		t.Errorf("Reconnects() = %d, want %d", got, want)
	}
	// The new stream carries assignments as the old did.
	h.respond(fs2, assign(bucketB, blanket(typev3.RateLimitStrategy_DENY_ALL), secs(60)))
	if h.env.Request(bucketB) {
		t.Error("Request(b) = true, want false")
	}
}

func TestReportDroppedWithoutServer(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	_ = lis.Close() // every dial fails
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	env, err := rlqstest.NewEnvoy(cc, "edge", rlqstest.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	if !env.Request(bucketA) {
		t.Error("Request = false, want true")
	}
	if err := env.Report(); !errors.Is(err, rlqstest.ErrNoStream) {
		t.Errorf("Report() = %v, want ErrNoStream", err)
	}
	_ = env.Close()
	if err := env.Report(); !errors.Is(err, rlqstest.ErrClosed) {
		t.Errorf("Report() after Close = %v, want ErrClosed", err)
	}
}

func TestRun(t *testing.T) {
	h := newHarness(t, rlqstest.Settings{ReportInterval: time.Millisecond})
	fs := h.subscribe(bucketA)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.env.Run(ctx) }()
	h.report(fs)
	h.report(fs)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v, want context.Canceled", err)
	}
}

func TestNewEnvoyErrors(t *testing.T) {
	cc, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, tc := range []struct {
		name string
		s    rlqstest.Settings
	}{
		{"token bucket no-assignment", rlqstest.Settings{NoAssignment: tb(1, 1, 1)}},
		{"unset no-assignment strategy", rlqstest.Settings{NoAssignment: &typev3.RateLimitStrategy{}}},
		{"unknown blanket rule", rlqstest.Settings{NoAssignment: blanket(7)}},
		{"negative interval", rlqstest.Settings{ReportInterval: -time.Second}},
		{"negative timeout", rlqstest.Settings{ExpiredTimeout: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := rlqstest.NewEnvoy(cc, "edge", tc.s); err == nil {
				t.Error("NewEnvoy(…) = nil error, want an error")
			}
		})
	}
	if _, err := rlqstest.NewEnvoy(nil, "edge", rlqstest.Settings{}); err == nil {
		t.Error("NewEnvoy(nil, …) = nil error, want an error")
	}
}

func TestKey(t *testing.T) {
	if got, want := rlqstest.Key(map[string]string{"b": "2", "a": `1"`}), `{"a":"1\"","b":"2"}`; got != want {
		t.Errorf("Key(…) = %s, want %s", got, want)
	}
}
