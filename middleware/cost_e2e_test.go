package middleware_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate/middleware"
)

// completions is a hand-registered model service on google.protobuf.Empty:
// a unary Generate and a server-streaming Stream, each costing the tokens
// its "x-test-cost" metadata says (per message for the stream), reported
// as the reply is written.
var completionsDesc = grpc.ServiceDesc{
	ServiceName: "llm.v1.Completions",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Generate",
		Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) {
				middleware.ReportCost(ctx, testCost(ctx))
				return &emptypb.Empty{}, nil
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: llmGenerate}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			if err := ss.RecvMsg(new(emptypb.Empty)); err != nil {
				return err
			}
			cost := testCost(ss.Context())
			for {
				if err := ss.SendMsg(&emptypb.Empty{}); err != nil {
					return err
				}
				middleware.ReportCost(ss.Context(), cost)
			}
		},
	}},
}

func testCost(ctx context.Context) int64 {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-test-cost"); len(v) == 1 {
		n, _ := strconv.ParseInt(v[0], 10, 64)
		return n
	}
	return 0
}

func serveCompletions(t *testing.T, nw network, l *middleware.Limiter) *grpc.ClientConn {
	t.Helper()
	lis, nd := nw.listen(t)
	srv := grpc.NewServer(limiterServer(l)...)
	srv.RegisterService(&completionsDesc, struct{}{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	target := "passthrough:///bufnet"
	if nw.name == "tcp" {
		target = lis.Addr().String()
	}
	cc, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nd...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		wg.Wait()
	})
	return cc
}

// TestEndToEndMetered: over a real connection, a call settles at what its
// handler reported, an overrun puts the tenant in debt, and the client
// reads the debt, its unit and the wait from the status details.
func TestEndToEndMetered(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			f := newMeterFixture(t, tokensPerMinute)
			cc := serveCompletions(t, nw, f.l)
			generate := func(cost int, kv ...string) error {
				md := metadata.Pairs(append([]string{"x-api-key", acmeKey, "x-test-cost", strconv.Itoa(cost)}, kv...)...)
				return cc.Invoke(metadata.NewOutgoingContext(context.Background(), md), llmGenerate, &emptypb.Empty{}, &emptypb.Empty{})
			}
			if err := generate(1000, "x-max-tokens", "2000"); err != nil {
				t.Fatal(err)
			}
			if got, want := f.tokens(), 19000.0; got != want {
				t.Errorf("after a call of 1000 the bucket holds %v, want %v", got, want)
			}
			if err := generate(45000); err != nil { // 39,000 over: 20,000 of debt
				t.Fatal(err)
			}
			err := generate(1000)
			st, ok := status.FromError(err)
			if !ok || st.Code() != codes.ResourceExhausted {
				t.Fatalf("call in debt: %v, want RESOURCE_EXHAUSTED", err)
			}
			var kinds []string
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					kinds = append(kinds, "ErrorInfo:"+d.Reason+":"+d.Metadata["quota_unit"])
				case *errdetails.RetryInfo:
					kinds = append(kinds, "RetryInfo:"+d.RetryDelay.AsDuration().String())
				case *errdetails.QuotaFailure:
					kinds = append(kinds, "QuotaFailure")
				}
			}
			// 20,000 owed and 4,000 to reserve: 14.4 s, on the grid 15 s.
			want := []string{"ErrorInfo:IN_DEBT:tokens", "RetryInfo:15s", "QuotaFailure"}
			if diff := cmp.Diff(want, kinds); diff != "" {
				t.Errorf("details (-want +got):\n%s", diff)
			}
			err = generate(1000, "x-max-tokens", "lots")
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument {
				t.Errorf("invalid estimate: %v, want INVALID_ARGUMENT", err)
			}
		})
	}
}

// TestEndToEndMeteredStream: a stream that runs past its tenant's quota
// ends, at the first chunk it cannot cover, with RESOURCE_EXHAUSTED and
// the wait, after the messages its reservations covered.
func TestEndToEndMeteredStream(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw.name, func(t *testing.T) {
			f := newMeterFixture(t, tokensPerMinute)
			cc := serveCompletions(t, nw, f.l)
			md := metadata.Pairs("x-api-key", acmeKey, "x-test-cost", "2000")
			ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), time.Minute)
			defer cancel()
			cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, llmStream)
			if err != nil {
				t.Fatal(err)
			}
			if err := cs.SendMsg(&emptypb.Empty{}); err != nil {
				t.Fatal(err)
			}
			_ = cs.CloseSend()
			n := 0
			for ; ; n++ {
				if err = cs.RecvMsg(new(emptypb.Empty)); err != nil {
					break
				}
			}
			st, _ := status.FromError(err)
			if st.Code() != codes.ResourceExhausted {
				t.Fatalf("stream ended with %v after %d messages, want RESOURCE_EXHAUSTED", err, n)
			}
			var retry time.Duration
			for _, d := range st.Details() {
				if r, ok := d.(*errdetails.RetryInfo); ok {
					retry = r.RetryDelay.AsDuration()
				}
			}
			// Messages of 2,000 reported after sending: 20,000 reserved in
			// all, the 11th reported past them, the 12th refused.
			if n != 11 || retry != 2400*time.Millisecond {
				t.Errorf("%d messages, then RetryInfo %v; want 11, then 2.4s", n, retry)
			}
			if got := cs.Trailer().Get(pushbackKey); !cmp.Equal(got, []string{"2400"}) {
				t.Errorf("pushback trailer = %q, want 2400", got)
			}
			if got, want := f.tokens(), -2000.0; got != want {
				t.Errorf("bucket holds %v after the stream, want %v: its last message in debt", got, want)
			}
		})
	}
}
