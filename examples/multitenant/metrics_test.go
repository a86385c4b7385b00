package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/promfloodgate"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// series is one sample of a scrape: its name, labels and value.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape fetches url and parses the text exposition format's samples.
func scrape(t *testing.T, url string) []series {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	var out []series
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		s := series{name: line[:sp], labels: map[string]string{}, value: v}
		if i := strings.IndexByte(s.name, '{'); i >= 0 {
			for _, kv := range strings.Split(strings.TrimSuffix(s.name[i+1:], "}"), ",") {
				k, val, _ := strings.Cut(kv, "=")
				s.labels[k], _ = strconv.Unquote(val)
			}
			s.name = s.name[:i]
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sum adds the samples of name whose labels include match.
func sum(ss []series, name string, match map[string]string) float64 {
	total := 0.0
next:
	for _, s := range ss {
		if s.name != name {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		total += s.value
	}
	return total
}

// TestMetricsUnderLoad puts a short, bounded load on a server with metrics
// on: an unlimited tenant and the noisy tenant far over its burst of 10.
// The scrape must count exactly what the clients saw.
func TestMetricsUnderLoad(t *testing.T) {
	srv, _ := startServer(t, func(c *serverConfig) {
		c.Metrics = "127.0.0.1:0"
		// This test counts quota rejections: a stalled machine must not
		// turn one into an overload rejection.
		c.ctrlOpts = roomyCtrl
	})
	client := inventoryv1.NewInventoryClient(dial(t, srv))
	const (
		workers  = 4
		perCall  = 30
		getStock = "/inventory.v1.Inventory/GetStock"
	)
	var (
		mu     sync.Mutex
		byCode = map[string]map[codes.Code]int{}
		wg     sync.WaitGroup
	)
	keys := []string{"demo-key-ops", "demo-key-noisy"}
	// Every map is made before any caller starts: the callers only read
	// byCode itself, under mu.
	for _, key := range keys {
		byCode[key] = map[codes.Code]int{}
	}
	for _, key := range keys {
		for range workers {
			wg.Go(func() {
				for range perCall {
					_, err := client.GetStock(withKey(key), &inventoryv1.GetStockRequest{Sku: "sku-00001"})
					mu.Lock()
					byCode[key][status.Code(err)]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	ops, noisy := byCode["demo-key-ops"], byCode["demo-key-noisy"]
	if ops[codes.OK] != workers*perCall {
		t.Fatalf("ops tenant: %v, want %d OK", ops, workers*perCall)
	}
	if noisy[codes.OK]+noisy[codes.ResourceExhausted] != workers*perCall || noisy[codes.ResourceExhausted] == 0 {
		t.Fatalf("noisy tenant: %v, want OK and RESOURCE_EXHAUSTED only, some rejected", noisy)
	}

	// The sampler's source is known from the gate's first reading on.
	for srv.gate.Snapshot().At.IsZero() {
		time.Sleep(5 * time.Millisecond)
	}
	ss := scrape(t, "http://"+srv.obs.addr()+metricsPath)
	for _, tc := range []struct {
		name  string
		match map[string]string
		want  int
	}{
		{"admitted", map[string]string{"outcome": "admitted"}, ops[codes.OK] + noisy[codes.OK]},
		{"admitted internal", map[string]string{"outcome": "admitted", "tier": "internal", "method": getStock, "code": "OK", "reason": "admitted", "stage": "interceptor"}, ops[codes.OK]},
		{"admitted bulk", map[string]string{"outcome": "admitted", "tier": "bulk", "method": getStock}, noisy[codes.OK]},
		{"rejected", map[string]string{"outcome": "rejected"}, noisy[codes.ResourceExhausted]},
		{"rejected quota", map[string]string{"outcome": "rejected", "reason": "quota", "code": "ResourceExhausted", "tier": "bulk", "method": getStock, "stage": "interceptor"}, noisy[codes.ResourceExhausted]},
	} {
		if got := sum(ss, "floodgate_decisions_total", tc.match); got != float64(tc.want) {
			t.Errorf("floodgate_decisions_total %s = %g, want %d", tc.name, got, tc.want)
		}
	}
	if got := sum(ss, "floodgate_config_loads_total", map[string]string{"outcome": "applied"}); got != 1 {
		t.Errorf("floodgate_config_loads_total{outcome=applied} = %g, want 1", got)
	}
	if got := sum(ss, "go_goroutines", nil); got < 1 {
		t.Errorf("go_goroutines = %g, want the Go collector's series", got)
	}
	if got := sum(ss, "go_sched_latencies_seconds_count", nil); got < 1 {
		t.Errorf("go_sched_latencies_seconds_count = %g, want the scheduler's histogram", got)
	}
	for _, name := range []string{"floodgate_tap_rejections_total", "floodgate_keyed_evictions_total", "floodgate_keyed_overflowed_total"} {
		if got := sum(ss, name, nil); got != 0 {
			t.Errorf("%s = %g, want 0", name, got)
		}
	}
	// The noisy tenant's bucket; the unlimited tenant keeps none.
	if got := sum(ss, "floodgate_keyed_keys", nil); got != 1 {
		t.Errorf("floodgate_keyed_keys = %g, want 1", got)
	}
	if got := sum(ss, "floodgate_gate_state", map[string]string{"state": "open"}); got != 1 {
		t.Errorf("floodgate_gate_state{state=open} = %g, want 1", got)
	}
	if got := sum(ss, "floodgate_gate_scale", nil); got != 1 {
		t.Errorf("floodgate_gate_scale = %g, want 1", got)
	}
	if got := sum(ss, "floodgate_gate_sampler_info", map[string]string{"source": "scripted"}); got != 1 {
		t.Errorf("floodgate_gate_sampler_info{source=scripted} = %g, want 1", got)
	}
	// Every admitted call took one of the overload controller's slots.
	if got, want := sum(ss, "floodgate_overload_admitted_total", nil), ops[codes.OK]+noisy[codes.OK]; got != float64(want) {
		t.Errorf("floodgate_overload_admitted_total = %g, want %d", got, want)
	}
	if got := sum(ss, "floodgate_overload_shed_total", nil); got != 0 {
		t.Errorf("floodgate_overload_shed_total = %g, want 0", got)
	}
	for _, s := range ss {
		if strings.Contains(s.labels["method"], "demo-key") || strings.Contains(s.labels["tier"], "demo-key") {
			t.Errorf("a key leaked into a label: %v", s)
		}
	}

	// The offenders list the noisy tenant alone, by the tenant its calls
	// were charged to, with its exact count (fewer keys than the summary
	// holds).
	resp, err := http.Get("http://" + srv.obs.addr() + offendersPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Total     uint64
		Hashed    bool
		Offenders []promfloodgate.Offender
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	want := []promfloodgate.Offender{{Key: "t:noisy", Rejections: uint64(noisy[codes.ResourceExhausted])}}
	if got.Total != uint64(noisy[codes.ResourceExhausted]) || len(got.Offenders) != 1 || got.Offenders[0] != want[0] {
		t.Errorf("offenders = %s, want total %d, %v", body, noisy[codes.ResourceExhausted], want)
	}
	if strings.Contains(string(body), "demo-key") {
		t.Errorf("offenders reveal a key: %s", body)
	}
}

// TestMetricsOff checks the default: no metrics listener.
func TestMetricsOff(t *testing.T) {
	srv, _ := startServer(t)
	if srv.obs != nil {
		t.Errorf("metrics served without cfg.Metrics")
	}
}
