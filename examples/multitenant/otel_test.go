package main

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// TestOTelMetrics serves with -otel: one scrape of /metrics has the
// decisions as OTel's Prometheus exporter names them (promfloodgate's
// names, with the exporter's scope labels), and the controller's series.
func TestOTelMetrics(t *testing.T) {
	srv, _ := startServer(t, func(c *serverConfig) {
		c.Metrics = "127.0.0.1:0"
		c.OTel = true
		c.ctrlOpts = roomyCtrl
	})
	if srv.obs.otel == nil || srv.obs.metrics != nil {
		t.Fatal("-otel did not replace promfloodgate's collector with otelfloodgate's recorder")
	}
	client := inventoryv1.NewInventoryClient(dial(t, srv))
	rejected := 0
	const calls = 15 // the noisy tenant's burst is 10
	for range calls {
		_, err := client.GetStock(withKey("demo-key-noisy"), &inventoryv1.GetStockRequest{Sku: "sku-00001"})
		switch status.Code(err) {
		case codes.OK:
		case codes.ResourceExhausted:
			rejected++
		default:
			t.Fatal(err)
		}
	}
	ss := scrape(t, "http://"+srv.obs.addr()+metricsPath)
	scope := map[string]string{"otel_scope_name": "github.com/floodgate-go/floodgate/otelfloodgate"}
	if got := sum(ss, "floodgate_decisions_total", scope); got != calls {
		t.Errorf("floodgate_decisions_total sums to %v, want %d", got, calls)
	}
	quota := map[string]string{"reason": "quota", "tier": "bulk", "method": "/inventory.v1.Inventory/GetStock"}
	if got := sum(ss, "floodgate_decisions_total", quota); got != float64(rejected) || rejected == 0 {
		t.Errorf("quota rejections: %v in the scrape, %d seen by the client; want equal and some", got, rejected)
	}
	for _, name := range []string{"floodgate_overload_limit", "floodgate_overload_throughput_per_second", "floodgate_gate_scale_ratio", "floodgate_config_loaded_timestamp_seconds"} {
		if !has(ss, name) {
			t.Errorf("no series %s", name)
		}
	}
}

// has reports whether ss holds a sample of name.
func has(ss []series, name string) bool {
	for _, s := range ss {
		if s.name == name {
			return true
		}
	}
	return false
}
