package otelfloodgate_test

import (
	"context"
	"fmt"
	"log"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/otelfloodgate"
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
	// A real server builds its Limiter with
	// middleware.New(store, tables, middleware.WithObserver(rec.Observer()))
	// and then calls rec.SetLimiter; here the observer is called directly.
	observe := rec.Observer()
	observe(middleware.Event{Method: "/inventory.v1.Inventory/Get", Tier: "pro", Allowed: true})
	observe(middleware.Event{Method: "/inventory.v1.Inventory/Get", Tier: "free", Reason: middleware.ReasonQuota})
	observe(middleware.Event{Method: "/made.up/Method", Reason: middleware.ReasonQuota})

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
	// admitted admitted OK tier=pro method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=free method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=none method=other: 1
}
