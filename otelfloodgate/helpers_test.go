package otelfloodgate

import (
	"context"
	"log/slog"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	methodGet = "/floodgate.test.Echo/Get"
	goldKey   = "gold-key-0123456789abcdef"
	freeKey   = "free-key-0123456789abcdef"
)

// testTable: acme (tier gold, unlimited), initech (tier free: one call,
// then one per 1000 s), anonymous callers unlimited.
func testTable(t testing.TB) *tenant.Table {
	t.Helper()
	digest := func(k string) string {
		h, err := tenant.HashKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tiers: map[string]tenant.TierSpec{
			"gold": {Default: &tenant.LimitSpec{Rate: math.Inf(1)}},
			"free": {Default: &tenant.LimitSpec{Rate: 1e-3, Burst: 1}},
		},
		Tenants: map[string]tenant.TenantSpec{
			"acme":    {Tier: "gold", Keys: []string{digest(goldKey)}},
			"initech": {Tier: "free", Keys: []string{digest(freeKey)}},
		},
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: math.Inf(1)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// echo serves methodGet; a call whose metadata has "block" waits for a
// token on release.
type echo struct{ release chan struct{} }

var echoDesc = grpc.ServiceDesc{
	ServiceName: "floodgate.test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Get", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(emptypb.Empty)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, _ any) (any, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("block")) > 0 {
				select {
				case <-srv.(*echo).release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return &emptypb.Empty{}, nil
		}
		if icpt == nil {
			return h(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodGet}, h)
	}}},
}

// fixture is a real gRPC server on loopback TCP behind otelgrpc's stats
// handler and a Limiter with an overload controller of one slot, observed
// by a Recorder on an SDK meter provider with a manual reader.
type fixture struct {
	cc      *grpc.ClientConn
	spans   *tracetest.SpanRecorder
	reader  *sdkmetric.ManualReader
	rec     *Recorder
	ctrl    *overload.Controller
	release chan struct{}
}

func newFixture(t *testing.T, queueTarget time.Duration) *fixture {
	t.Helper()
	f := &fixture{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader(), release: make(chan struct{})}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	var err error
	f.ctrl, err = overload.New(overload.WithLimits(1, 1), overload.WithQueueTarget(queueTarget),
		overload.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	f.rec, err = New(mp, WithMethods(methodGet), WithKeyed(store), WithOverload(f.ctrl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.rec.Close() })
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithOverload(f.ctrl),
		middleware.WithObserver(f.rec.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp)))},
		lim.ServerOptions()...)...)
	srv.RegisterService(&echoDesc, &echo{release: f.release})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	f.cc, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.cc.Close()
		srv.Stop()
		wg.Wait()
	})
	return f
}

// call calls methodGet with the API key, blocking in the handler until
// released when block is set.
func (f *fixture) call(key string, block bool) error {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
	if block {
		ctx = metadata.AppendToOutgoingContext(ctx, "block", "1")
	}
	return f.cc.Invoke(ctx, methodGet, &emptypb.Empty{}, &emptypb.Empty{})
}

// async starts f.call and returns where its error will arrive.
func (f *fixture) async(key string, block bool) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f.call(key, block) }()
	return ch
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// collect reads every metric from the reader, by name.
func collect(t *testing.T, r sdkmetric.Reader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// points returns the data points of an int64 sum or gauge, keyed by their
// attributes as "k=v,k=v" (sorted by key), and "" for none.
func points(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	var dps []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		dps = d.DataPoints
	case metricdata.Gauge[int64]:
		dps = d.DataPoints
	default:
		t.Fatalf("%s: %T, want an int64 sum or gauge", m.Name, m.Data)
	}
	out := map[string]int64{}
	for _, dp := range dps {
		out[attrString(dp.Attributes)] = dp.Value
	}
	return out
}

func attrString(s attribute.Set) string {
	var b []byte
	for i, kv := range s.ToSlice() {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, kv.Key...)
		b = append(b, '=')
		b = append(b, kv.Value.Emit()...)
	}
	return string(b)
}

// spanEvents returns the attributes of the events named name on the ended
// spans, one map per event.
func spanEvents(spans []sdktrace.ReadOnlySpan, name string) []map[attribute.Key]attribute.Value {
	var out []map[attribute.Key]attribute.Value
	for _, s := range spans {
		for _, e := range s.Events() {
			if e.Name != name {
				continue
			}
			m := map[attribute.Key]attribute.Value{}
			for _, kv := range e.Attributes {
				m[kv.Key] = kv.Value
			}
			out = append(out, m)
		}
	}
	return out
}

// floatPoints returns the data points of a float64 gauge as points does,
// none for an instrument that observed nothing.
func floatPoints(t *testing.T, m metricdata.Metrics) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	switch d := m.Data.(type) {
	case nil:
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			out[attrString(dp.Attributes)] = dp.Value
		}
	default:
		t.Fatalf("%s: %T, want a float64 gauge", m.Name, m.Data)
	}
	return out
}
