package middleware_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// echo is a tiny hand-registered service: a unary Call and a bidi Chat,
// both on google.protobuf.Empty, so no .proto file is needed.
type echo struct {
	calls atomic.Int64
	panic bool
}

const (
	echoCall = "/floodgate.test.Echo/Call"
	echoChat = "/floodgate.test.Echo/Chat"
)

var echoDesc = grpc.ServiceDesc{
	ServiceName: "floodgate.test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(context.Context, any) (any, error) {
				e := srv.(*echo)
				e.calls.Add(1)
				if e.panic {
					panic("handler bug")
				}
				return &emptypb.Empty{}, nil
			}
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: echoCall}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Chat",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			srv.(*echo).calls.Add(1)
			for {
				m := new(emptypb.Empty)
				if err := ss.RecvMsg(m); err != nil {
					return nil
				}
				if err := ss.SendMsg(m); err != nil {
					return err
				}
			}
		},
	}},
}

func invoke(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
	return cc.Invoke(ctx, echoCall, &emptypb.Empty{}, &emptypb.Empty{}, opts...)
}

// network is where a test server listens: in memory or on loopback TCP.
type network struct {
	name   string
	listen func(t *testing.T) (net.Listener, []grpc.DialOption)
}

var networks = []network{
	{"bufconn", func(t *testing.T) (net.Listener, []grpc.DialOption) {
		lis := bufconn.Listen(1 << 20)
		return lis, []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return lis.DialContext(ctx)
		})}
	}},
	{"tcp", func(t *testing.T) (net.Listener, []grpc.DialOption) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return lis, nil
	}},
}

// serve starts a server with the echo and health services and returns a
// client connected to it; both stop at cleanup.
func serve(t *testing.T, nw network, srvOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) (*grpc.ClientConn, *echo) {
	t.Helper()
	lis, nd := nw.listen(t)
	srv := grpc.NewServer(srvOpts...)
	e := &echo{}
	srv.RegisterService(&echoDesc, e)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	target := "passthrough:///bufnet"
	if nw.name == "tcp" {
		target = lis.Addr().String()
	}
	cc, err := grpc.NewClient(target, append(append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nd...), dialOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		wg.Wait()
	})
	return cc, e
}

func limiterServer(l *middleware.Limiter, extra ...grpc.ServerOption) []grpc.ServerOption {
	return append([]grpc.ServerOption{
		grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(l.StreamServerInterceptor()),
	}, extra...)
}

func TestEndToEndRejection(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			f := newFixture(t)
			cc, e := serve(t, nw, limiterServer(f.l))
			ctx := context.Background()
			for i := range 2 {
				if err := invoke(ctx, cc); err != nil {
					t.Fatalf("call %d within the burst: %v", i, err)
				}
			}
			var header, trailer metadata.MD
			err := invoke(ctx, cc, grpc.Header(&header), grpc.Trailer(&trailer))
			st, ok := status.FromError(err)
			if !ok || st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded" {
				t.Fatalf("third call: %v, want RESOURCE_EXHAUSTED", err)
			}
			if got := e.calls.Load(); got != 2 {
				t.Errorf("handler ran %d times, want 2", got)
			}
			if len(header) != 0 {
				t.Errorf("rejection header metadata = %v, want none", header)
			}
			if got, want := trailer.Get(pushbackKey), []string{"1000"}; !cmp.Equal(got, want) {
				t.Errorf("pushback = %q, want %q", got, want)
			}
			var kinds []string
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					kinds = append(kinds, "ErrorInfo:"+d.Reason+"@"+d.Domain)
				case *errdetails.RetryInfo:
					kinds = append(kinds, "RetryInfo:"+d.RetryDelay.AsDuration().String())
				case *errdetails.QuotaFailure:
					kinds = append(kinds, "QuotaFailure")
				default:
					t.Errorf("detail %T", d)
				}
			}
			want := []string{"ErrorInfo:RATE_LIMITED@floodgate.dev", "RetryInfo:1s", "QuotaFailure"}
			if diff := cmp.Diff(want, kinds); diff != "" {
				t.Errorf("details (-want +got):\n%s", diff)
			}

			// A tenant has its own bucket, whoever else is rejected.
			tctx := metadata.AppendToOutgoingContext(ctx, "x-api-key", acmeKey)
			if err := invoke(tctx, cc); err != nil {
				t.Errorf("acme rejected: %v", err)
			}
			// Health checks are exempt.
			for range 5 {
				if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatalf("health check: %v", err)
				}
			}
			// The subject on TCP is the loopback address; in memory, none.
			wantKey := "a:-"
			if nw.name == "tcp" {
				wantKey = "a:127.0.0.1"
			}
			rule := testTable(t).Anonymous().Rule(echoCall)
			if got := f.store.Tokens(wantKey+":"+rule.ID, floodgate.PerSecond(1, 2)); got >= 1 {
				t.Errorf("bucket %s holds %v tokens, want it drained", wantKey, got)
			}
		})
	}
}

func TestEndToEndStream(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			f := newFixture(t, middleware.WithPerMessage(true))
			cc, _ := serve(t, nw, limiterServer(f.l))
			desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
			// Burst 2: the stream's start and its first message.
			cs, err := cc.NewStream(context.Background(), desc, echoChat)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if err := cs.SendMsg(&emptypb.Empty{}); err != nil {
					break
				}
				if err := cs.RecvMsg(new(emptypb.Empty)); err != nil {
					if i != 1 {
						t.Errorf("stream ended at message %d, want at message 1", i)
					}
					break
				}
			}
			// The bucket is empty: the next stream is rejected at its start,
			// Trailers-Only.
			cs, err = cc.NewStream(context.Background(), desc, echoChat)
			if err != nil {
				t.Fatal(err)
			}
			_ = cs.CloseSend()
			err = cs.RecvMsg(new(emptypb.Empty))
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("stream on an empty bucket: %v, want RESOURCE_EXHAUSTED", err)
			}
			if h, _ := cs.Header(); len(h) != 0 {
				t.Errorf("rejected stream header = %v, want none", h)
			}
			if cs.Trailer().Get(pushbackKey) == nil {
				t.Error("rejected stream has no pushback trailer")
			}
		})
	}
}

// serviceConfig is the sample client service config shipped in testdata.
func serviceConfig(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../testdata/middleware/service_config.json")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRetryHonoursPushback: grpc-go's retry waits the pushback the
// rejection asks for and the retried call succeeds once the token is back;
// a wait past the deadline is not retried at all.
func TestRetryHonoursPushback(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 10, Burst: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			store, err := keyed.New() // the real clock: the client really waits
			if err != nil {
				t.Fatal(err)
			}
			ty := &tally{}
			l, err := middleware.New(store, middleware.Static(tbl), ty.option(nil))
			if err != nil {
				t.Fatal(err)
			}
			cc, e := serve(t, nw, limiterServer(l), grpc.WithDefaultServiceConfig(serviceConfig(t)))
			ctx := context.Background()
			if err := invoke(ctx, cc); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := invoke(ctx, cc); err != nil {
				t.Fatalf("second call, retried after the pushback: %v", err)
			}
			waited := time.Since(start)
			if got, want := ty.counts(), (counts{Admitted: 2, Quota: 1}); got != want {
				t.Errorf("counts() = %+v, want %+v (one rejected attempt, then the retry admitted)", got, want)
			}
			if e.calls.Load() != 2 {
				t.Errorf("handler ran %d times, want 2", e.calls.Load())
			}
			// A lower bound only: the client cannot have retried before the
			// pushback (up to 100 ms, less the time the first call took).
			if waited < 50*time.Millisecond {
				t.Errorf("retry came after %v, before the pushback", waited)
			}

			// Drain the bucket, then call with a deadline shorter than the
			// wait: pushback -1, no retry, one rejection.
			_ = invoke(ctx, cc)
			before := ty.counts()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			defer cancel()
			var trailer metadata.MD
			err = invoke(dctx, cc, grpc.Trailer(&trailer))
			if code := status.Code(err); code != codes.ResourceExhausted {
				t.Fatalf("call with a short deadline: %v, want RESOURCE_EXHAUSTED without retries", err)
			}
			if got := trailer.Get(pushbackKey); !cmp.Equal(got, []string{"-1"}) {
				t.Errorf("pushback = %q, want -1", got)
			}
			if got := ty.counts().Quota - before.Quota; got != 1 {
				t.Errorf("%d rejected attempts, want 1 (no retry after pushback -1)", got)
			}
		})
	}
}

// TestTapOverGRPC: at the gate's floor, a caller the interceptor told to
// wait is turned away by the tap handle on its next call.
func TestTapOverGRPC(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			g, sample := scriptedGate(t)
			f := newFixture(t, middleware.WithGate(g))
			cc, e := serve(t, nw, limiterServer(f.l, grpc.InTapHandle(f.l.TapHandle)))
			sample(0.99, f.clock.Now())
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", acmeKey)
			var codesSeen []codes.Code
			for range 3 {
				codesSeen = append(codesSeen, status.Code(invoke(ctx, cc)))
			}
			if diff := cmp.Diff([]codes.Code{codes.OK, codes.Unavailable, codes.Unavailable}, codesSeen); diff != "" {
				t.Errorf("codes (-want +got):\n%s", diff)
			}
			st := f.tally.counts()
			if st.Admitted != 1 || st.Gate != 2 || st.Tap != 1 || st.Overload != 0 {
				t.Errorf("counts() = %+v, want 1 admitted, 2 gate refusals (1 in the interceptor, 1 at the tap), 1 at the tap", st)
			}
			if e.calls.Load() != 1 {
				t.Errorf("handler ran %d times, want 1", e.calls.Load())
			}
			// The tap's rejection carries details too.
			err := invoke(ctx, cc)
			s, _ := status.FromError(err)
			if s.Code() != codes.Unavailable || len(s.Details()) == 0 {
				t.Errorf("tap rejection = %v with %d details", err, len(s.Details()))
			}
			// Health checks pass the tap.
			if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("health check at the floor: %v", err)
			}
		})
	}
}

type logLine struct {
	msg    string
	fields map[string]any
}

// TestGoGRPCMiddlewareChain chains the Limiter with go-grpc-middleware's
// logging, recovery and selector interceptors, both through its own
// interceptor and through the ratelimit package.
func TestGoGRPCMiddlewareChain(t *testing.T) {
	for _, via := range []string{"interceptor", "ratelimit"} {
		t.Run(via, func(t *testing.T) {
			var mu sync.Mutex
			var lines []logLine
			logger := logging.LoggerFunc(func(_ context.Context, _ logging.Level, msg string, fields ...any) {
				m := map[string]any{}
				for i := 0; i+1 < len(fields); i += 2 {
					m[fields[i].(string)] = fields[i+1]
				}
				mu.Lock()
				lines = append(lines, logLine{msg, m})
				mu.Unlock()
			})
			f := newFixture(t)
			limit := f.l.UnaryServerInterceptor()
			if via == "ratelimit" {
				limit = selector.UnaryServerInterceptor(ratelimit.UnaryServerInterceptor(f.l), f.l.Selector())
			}
			cc, e := serve(t, networks[0], []grpc.ServerOption{grpc.ChainUnaryInterceptor(
				logging.UnaryServerInterceptor(logger, logging.WithLogOnEvents(logging.FinishCall)),
				recovery.UnaryServerInterceptor(),
				limit,
			)})
			ctx := context.Background()
			var got []codes.Code
			for range 3 {
				got = append(got, status.Code(invoke(ctx, cc)))
			}
			for range 3 {
				_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
				got = append(got, status.Code(err))
			}
			// A handler panic behind the limiter is recovered (as UNKNOWN, the
			// recovery interceptor's default).
			f.clock.Advance(time.Second)
			e.panic = true
			got = append(got, status.Code(invoke(ctx, cc)))
			want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.OK, codes.OK, codes.OK, codes.Unknown}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("codes (-want +got):\n%s", diff)
			}
			mu.Lock()
			defer mu.Unlock()
			var loggedCodes []any
			for _, l := range lines {
				if l.fields["grpc.method"] == "Call" {
					loggedCodes = append(loggedCodes, l.fields["grpc.code"])
				}
			}
			if diff := cmp.Diff([]any{"OK", "OK", "ResourceExhausted", "Unknown"}, loggedCodes); diff != "" {
				t.Errorf("logged codes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTrustedProxyOverTCP: behind a trusted proxy (here the loopback
// address), forwarded clients get their own buckets; an untrusted peer's
// headers change nothing.
func TestTrustedProxyOverTCP(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		var opts []middleware.Option
		if trusted {
			opts = append(opts, middleware.WithTrustedProxies(netip.MustParsePrefix("127.0.0.0/8")))
		}
		f := newFixture(t, opts...)
		cc, _ := serve(t, networks[1], limiterServer(f.l))
		ok := 0
		for i := range 10 {
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", "198.51.100."+string(rune('0'+i)))
			if invoke(ctx, cc) == nil {
				ok++
			}
		}
		want := 2
		if trusted {
			want = 10
		}
		if ok != want {
			t.Errorf("trusted %v: %d of 10 forwarded clients admitted, want %d", trusted, ok, want)
		}
	}
}

var _ = cpugate.Shedding

// TestRateLimitHeadersOverGRPC: with WithRateLimitHeaders, admitted calls
// carry the bucket's state as header metadata; a rejection still carries
// none, so it stays Trailers-Only.
func TestRateLimitHeadersOverGRPC(t *testing.T) {
	f := newFixture(t, middleware.WithRateLimitHeaders(true))
	cc, _ := serve(t, networks[1], limiterServer(f.l))
	var got []metadata.MD
	for range 3 {
		var h metadata.MD
		_ = invoke(context.Background(), cc, grpc.Header(&h))
		delete(h, "content-type")
		got = append(got, h)
	}
	want := []metadata.MD{
		{"ratelimit-limit": {"2"}, "ratelimit-remaining": {"1"}, "ratelimit-reset": {"1"}},
		{"ratelimit-limit": {"2"}, "ratelimit-remaining": {"0"}, "ratelimit-reset": {"2"}},
		{},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}

// TestServeHTTPKeysByAddress serves through grpc.Server.ServeHTTP, where
// grpc-go names the peer by the request's "ip:port" string rather than a
// *net.TCPAddr: anonymous callers must still get a bucket per address, not
// one shared by all.
func TestServeHTTPKeysByAddress(t *testing.T) {
	f := newFixture(t)
	gs := grpc.NewServer(limiterServer(f.l)...)
	gs.RegisterService(&echoDesc, &echo{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: gs, Protocols: new(http.Protocols)}
	hs.Protocols.SetUnencryptedHTTP2(true)
	go hs.Serve(lis)
	t.Cleanup(func() { hs.Close() })

	dial := func(local string) *grpc.ClientConn {
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
				return d.DialContext(ctx, "tcp", addr)
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx := context.Background()
	noisy, quiet := dial("127.0.0.1"), dial("127.0.0.2")
	for i := range 2 { // the anonymous burst
		if err := invoke(ctx, noisy); err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	if err := invoke(ctx, noisy); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("call past the burst: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := invoke(ctx, quiet); err != nil {
		t.Errorf("first call from another address: %v, want its own bucket", err)
	}
}

// TestStringPeerAddresses: addresses that name themselves by a string, as
// under ServeHTTP, are read like connection addresses, IPv6 zones included;
// strings that are no address key the caller as having none.
func TestStringPeerAddresses(t *testing.T) {
	f := newFixture(t)
	for addr, want := range map[string]string{
		"203.0.113.7:443":       "a:203.0.113.7",
		"[2001:db8::1]:443":     "a:2001:db8::",
		"[fe80::1%eth0]:443":    "a:fe80::",
		"bufconn":               "a:-",
		"[fe80::1%eth0]:443zzz": "a:-",
	} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: pipeAddr(addr)})
		if got := middleware.Subject(f.l, ctx); got != want {
			t.Errorf("peer %q: subject %q, want %q", addr, got, want)
		}
	}
}

// TestRepeatedKeyIsAnonymousAndSaysSo sends the API key twice, as
// metadata.AppendToOutgoingContext does on a context that already holds
// it: the caller is judged by its address, and its rejection says why.
func TestRepeatedKeyIsAnonymousAndSaysSo(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			f := newFixture(t)
			cc, e := serve(t, nw, limiterServer(f.l))
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", acmeKey)
			ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", acmeKey)
			var err error
			for range 3 { // the anonymous burst is 2; acme's would hold 3
				if err = invoke(ctx, cc); err != nil {
					break
				}
			}
			if got := e.calls.Load(); got != 2 {
				t.Errorf("handler ran %d times, want 2 (the anonymous burst)", got)
			}
			st, _ := status.FromError(err)
			if st.Code() != codes.ResourceExhausted {
				t.Fatalf("third call: %v, want RESOURCE_EXHAUSTED", err)
			}
			var md map[string]string
			for _, d := range st.Details() {
				if ei, ok := d.(*errdetails.ErrorInfo); ok {
					md = ei.GetMetadata()
				}
			}
			if diff := cmp.Diff(map[string]string{"api_key_ignored": "repeated"}, md); diff != "" {
				t.Errorf("ErrorInfo metadata (-want +got):\n%s", diff)
			}
			if got := f.tally.counts().RepeatedKeys; got != 3 {
				t.Errorf("counts().RepeatedKeys = %d, want 3", got)
			}

			// A caller sending the key once gets its tenant's bucket, and
			// an anonymous caller's rejection has no such metadata.
			one := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", acmeKey)
			if err := invoke(one, cc); err != nil {
				t.Errorf("acme with one key: %v", err)
			}
			st, _ = status.FromError(invoke(context.Background(), cc))
			for _, d := range st.Details() {
				if ei, ok := d.(*errdetails.ErrorInfo); ok && len(ei.GetMetadata()) != 0 {
					t.Errorf("anonymous rejection metadata = %v, want none", ei.GetMetadata())
				}
			}
		})
	}
}

// subjects collects the subjects of the calls turned away, as the
// observer's events name them.
type subjects struct {
	mu   sync.Mutex
	list []string
}

func (s *subjects) observe(e middleware.Event) {
	if e.Allowed || e.DryRun {
		return
	}
	s.mu.Lock()
	s.list = append(s.list, strings.Clone(e.Subject))
	s.mu.Unlock()
}

func (s *subjects) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.list
	s.list = nil
	return l
}

// TestRejectedSubjects checks that every rejection, the tap handle's too,
// names the subject the call was charged to: a caller rotating made-up
// keys is its address, a tenant its ID.
func TestRejectedSubjectsInEvents(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			var got subjects
			ty := &tally{}
			g, sample := scriptedGate(t)
			f := newFixture(t, middleware.WithGate(g), ty.option(got.observe))
			cc, _ := serve(t, nw, limiterServer(f.l, grpc.InTapHandle(f.l.TapHandle)))
			addr := "a:-"
			if nw.name == "tcp" {
				addr = "a:127.0.0.1"
			}
			for i := range 4 {
				ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", fmt.Sprintf("made-up-%d", i))
				_ = invoke(ctx, cc)
			}
			if diff := cmp.Diff([]string{addr, addr}, got.take()); diff != "" {
				t.Errorf("made-up keys over the anonymous burst of 2 (-want +got):\n%s", diff)
			}

			sample(0.99, f.clock.Now())
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", acmeKey)
			for range 3 {
				_ = invoke(ctx, cc)
			}
			if diff := cmp.Diff([]string{"t:acme", "t:acme"}, got.take()); diff != "" {
				t.Errorf("acme shed by the interceptor, then the tap (-want +got):\n%s", diff)
			}
			if st := ty.counts(); st.Tap != 1 {
				t.Errorf("counts().Tap = %d, want 1", st.Tap)
			}
		})
	}
}
