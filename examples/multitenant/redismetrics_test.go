package main

import (
	"testing"

	"github.com/floodgate-go/floodgate/internal/redistest"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// TestRedisMetrics serves with buckets on Redis and metrics on: /metrics
// has the Redis store's round trips and breaker state, beside the Limiter's
// decisions by the source that made them.
func TestRedisMetrics(t *testing.T) {
	rs := redistest.Start(t)
	srv, _ := startServer(t, func(c *serverConfig) {
		c.Redis = rs.Addr
		c.Metrics = "127.0.0.1:0"
	})
	client := inventoryv1.NewInventoryClient(dial(t, srv))
	const calls = 5
	for range calls {
		if _, err := client.GetStock(withKey("demo-key-noisy"), &inventoryv1.GetStockRequest{Sku: "sku-00001"}); err != nil {
			t.Fatal(err)
		}
	}
	ss := scrape(t, "http://"+srv.obs.addr()+metricsPath)
	// Redis or, should a call miss its deadline on a loaded machine, the
	// fallback decided each call: one round trip each either way.
	trips := sum(ss, "floodgate_redis_call_duration_seconds_count", nil)
	fallbacks := sum(ss, "floodgate_decisions_total", map[string]string{"source": "fallback"})
	if decided := sum(ss, "floodgate_decisions_total", map[string]string{"source": "redis"}) + fallbacks; decided != calls || trips != calls {
		t.Errorf("%v decisions in %v round trips for %d calls, want %d of each", decided, trips, calls, calls)
	}
	if got := sum(ss, "floodgate_redis_call_errors_total", nil); got != sum(ss, "floodgate_redis_call_duration_seconds_count", map[string]string{"outcome": "error"}) {
		t.Errorf("%v errors by kind, %v failed round trips", got, sum(ss, "floodgate_redis_call_duration_seconds_count", map[string]string{"outcome": "error"}))
	}
	if got := sum(ss, "floodgate_redis_breaker_state", nil); got != 1 {
		t.Errorf("floodgate_redis_breaker_state sums to %v over states, want 1", got)
	}
	if got := sum(ss, "floodgate_redis_fallback_decisions_total", nil); got != fallbacks {
		t.Errorf("floodgate_redis_fallback_decisions_total = %v, want the %v decisions of source fallback", got, fallbacks)
	}
}
