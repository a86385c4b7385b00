package main

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/examples/multitenant/internal/loadgen"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/overload"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// scriptedCPU is a sampler that always reads cpu.
func scriptedCPU(cpu float64) cpugate.Sampler {
	return cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		return cpugate.Reading{CPU: cpu, Source: "scripted"}, nil
	})
}

// startServer runs a server on a free loopback port, with the test tenants,
// ten SKUs of five units each and a calm CPU, changed by the options, until
// the test ends.
func startServer(t *testing.T, opts ...func(*serverConfig)) (*server, context.CancelFunc) {
	t.Helper()
	cfg := serverConfig{
		Addr:         "127.0.0.1:0",
		ConfigPath:   testdata(t, "test-tenants.yaml"),
		Cost:         50 * time.Microsecond,
		SKUs:         10,
		Units:        5,
		sampler:      scriptedCPU(0.1),
		gateInterval: 20 * time.Millisecond,
		burner:       testBurner(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := newServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.run(ctx, 5*time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run() = %v, want nil after a stop", err)
		}
	})
	return srv, cancel
}

// roomyCtrl configures an overload controller for the tests that count
// what else sheds: room for 64 calls at once and an hour's worth of calls
// waiting, so that a stall of a shared test machine, piling up arrivals,
// cannot make the controller shed.
var roomyCtrl = []overload.Option{overload.WithLimits(64, 0), overload.WithQueueTarget(time.Hour)}

// dial returns a client connection to srv without a retry policy, so the
// tests see every rejection.
func dial(t *testing.T, srv *server) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(srv.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), apiKeyHeader, key)
}

func TestInventoryCalls(t *testing.T) {
	srv, _ := startServer(t)
	client := inventoryv1.NewInventoryClient(dial(t, srv))
	ctx := withKey("demo-key-ops") // unlimited

	res, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{Sku: "sku-00003", Quantity: 2})
	if err != nil {
		t.Fatalf("Allocate = %v", err)
	}
	want := &inventoryv1.AllocateResponse{
		AllocationId: "sku-00003-1",
		Level:        &inventoryv1.StockLevel{Sku: "sku-00003", Available: 3, Allocated: 2, Version: 1},
	}
	if diff := cmp.Diff(want, res, protocmp.Transform()); diff != "" {
		t.Errorf("Allocate (-want +got):\n%s", diff)
	}

	got, err := client.GetStock(ctx, &inventoryv1.GetStockRequest{Sku: "sku-00003"})
	if err != nil {
		t.Fatalf("GetStock = %v", err)
	}
	if diff := cmp.Diff(want.Level, got.GetLevel(), protocmp.Transform()); diff != "" {
		t.Errorf("GetStock (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		req  *inventoryv1.AllocateRequest
		want codes.Code
	}{
		{"more than available", &inventoryv1.AllocateRequest{Sku: "sku-00003", Quantity: 4}, codes.FailedPrecondition},
		{"unknown sku", &inventoryv1.AllocateRequest{Sku: "sku-99999", Quantity: 1}, codes.NotFound},
		{"empty sku", &inventoryv1.AllocateRequest{Quantity: 1}, codes.InvalidArgument},
		{"zero quantity", &inventoryv1.AllocateRequest{Sku: "sku-00003"}, codes.InvalidArgument},
	} {
		if _, err := client.Allocate(ctx, tc.req); status.Code(err) != tc.want {
			t.Errorf("Allocate(%s) = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := client.GetStock(ctx, &inventoryv1.GetStockRequest{Sku: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetStock(unknown) = %v, want NotFound", err)
	}
}

func TestWatchStock(t *testing.T) {
	srv, _ := startServer(t)
	client := inventoryv1.NewInventoryClient(dial(t, srv))
	ctx, cancel := context.WithCancel(withKey("demo-key-ops"))
	defer cancel()

	stream, err := client.WatchStock(ctx, &inventoryv1.WatchStockRequest{Sku: "sku-00001", MinIntervalMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("first Recv = %v", err)
	}
	if got, want := first.GetVersion(), uint64(0); got != want {
		t.Errorf("first update version = %d, want %d", got, want)
	}
	if _, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{Sku: "sku-00001", Quantity: 1}); err != nil {
		t.Fatal(err)
	}
	next, err := stream.Recv()
	if err != nil {
		t.Fatalf("second Recv = %v", err)
	}
	want := &inventoryv1.StockLevel{Sku: "sku-00001", Available: 4, Allocated: 1, Version: 1}
	if diff := cmp.Diff(want, next, protocmp.Transform()); diff != "" {
		t.Errorf("update after Allocate (-want +got):\n%s", diff)
	}
}

func TestShutdownEndsWatchers(t *testing.T) {
	srv, stop := startServer(t)
	client := inventoryv1.NewInventoryClient(dial(t, srv))
	stream, err := client.WatchStock(withKey("demo-key-ops"), &inventoryv1.WatchStockRequest{Sku: "sku-00002"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	stop() // the cleanup then waits for run to return
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("Recv after shutdown = %v, want Unavailable", err)
	}
}

func TestHealthAndReflection(t *testing.T) {
	srv, _ := startServer(t)
	conn := dial(t, srv)
	// No API key: health checks and reflection are exempt from limiting,
	// whatever the anonymous quota.
	health := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "inventory.v1.Inventory"} {
		res, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("Check(%q) = %v", svc, err)
		}
		if got, want := res.GetStatus(), healthpb.HealthCheckResponse_SERVING; got != want {
			t.Errorf("Check(%q) = %v, want %v", svc, got, want)
		}
	}

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	res, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	var names []string
	for _, s := range res.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"inventory.v1.Inventory", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, want %s among them", names, want)
		}
	}
}

// The server rejects a tenant over its quota with the middleware's signals,
// which the load generator classifies as quota shedding, with its buckets in
// memory or on Redis.
func TestQuotaRejection(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testQuotaRejection(t) })
	t.Run("redis", func(t *testing.T) {
		rs := redistest.Start(t)
		testQuotaRejection(t, func(c *serverConfig) { c.Redis = rs.Addr })
	})
}

func testQuotaRejection(t *testing.T, opts ...func(*serverConfig)) {
	srv, _ := startServer(t, opts...)
	client := inventoryv1.NewInventoryClient(dial(t, srv))
	// The noisy tenant's bucket holds 10 (test-tenants.yaml): 40 calls in a
	// row cannot all pass, however slow the machine.
	var rejected error
	var trailer metadata.MD
	for range 40 {
		var tr metadata.MD
		_, err := client.GetStock(withKey("demo-key-noisy"), &inventoryv1.GetStockRequest{Sku: "sku-00000"}, grpc.Trailer(&tr))
		if err != nil {
			rejected, trailer = err, tr
			break
		}
	}
	if rejected == nil {
		t.Fatal("40 calls over a burst of 10: none rejected")
	}
	if got, want := loadgen.Classify(rejected), loadgen.OutcomeQuota; got != want {
		t.Errorf("loadgen.Classify(%v) = %v, want %v", rejected, got, want)
	}
	var info *errdetails.ErrorInfo
	for _, d := range status.Convert(rejected).Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	// The reason is the wire contract a client sees, so the test spells it
	// out rather than naming the middleware's constant.
	if info == nil || info.GetReason() != "RATE_LIMITED" {
		t.Errorf("rejection details %v, want an ErrorInfo with reason RATE_LIMITED", status.Convert(rejected).Details())
	}
	if len(trailer.Get("grpc-retry-pushback-ms")) != 1 {
		t.Errorf("trailer %v, want one grpc-retry-pushback-ms", trailer)
	}
}

func TestProbeCapacity(t *testing.T) {
	srv, _ := startServer(t, func(c *serverConfig) { c.Units = 1e9 })
	p, err := loadgen.ProbeCapacity(context.Background(), srv.addr(), "demo-key-ops", srv.skus[0], 2, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if p.Capacity <= 0 || p.Callers != 2 {
		t.Errorf("probeCapacity = %+v, want a positive capacity from 2 callers", p)
	}
	// The unlimited tenant was never limited while probing.
	if st := srv.counts.load(); st.Quota+st.Overload+st.Tap != 0 {
		t.Errorf("limiter counts %+v after probing, want no rejection", st)
	}
	// A tenant with a quota is limited: the probe reports the rejection.
	if _, err := loadgen.ProbeCapacity(context.Background(), srv.addr(), "demo-key-noisy", srv.skus[0], 2, 300*time.Millisecond); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("probeCapacity with a limited key = %v, want ResourceExhausted", err)
	}
}

// An allocation whose caller has gone does no work and takes no stock.
func TestAllocateStopsForAGoneCaller(t *testing.T) {
	inv := newInventory(skuNames(1), 5, time.Hour, testBurner())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := inv.Allocate(ctx, &inventoryv1.AllocateRequest{Sku: "sku-00000", Quantity: 1}); status.Code(err) != codes.Canceled {
		t.Errorf("Allocate(cancelled) = %v, want Canceled", err)
	}
	level, _ := inv.skus["sku-00000"].snapshot()
	if got, want := level.GetAvailable(), int64(5); got != want {
		t.Errorf("available after a cancelled Allocate = %d, want %d", got, want)
	}
}

// The default server sheds with the overload controller: the CPU gate runs,
// but its scale reaches no quota, and a call that finds every one of the
// controller's slots taken is shed with the overload status.
func TestDefaultServerUsesTheOverloadController(t *testing.T) {
	// A saturated CPU: the gate cuts its scale at its first reading, which
	// it has observed once the sampler is called a second time.
	var samples atomic.Int32
	observed := make(chan struct{})
	hot := cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		if samples.Add(1) == 2 {
			close(observed)
		}
		return cpugate.Reading{CPU: 1, Source: "scripted"}, nil
	})
	srv, _ := startServer(t, func(c *serverConfig) {
		c.sampler = hot
		// The default concurrency limit, with places for 100 ms of calls
		// and waits of up to 200 ms: a stall of the machine must not shed
		// the calls this test counts, and the call below that finds every
		// slot taken is shed soon.
		c.ctrlOpts = []overload.Option{overload.WithQueueTarget(100 * time.Millisecond)}
	})
	if srv.ctrl == nil || srv.cfg.Policy != policyOverload {
		t.Fatalf("default server: policy %q, controller %v; want the overload controller", srv.cfg.Policy, srv.ctrl)
	}
	<-observed
	if got := srv.gate.Scale(); got >= 1 {
		t.Fatalf("gate scale %v after a saturated reading, want below 1", got)
	}
	client := inventoryv1.NewInventoryClient(dial(t, srv))

	// The noisy tenant's whole burst of 10 passes, unscaled; then its quota
	// rejects it, with RESOURCE_EXHAUSTED, never the overload status.
	req := &inventoryv1.GetStockRequest{Sku: "sku-00000"}
	for i := range 10 {
		if _, err := client.GetStock(withKey("demo-key-noisy"), req); err != nil {
			t.Fatalf("noisy call %d of its burst of 10 = %v, want OK: the gate scaled the quota", i+1, err)
		}
	}
	var rejected error
	for range 40 {
		if _, err := client.GetStock(withKey("demo-key-noisy"), req); err != nil {
			rejected = err
			break
		}
	}
	if got, want := loadgen.Classify(rejected), loadgen.OutcomeQuota; got != want {
		t.Errorf("noisy tenant past its burst: %v (%v), want %v", rejected, got, want)
	}

	// Take every slot of the controller: a tenant's call then waits for
	// one, in vain, and is shed once its longest wait is over. Nothing
	// releases a slot meanwhile, so the outcome does not depend on timing.
	ctx := context.Background()
	var held []overload.Permit
	release := func() {
		for _, p := range held {
			p.Done()
		}
		held = nil
	}
	t.Cleanup(release)
	for s := srv.ctrl.Snapshot(); s.Inflight < max(1, int(s.Limit)); s = srv.ctrl.Snapshot() {
		p, err := srv.ctrl.Acquire(ctx, overload.Flow{Key: "test-holder"})
		if err != nil {
			t.Fatalf("Acquire with free slots = %v", err)
		}
		held = append(held, p)
	}
	callCtx, cancel := context.WithTimeout(withKey("demo-key-acme"), time.Minute)
	defer cancel()
	var trailer metadata.MD
	_, err := client.GetStock(callCtx, req, grpc.Trailer(&trailer))
	if got, want := status.Code(err), codes.Unavailable; got != want {
		t.Fatalf("call with every slot taken = %v, want %v", err, want)
	}
	if got, want := loadgen.Classify(err), loadgen.OutcomeOverload; got != want {
		t.Errorf("loadgen.Classify(%v) = %v, want %v", err, got, want)
	}
	var info *errdetails.ErrorInfo
	for _, d := range status.Convert(err).Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.GetReason() != "OVERLOADED" {
		t.Errorf("rejection details %v, want an ErrorInfo with reason OVERLOADED", status.Convert(err).Details())
	}
	if len(trailer.Get("grpc-retry-pushback-ms")) != 1 {
		t.Errorf("trailer %v, want one grpc-retry-pushback-ms", trailer)
	}
	if got := srv.ctrl.Snapshot().ShedTotal(); got != 1 {
		t.Errorf("controller shed %d calls, want 1", got)
	}
	if st := srv.counts.load(); st.Overload != 1 {
		t.Errorf("limiter counts %+v, want 1 call shed by the controller", st)
	}

	// Slots free again: the same call is served.
	release()
	if _, err := client.GetStock(withKey("demo-key-acme"), req); err != nil {
		t.Errorf("call with free slots = %v, want OK", err)
	}
}

// The gate policies keep the gate's scale on the quotas, and no controller.
func TestGatePolicyServer(t *testing.T) {
	for _, policy := range []string{policyAdaptive, policyFixed} {
		t.Run(policy, func(t *testing.T) {
			srv, _ := startServer(t, func(c *serverConfig) { c.Policy = policy })
			if srv.ctrl != nil {
				t.Errorf("policy %s: a controller, want none", policy)
			}
		})
	}
	if _, err := newServer(serverConfig{ConfigPath: testdata(t, "test-tenants.yaml"), Policy: "nope"}); err == nil {
		t.Error("newServer with policy nope = nil error, want one")
	}
}
