package promfloodgate

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/floodgate-go/floodgate/tenant"
)

// TestConfigLoadMetrics scrapes the config load series over HTTP as a
// Prometheus server would, before any load, after a good one and after a
// bad one.
func TestConfigLoadMetrics(t *testing.T) {
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	pr := prometheus.NewPedanticRegistry()
	pr.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(pr, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	scrape := func() string {
		t.Helper()
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape: %d %v", resp.StatusCode, err)
		}
		return string(b)
	}
	expect := func(step, body string, lines ...string) {
		t.Helper()
		for _, l := range lines {
			if !strings.Contains(body, "\n"+l+"\n") {
				t.Errorf("%s: scrape lacks %q:\n%s", step, l, body)
			}
		}
	}

	expect("before any load", scrape(),
		`floodgate_config_loads_total{outcome="applied"} 0`,
		`floodgate_config_loads_total{outcome="rejected"} 0`,
		`floodgate_config_loaded_timestamp_seconds 0`)

	path := filepath.Join(t.TempDir(), "tenants.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tiers: {free: {default: {rate: 10, burst: 20}}}\ntenants: {acme: {tier: free}}\n")
	if err := reg.Load(path); err != nil {
		t.Fatal(err)
	}
	at := reg.Stats().LoadedAt
	stamp := `floodgate_config_loaded_timestamp_seconds ` + strconv.FormatFloat(float64(at.UnixNano())/1e9, 'g', -1, 64)
	expect("after a good load", scrape(),
		`floodgate_config_loads_total{outcome="applied"} 1`,
		`floodgate_config_loads_total{outcome="rejected"} 0`,
		stamp)

	write("tenants: {acme: {tier: gold}}\n")
	if err := reg.Load(path); err == nil {
		t.Fatal("Load(bad) = nil")
	}
	expect("after a bad load", scrape(),
		`floodgate_config_loads_total{outcome="applied"} 1`,
		`floodgate_config_loads_total{outcome="rejected"} 1`,
		stamp)
}
