package promfloodgate_test

import (
	"fmt"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/promfloodgate"
)

func Example() {
	store, err := keyed.New()
	if err != nil {
		log.Fatal(err)
	}
	// The collector exists first: the Limiter reports to its observer.
	metrics, err := promfloodgate.New(
		promfloodgate.WithMethods("/inventory.v1.Inventory/Get"),
		promfloodgate.WithKeyed(store),
	)
	if err != nil {
		log.Fatal(err)
	}
	// A real server builds its Limiter with
	// middleware.New(store, tables, middleware.WithObserver(metrics.Observer()))
	// and then calls metrics.SetLimiter; here the observer is called directly.
	observe := metrics.Observer()
	observe(middleware.Event{Method: "/inventory.v1.Inventory/Get", Tier: "pro", Allowed: true})
	observe(middleware.Event{Method: "/inventory.v1.Inventory/Get", Tier: "free", Reason: middleware.ReasonQuota})
	observe(middleware.Event{Method: "/made.up/Method", Reason: middleware.ReasonQuota})

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	offenders, err := promfloodgate.NewOffenders()
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/debug/floodgate/offenders", offenders.Handler())
	// Serve mux on a loopback or operators' port.

	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			fmt.Printf("%s %s %s tier=%s method=%s: %g\n", l["outcome"], l["reason"], l["code"], l["tier"], l["method"], m.GetCounter().GetValue())
		}
	}
	// Output:
	// admitted admitted OK tier=pro method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=free method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=none method=other: 1
}
