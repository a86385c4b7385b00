package promfloodgate_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/promfloodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

func Example() {
	store, err := keyed.New()
	if err != nil {
		log.Fatal(err)
	}
	// The collector and its offenders exist first: the Limiter reports to
	// the collector's observer, which feeds them.
	offenders, err := promfloodgate.NewOffenders()
	if err != nil {
		log.Fatal(err)
	}
	metrics, err := promfloodgate.New(
		promfloodgate.WithMethods("/inventory.v1.Inventory/Get"),
		promfloodgate.WithKeyed(store),
		promfloodgate.WithOffenders(offenders),
	)
	if err != nil {
		log.Fatal(err)
	}
	// Every address gets one call, and one more a second.
	tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1, Burst: 1}}})
	if err != nil {
		log.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(tbl), middleware.WithObserver(metrics.Observer()))
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

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
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
	fmt.Println("rejections of the top offender:", offenders.Top(1)[0].Rejections)
	// Output:
	// admitted admitted OK tier=none method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=none method=/inventory.v1.Inventory/Get: 1
	// rejected quota ResourceExhausted tier=none method=other: 1
	// rejections of the top offender: 2
}
