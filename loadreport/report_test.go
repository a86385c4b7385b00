package loadreport_test

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	v3orcaservicegrpc "github.com/cncf/xds/go/xds/service/orca/v3"
	v3orcaservicepb "github.com/cncf/xds/go/xds/service/orca/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/loadreport"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time             { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration)    { c.ns.Add(int64(d)) }
func newFakeClock() *fakeClock                  { c := &fakeClock{}; c.ns.Store(time.Unix(1e9, 0).UnixNano()); return c }
func (c *fakeClock) clock() floodgate.ClockFunc { return c.Now }

// gatedInventory is an inventory service whose Allocate waits until its
// gate is open (or its context ends), so a test can hold slots.
type gatedInventory struct {
	inventoryv1.UnimplementedInventoryServer
	gate    chan struct{}
	started chan struct{}
}

func (s *gatedInventory) Allocate(ctx context.Context, _ *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	select {
	case s.started <- struct{}{}:
	default:
	}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &inventoryv1.AllocateResponse{}, nil
}

// serve starts lim and rep in front of svc on a loopback port and returns
// a client connection to it.
func serve(t *testing.T, lim *middleware.Limiter, rep *loadreport.Reporter, svc inventoryv1.InventoryServer) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(append(lim.ServerOptions(), rep.ServerOptions()...)...)
	inventoryv1.RegisterInventoryServer(srv, svc)
	if err := rep.Register(srv); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// oneSlot serves a gated inventory behind a controller of one slot and a
// Reporter of it (no CPU, and opts), and returns the controller, the
// service and a connection to the server.
func oneSlot(t *testing.T, opts ...loadreport.Option) (*overload.Controller, *gatedInventory, *grpc.ClientConn) {
	t.Helper()
	ctrl, err := overload.New(overload.WithLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.NewOverload(middleware.WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := loadreport.New(lim.Overload(), append([]loadreport.Option{loadreport.WithSampler(nil)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	svc := &gatedInventory{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	return ctrl, svc, serve(t, lim, rep, svc)
}

// trailerReport decodes the ORCA report in a call's trailer.
func trailerReport(t *testing.T, md metadata.MD) *v3orcapb.OrcaLoadReport {
	t.Helper()
	vs := md.Get("endpoint-load-metrics-bin")
	if len(vs) != 1 {
		t.Fatalf("trailer has %d load reports, want 1 (trailer %v)", len(vs), md)
	}
	var r v3orcapb.OrcaLoadReport
	if err := proto.Unmarshal([]byte(vs[0]), &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestTrailerReportsRates drives admitted and shed calls through a real
// server, moves the reporter's clock by a second, and checks the next
// call's trailer: QPS and EPS are the second's counts, weighted by one
// step of the half-second moving average, and the named metrics are the
// controller's.
func TestTrailerReportsRates(t *testing.T) {
	clk := newFakeClock()
	ctrl, svc, cc := oneSlot(t, loadreport.WithClock(clk.clock()))
	client := inventoryv1.NewInventoryClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// One call holds the only slot; more than the queue holds then arrive
	// together, and the controller sheds what it has no place for.
	var wg sync.WaitGroup
	var shedSeen atomic.Int64
	call := func() {
		defer wg.Done()
		_, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{})
		if status.Code(err) == codes.Unavailable {
			shedSeen.Add(1)
		} else if err != nil {
			t.Error(err)
		}
	}
	wg.Add(1)
	go call()
	<-svc.started
	for range 12 {
		wg.Add(1)
		go call()
	}
	deadline := time.Now().Add(10 * time.Second)
	for s := ctrl.Snapshot(); s.ShedTotal() == 0 || int(s.ShedTotal())+s.Queued+s.Inflight < 13; s = ctrl.Snapshot() {
		if time.Now().After(deadline) {
			t.Fatalf("the controller shed nothing: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	close(svc.gate)
	wg.Wait()
	s := ctrl.Snapshot()
	if s.ShedTotal() == 0 || s.ShedTotal() != uint64(shedSeen.Load()) {
		t.Fatalf("controller shed %d, clients saw %d UNAVAILABLE", s.ShedTotal(), shedSeen.Load())
	}

	clk.Advance(time.Second)
	var tr metadata.MD
	if _, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{}, grpc.Trailer(&tr)); err != nil {
		t.Fatal(err)
	}
	r := trailerReport(t, tr)
	w := 1 - math.Exp(-2) // one second of a half-second moving average
	// The report is rebuilt as the call ends: it counts itself.
	admitted := float64(ctrl.Snapshot().Admitted)
	if want := w * admitted; math.Abs(r.RpsFractional-want) > 1e-9 {
		t.Errorf("QPS %v, want %v (%v admitted in a second)", r.RpsFractional, want, admitted)
	}
	if want := w * float64(s.ShedTotal()); math.Abs(r.Eps-want) > 1e-9 {
		t.Errorf("EPS %v, want %v (%d shed in a second)", r.Eps, want, s.ShedTotal())
	}
	if r.NamedMetrics["floodgate.limit"] != 1 {
		t.Errorf("floodgate.limit %v, want the controller's 1", r.NamedMetrics["floodgate.limit"])
	}
	if r.CpuUtilization != 0 {
		t.Errorf("CPU %v reported with WithSampler(nil)", r.CpuUtilization)
	}

	// Within the interval, calls carry the same report.
	var tr2 metadata.MD
	if _, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{}, grpc.Trailer(&tr2)); err != nil {
		t.Fatal(err)
	}
	if r2 := trailerReport(t, tr2); !proto.Equal(r, r2) {
		t.Errorf("report changed within its interval: %v, then %v", r, r2)
	}
}

// TestUtilizationIsLittlesLaw checks the application utilization against
// the controller's own numbers: admitted calls per second times their mean
// service time, over the limit, so that the balancer's weight (QPS over
// utilization) is the limit over the service time.
func TestUtilizationIsLittlesLaw(t *testing.T) {
	ctrl, err := overload.New(overload.WithLimits(4, 4))
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	rep, err := loadreport.New(ctrl, loadreport.WithClock(clk.clock()), loadreport.WithSampler(nil))
	if err != nil {
		t.Fatal(err)
	}
	// 64 calls of about 2 ms, enough for the controller's first steps.
	f := overload.Flow{Key: "a", Weight: 1}
	for range 64 {
		ctx, in := ctrl.Enter(context.Background(), f)
		if !in {
			t.Fatal("Enter turned a call away on an idle controller")
		}
		p, err := ctrl.Acquire(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		p.Done()
	}
	clk.Advance(time.Second)
	m := rep.ServerMetrics()
	s := ctrl.Snapshot()
	if s.Latency <= 0 {
		t.Fatalf("no step taken after 64 calls: %+v", s)
	}
	want := m.QPS * s.Latency.Seconds() / s.Limit
	if m.AppUtilization <= 0 || math.Abs(m.AppUtilization-want) > 1e-9 {
		t.Errorf("application utilization %v, want QPS %v × latency %v / limit %v = %v", m.AppUtilization, m.QPS, s.Latency, s.Limit, want)
	}
	if weight, capacity := m.QPS/m.AppUtilization, s.Limit/s.Latency.Seconds(); math.Abs(weight-capacity) > 1e-6*capacity {
		t.Errorf("balancer weight %v, want the limit over the service time, %v", weight, capacity)
	}
	if m.CPUUtilization != -1 {
		t.Errorf("CPU %v, want unset (-1) with WithSampler(nil)", m.CPUUtilization)
	}
}

// TestCPUFromSampler checks that the report carries the sampler's reading.
func TestCPUFromSampler(t *testing.T) {
	ctrl, err := overload.New()
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	s := cpugate.SamplerFunc(func() (cpugate.Reading, error) { return cpugate.Reading{CPU: 0.625}, nil })
	rep, err := loadreport.New(ctrl, loadreport.WithClock(clk.clock()), loadreport.WithSampler(s))
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.ServerMetrics().CPUUtilization; got != 0.625 {
		t.Errorf("CPU %v, want the sampler's 0.625", got)
	}
	failing := cpugate.SamplerFunc(func() (cpugate.Reading, error) { return cpugate.Reading{}, errors.New("no reading") })
	rep, err = loadreport.New(ctrl, loadreport.WithClock(clk.clock()), loadreport.WithSampler(failing))
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.ServerMetrics().CPUUtilization; got != 0 {
		t.Errorf("CPU %v after a failed reading, want 0 (no reading yet)", got)
	}
}

// TestOutOfBandThroughOverload opens ORCA's stream through a Limiter whose
// only slot is held and whose queue is full: the service is exempt, so a
// loaded server still reports.
func TestOutOfBandThroughOverload(t *testing.T) {
	ctrl, svc, cc := oneSlot(t, loadreport.WithInterval(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(svc.gate)
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inventoryv1.NewInventoryClient(cc).Allocate(ctx, &inventoryv1.AllocateRequest{})
		}()
	}
	for ctrl.Snapshot().ShedTotal() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the controller shed nothing")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(2 * time.Millisecond) // the report is due again
	stream, err := v3orcaservicegrpc.NewOpenRcaServiceClient(cc).StreamCoreMetrics(ctx, &v3orcaservicepb.OrcaLoadReportRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatalf("ORCA's stream on an overloaded server: %v", err)
	}
	if r.NamedMetrics["floodgate.limit"] != 1 || r.NamedMetrics["floodgate.inflight"] != 1 {
		t.Errorf("out-of-band report %v, want the controller's limit and inflight, 1 and 1", r)
	}
}

func TestNewRejects(t *testing.T) {
	ctrl, err := overload.New()
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() (*loadreport.Reporter, error){
		"nil controller": func() (*loadreport.Reporter, error) { return loadreport.New(nil) },
		"zero interval":  func() (*loadreport.Reporter, error) { return loadreport.New(ctrl, loadreport.WithInterval(0)) },
		"negative interval": func() (*loadreport.Reporter, error) {
			return loadreport.New(ctrl, loadreport.WithInterval(-time.Second))
		},
	} {
		if _, err := f(); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("%s: error %v, want ErrInvalidOption", name, err)
		}
	}
}
