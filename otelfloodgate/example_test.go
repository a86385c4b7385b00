package otelfloodgate_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/otelfloodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

func Example() {
	// A service's meter provider; here, one read on demand.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	store, err := keyed.New()
	if err != nil {
		log.Fatal(err)
	}
	// The Recorder exists first: the Limiter reports to its observer.
	rec, err := otelfloodgate.New(mp,
		otelfloodgate.WithMethods("/inventory.v1.Inventory/Get"),
		otelfloodgate.WithKeyed(store),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer rec.Close()
	// Every address gets one call, and one more a second.
	tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 1}}})
	if err != nil {
		log.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(tbl), middleware.WithObserver(rec.Observer()))
	if err != nil {
		log.Fatal(err)
	}
	// A server installs lim.ServerOptions(); here its interceptor is
	// called directly, three times from one address.
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 4242}})
	handler := func(context.Context, any) (any, error) { return "ok", nil }
	for _, method := range []string{"/inventory.v1.Inventory/Get", "/inventory.v1.Inventory/Get", "/made.up/Method"} {
		_, _ = lim.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, handler)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "floodgate.decisions" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				get := func(k string) string { v, _ := dp.Attributes.Value(attribute.Key(k)); return v.AsString() }
				lines = append(lines, fmt.Sprintf("%s %s %s tier=%s method=%s: %d",
					get("outcome"), get("reason"), get("code"), get("tier"), get("method"), dp.Value))
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// admitted admitted OK tier=none method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=none method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=none method=other: 1
}
