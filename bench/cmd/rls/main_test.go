package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
	"github.com/floodgate-go/floodgate/internal/redistest"
)

// TestMain lets the test binary be the experiment's null server: the
// tests re-execute it with "null" as its first argument.
func TestMain(m *testing.M) {
	if sub, run, ok := subcommand(os.Args); ok {
		if err := run(os.Args[2:]); err != nil {
			os.Stderr.WriteString("rls " + sub + ": " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// quick runs the quick experiment over loopback, unpinned, with the
// variants given, and checks that every one yields well-formed results
// and that the page renders. It asserts no timings and no figure.
func quick(t *testing.T, variants []string, floodgate, ratelimit string) *Results {
	t.Helper()
	if !redistest.Installed() && slices.ContainsFunc(variants, usesRedis) {
		t.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	cfg := Config{Quick: true, Variants: variants, Perf: true, Accuracy: true, Seed: 1, Lease: 100 * time.Millisecond,
		Exe: []string{exe}, Floodgate: floodgate, Ratelimit: ratelimit, Log: t.Logf}
	res, err := experiment(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for v, why := range res.Unavailable {
		t.Errorf("%s did not run: %s", v, why)
	}
	for _, v := range variants {
		sat := res.saturation(v)
		if len(sat) != 1 {
			t.Errorf("%s: %d saturation measurements, want 1", v, len(sat))
			continue
		}
		m := sat[0]
		if m.Decisions <= 0 || m.ServerCPU <= 0 || m.PerCPUSecond <= 0 || m.P99 <= 0 || m.Callers < 1 {
			t.Errorf("%s: saturation not well-formed: %+v", v, m)
		}
		if got, want := m.RedisCPU > 0, usesRedis(v); want && !got {
			t.Errorf("%s: redis CPU %v, want > 0", v, m.RedisCPU)
		}
		if m.Errors > 0 {
			t.Errorf("%s: %d calls failed", v, m.Errors)
		}
		if m.Fallbacks < 0 {
			t.Errorf("%s: %d fallbacks", v, m.Fallbacks)
		}
	}
	if got, want := len(res.Latency), len(variants); got != want {
		t.Errorf("%d latency measurements, want %d", got, want)
	}
	for _, m := range res.Latency {
		if m.Decisions <= 0 || m.Rate <= 0 {
			t.Errorf("%s: open loop not well-formed: %+v", m.Variant, m)
		}
	}
	var want []string
	for _, v := range variants {
		switch v {
		case vMemory:
			want = append(want, v+" ×1")
		case vRedis, vRatelimit:
			want = append(want, v+" ×1", v+" ×3")
		}
	}
	var got []string
	if res.Accuracy != nil {
		for _, r := range res.Accuracy.Runs {
			got = append(got, fmt.Sprintf("%s ×%d", r.Variant, r.Replicas))
			if len(r.Steady) != accSteadyValues || len(r.Edge) != accEdgeValues {
				t.Errorf("%s ×%d: %d steady and %d edge values", r.Variant, r.Replicas, len(r.Steady), len(r.Edge))
			}
			for _, a := range append(r.Steady, r.Edge...) {
				if a.Offered <= 0 || a.Admitted <= 0 || a.Admitted > a.Offered || a.Allowance <= 0 {
					t.Errorf("%s ×%d %s: offered %d, admitted %d, allowance %v", r.Variant, r.Replicas, a.Value, a.Offered, a.Admitted, a.Allowance)
				}
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("accuracy runs (-want +got):\n%s", diff)
	}

	path := filepath.Join(t.TempDir(), "rls.json")
	if err := writeResults(res, path); err != nil {
		t.Fatal(err)
	}
	back, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	page, err := back.report()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Rate-limit service", "-quick", "## Decisions per CPU-second", "## Latency", "## Accuracy", "| `null` |"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("the page lacks %q", want)
		}
	}
	return res
}

// TestQuick runs the null server and floodgate's variants, which need the
// repository's rls module.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs servers for about 15 s")
	}
	variants := []string{vNull}
	bin, _, err := floodgateBinary(context.Background(), "", t.Logf)
	switch {
	case err == nil:
		variants = append(variants, vMemory, vRedis)
	case errors.Is(err, errSkip):
		t.Logf("floodgate's variants skipped: %v", err)
	default:
		t.Fatal(err)
	}
	quick(t, variants, bin, "off")
}

// TestQuickRatelimit runs envoyproxy/ratelimit, installing it into the
// cache directory when it is missing (about a minute with an empty module
// cache, a few seconds with a warm one).
func TestQuickRatelimit(t *testing.T) {
	if testing.Short() {
		t.Skip("installs envoyproxy/ratelimit and runs it")
	}
	bin, err := ratelimitBinary(context.Background(), "", t.Logf)
	if errors.Is(err, errSkip) {
		t.Skipf("envoyproxy/ratelimit cannot be installed here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	quick(t, []string{vNull, vRatelimit}, "", bin)
}

func TestMix(t *testing.T) {
	a, b := newMix(mixSeed), newMix(mixSeed)
	if diff := cmp.Diff(a.summary, b.summary); diff != "" {
		t.Errorf("two mixes of one seed differ (-a +b):\n%s", diff)
	}
	if a.reqs[12345].String() != b.reqs[12345].String() {
		t.Errorf("request 12345 differs: %v, %v", a.reqs[12345], b.reqs[12345])
	}
	domains := map[string]int{}
	for _, r := range a.reqs {
		domains[r.Domain]++
	}
	if len(domains) != 2 || domains[domainAPI] < mixPool/2 || domains[domainAuth] < mixPool/4 {
		t.Errorf("domains %v", domains)
	}
	if got := a.summary.Buckets; got < 20000 {
		t.Errorf("%d buckets, want many (≥ 20000)", got)
	}
	// The hottest tenant takes a share of the load that puts it over its
	// limit at any throughput a server reaches here.
	hot := map[string]int{}
	for _, r := range a.reqs {
		if r.Domain == domainAPI {
			hot[r.Descriptors[0].Entries[0].Value]++
		}
	}
	top := 0
	for _, n := range hot {
		top = max(top, n)
	}
	if share := float64(top) / mixPool; share < 0.05 {
		t.Errorf("the hottest tenant has %.1f%% of the requests, want ≥ 5%%", 100*share)
	}
}

// TestConfigFiles: each file is YAML with its domain, in the directory
// layout envoyproxy/ratelimit's runtime loader reads.
func TestConfigFiles(t *testing.T) {
	root := t.TempDir()
	dir, err := writeConfig(root, accuracyLimitsFor(false))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, runtimeSubdir, runtimeAppdir); dir != want {
		t.Errorf("config directory %s, want %s", dir, want)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var domains []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Domain      string `yaml:"domain"`
			Descriptors []any  `yaml:"descriptors"`
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if len(doc.Descriptors) == 0 || doc.Domain+".yaml" != filepath.Base(f) {
			t.Errorf("%s: domain %q, %d descriptors", f, doc.Domain, len(doc.Descriptors))
		}
		domains = append(domains, doc.Domain)
	}
	if diff := cmp.Diff([]string{domainAccuracy, domainAPI, domainAuth, domainProbe}, domains); diff != "" {
		t.Errorf("domains (-want +got):\n%s", diff)
	}
}

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		line string
		want float64
		ok   bool
	}{
		{"10131 (cat) R 10088 10088 25431 0 -1 4194304 101 0 0 0 250 31 0 0 20 0 1 0 300878", 2.81, true},
		{"7 (a (b) c) S 1 1 1 0 -1 0 0 0 0 0 100 0 0 0 20 0 1 0 5", 1, true},
		{"7 (cat R 1", 0, false},
		{"7 (cat) R 1 2 3", 0, false},
	} {
		got, err := parseStat([]byte(c.line))
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseStat(%q) = %v, %v, want %v (ok %v)", c.line, got, err, c.want, c.ok)
		}
	}
	if s, err := cpuSeconds(os.Getpid()); err != nil || s < 0 {
		t.Errorf("cpuSeconds(self) = %v, %v", s, err)
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP floodgate_rls_store_fallback_total Decisions the store could not make.
# TYPE floodgate_rls_store_fallback_total counter
floodgate_rls_store_fallback_total{domain="a",policy="local"} 3
floodgate_rls_store_fallback_total{domain="b",policy="open"} 4
floodgate_rls_store_fallback_total_other 100
floodgate_rls_store_fallback_total 2
`
	if got, want := sumMetric([]byte(text), fallbackMetric), int64(9); got != want {
		t.Errorf("sumMetric = %d, want %d", got, want)
	}
}

func TestNextEdge(t *testing.T) {
	at := time.Date(2026, 12, 4, 3, 48, 20, 0, time.UTC)
	for _, c := range []struct {
		lead time.Duration
		want time.Time
	}{
		{33 * time.Second, time.Date(2026, 12, 4, 3, 49, 0, 0, time.UTC)},
		{41 * time.Second, time.Date(2026, 12, 4, 3, 50, 0, 0, time.UTC)},
	} {
		if got := nextEdge(at, time.Minute, c.lead); !got.Equal(c.want) || got.Sub(at) < c.lead {
			t.Errorf("nextEdge(%v, minute, %v) = %v, want %v", at, c.lead, got, c.want)
		}
	}
}

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		a    Admitted
		want bool
	}{
		{Admitted{Admitted: 300, Allowance: 301}, true},
		{Admitted{Admitted: 298, Allowance: 301}, true},
		{Admitted{Admitted: 297, Allowance: 301}, false},
		{Admitted{Admitted: 305, Allowance: 301}, false},
		{Admitted{Admitted: 305, Allowance: 301, LeaseExtra: 0.5}, false},
		{Admitted{Admitted: 305, Allowance: 301, LeaseExtra: 1.5}, true},
		{Admitted{Admitted: 49, Allowance: 50}, true}, // one request
		{Admitted{Admitted: 48, Allowance: 50}, false},
	} {
		if got := c.a.Within(); got != c.want {
			t.Errorf("%+v.Within() = %v, want %v", c.a, got, c.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	rec := &recorder{}
	for i := 1; i <= 1000; i++ {
		rec.lat = append(rec.lat, time.Duration(i)*time.Microsecond)
	}
	rec.decisions, rec.over = 1000, 10
	m := Measurement{Seconds: 2}
	summarize(&m, []*recorder{rec, {errors: 3}})
	m.ServerCPU, m.RedisCPU = 0.5, 0.5
	m.derive()
	want := Measurement{Seconds: 2, Decisions: 1000, OverLimit: 10, Errors: 3, ServerCPU: 0.5, RedisCPU: 0.5,
		PerSecond: 500, PerCPUSecond: 1000, P50: 0.5, P90: 0.9, P99: 0.99, P999: 0.999, Max: 1}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("summarize (-want +got):\n%s", diff)
	}
}

// TestProbeNull: the probe tells a server that has not loaded the
// configuration, as the null server answers, from one that has.
func TestProbeNull(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr, err := rlsproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p, err := startProc(context.Background(), Isolation{}, vNull, []string{exe, "null", "-addr", addr}, nil, addr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	err = probe(context.Background(), []string{addr}, "x")
	if err == nil || !strings.Contains(err.Error(), "has not loaded the configuration") {
		t.Errorf("probe(null) = %v, want an error saying it has not loaded the configuration", err)
	}
}
