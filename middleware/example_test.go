package middleware_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/netip"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// Wiring a server: the tenant registry, an in-memory store, the CPU gate
// and its loop, and the interceptors first in the chain.
func ExampleNew() {
	reg, err := tenant.New()
	if err != nil {
		log.Fatal(err)
	}
	// In production: reg.Load("quotas.yaml") and go reg.Watch(ctx, …).
	reg.Set(mustCompile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 50, Burst: 100}}}))

	sampler, _, err := cpugate.NewSampler()
	if err != nil {
		log.Fatal(err)
	}
	gate, err := cpugate.New(sampler)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go gate.Run(ctx) // the gate samples only in the caller's loop

	store, err := keyed.New(keyed.WithCapacity(1_000_000))
	if err != nil {
		log.Fatal(err)
	}
	lim, err := middleware.New(store, reg,
		middleware.WithGate(gate),
		middleware.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")),
	)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.InTapHandle(lim.TapHandle),
		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()),
	)
	defer srv.Stop()
	// Health checks are exempt: admitted, with no decision.
	a, err := lim.Admit(context.Background(), middleware.Call{Method: "/grpc.health.v1.Health/Check"})
	_, decided := a.Decision()
	fmt.Println(err == nil, decided)
	// Output: true false
}

// A handler reads the decision: who the caller is and what is left.
func ExampleFromContext() {
	lim, err := middleware.New(mustStore(), middleware.Static(mustCompile(&tenant.Config{
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 3}},
	})))
	if err != nil {
		log.Fatal(err)
	}
	handler := func(ctx context.Context, _ any) (any, error) {
		d, _ := middleware.FromContext(ctx)
		fmt.Printf("allowed=%v anonymous=%v remaining=%d\n", d.Allowed, d.Tenant == "", d.Result.Remaining)
		return nil, nil
	}
	icpt := lim.UnaryServerInterceptor()
	for range 2 {
		_, _ = icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/inventory.v1.Inventory/Get"}, handler)
	}
	// Output:
	// allowed=true anonymous=true remaining=2
	// allowed=true anonymous=true remaining=1
}

// A client learns why it was rejected and when to come back from the
// status details.
func ExampleLimiter_UnaryServerInterceptor_rejection() {
	lim, err := middleware.New(mustStore(), middleware.Static(mustCompile(&tenant.Config{
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 2, Burst: 1}},
	})))
	if err != nil {
		log.Fatal(err)
	}
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()))
	srv.RegisterService(&echoDesc, &echo{})
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()

	var trailer metadata.MD
	for range 2 {
		err = cc.Invoke(context.Background(), echoCall, &emptypb.Empty{}, &emptypb.Empty{}, grpc.Trailer(&trailer))
	}
	st := status.Convert(err)
	fmt.Println(st.Code(), st.Message())
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			fmt.Println("reason:", d.Reason)
		case *errdetails.RetryInfo:
			fmt.Println("retry in:", d.RetryDelay.AsDuration().Round(100*time.Millisecond))
		}
	}
	// Output:
	// ResourceExhausted rate limit exceeded
	// reason: RATE_LIMITED
	// retry in: 500ms
}

// With go-grpc-middleware: the Limiter as its ratelimit.Limiter, behind
// recovery, with health checks and reflection left out by the selector.
func ExampleLimiter_Selector() {
	lim, err := middleware.New(mustStore(), middleware.Static(mustCompile(&tenant.Config{
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 100, Burst: 100}},
	})))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		recovery.UnaryServerInterceptor(),
		selector.UnaryServerInterceptor(ratelimit.UnaryServerInterceptor(lim), lim.Selector()),
	))
	defer srv.Stop()
	// Reflection is exempt: admitted, with no decision.
	a, err := lim.Admit(context.Background(), middleware.Call{Method: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"})
	_, decided := a.Decision()
	fmt.Println(err == nil, decided)
	// Output: true false
}

func mustCompile(cfg *tenant.Config) *tenant.Table {
	t, err := tenant.Compile(cfg)
	if err != nil {
		log.Fatal(err)
	}
	return t
}

func mustStore() *keyed.Map {
	m, err := keyed.New()
	if err != nil {
		log.Fatal(err)
	}
	return m
}

// A quota of model tokens beside the call limit: each call reserves its
// estimate and settles at the tokens its reply used, which its handler
// reports; a reply that overruns puts the caller in debt, and its next
// call is refused until the debt is repaid.
func ExampleReportCost() {
	tbl, err := tenant.Parse("tenants.yaml", []byte(`
anonymous:
  default: {rate: 50, burst: 100}
  methods:
    "/llm.v1.Completions/*":
      metered: {unit: tokens, rate: 100000, per: 1m, burst: 20000, estimate: 4000}
`))
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := floodgate.ClockFunc(func() time.Time { return now }) // time stands still
	store, _ := keyed.New(keyed.WithClock(clock))
	lim, err := middleware.New(store, middleware.Static(tbl), middleware.WithClock(clock))
	if err != nil {
		log.Fatal(err)
	}
	generate := func(tokens int64) grpc.UnaryHandler {
		return func(ctx context.Context, req any) (any, error) {
			// … the model writes its reply; now its usage is known.
			middleware.ReportCost(ctx, tokens)
			return &emptypb.Empty{}, nil
		}
	}
	icpt := lim.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/llm.v1.Completions/Generate"}
	for _, tokens := range []int64{1000, 29000, 1000} {
		_, err := icpt(context.Background(), nil, info, generate(tokens))
		st := status.Convert(err)
		fmt.Print(st.Code())
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				fmt.Print(" ", d.Reason)
			case *errdetails.RetryInfo:
				fmt.Print(" retry in ", d.RetryDelay.AsDuration())
			}
		}
		fmt.Println()
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted IN_DEBT retry in 8.4s
}
