package rls_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/rls"
)

func memoryService(t *testing.T, text string, opts ...rls.Option) (*rls.Service, pb.RateLimitServiceClient, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, mustParse(t, text), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return svc, serve(t, svc), clock
}

func TestResponseHeaders(t *testing.T) {
	_, c, _ := memoryService(t, compatConfig, rls.WithResponseHeaders(true))
	headers := func(r *pb.RateLimitResponse) map[string]string {
		h := map[string]string{}
		for _, v := range r.GetResponseHeadersToAdd() {
			h[v.GetKey()] = v.GetValue()
		}
		return h
	}
	// The descriptor with the fewest tokens left speaks: small, 1 a minute.
	r := call(t, c, request("test-domain", 0, desc("big", "h"), desc("small", "h")))
	want := map[string]string{rls.HeaderLimit: "1", rls.HeaderRemaining: "0", rls.HeaderReset: "60"}
	if diff := cmp.Diff(want, headers(r)); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	// Refused: the refusing descriptor, and the time until it could pass.
	r = call(t, c, request("test-domain", 0, desc("big", "h"), desc("small", "h")))
	if diff := cmp.Diff(want, headers(r)); diff != "" {
		t.Errorf("headers when refused (-want +got):\n%s", diff)
	}
	// Off by default.
	_, plain, _ := memoryService(t, compatConfig)
	if h := call(t, plain, request("test-domain", 0, desc("big", "h"))).GetResponseHeadersToAdd(); len(h) != 0 {
		t.Errorf("headers without WithResponseHeaders: %v", h)
	}
}

// TestChargeOnResponse follows Envoy's apply_on_stream_done: a second call
// with the same descriptor and reservation ID settles the first call's
// estimate at its actual cost.
func TestChargeOnResponse(t *testing.T) {
	_, c, _ := memoryService(t, compatConfig)
	d := func(id string, hits uint64) *rlpbDescriptor {
		return withHits(desc("big", "x", rls.ReservationKey, id), hits)
	}
	remaining := func(r *pb.RateLimitResponse) uint32 { return r.GetStatuses()[0].GetLimitRemaining() }
	steps := []struct {
		name string
		d    *rlpbDescriptor
		want outcome
	}{
		{"estimate 5", d("a", 5), outcome{"OK", []string{"OK"}, []uint32{5}}},
		{"actual 2 refunds 3", d("a", 2), outcome{"OK", []string{"OK"}, []uint32{8}}},
		{"the entry is not part of the bucket", desc("big", "x"), outcome{"OK", []string{"OK"}, []uint32{7}}},
		{"estimate 5 again", d("b", 5), outcome{"OK", []string{"OK"}, []uint32{2}}},
		{"actual 9 charges 4, into debt", d("b", 9), outcome{"OK", []string{"OK"}, []uint32{0}}},
		{"a debt refuses", d("c", 1), outcome{"OVER_LIMIT", []string{"OVER_LIMIT"}, []uint32{0}}},
		{"a refused request's response settles nothing", d("c", 10), outcome{"OK", []string{"OK"}, []uint32{0}}},
		{"check only", withHits(desc("big", "x"), 0), outcome{"OVER_LIMIT", []string{"OVER_LIMIT"}, []uint32{0}}},
	}
	for _, s := range steps {
		r := call(t, c, request("test-domain", 0, s.d))
		if diff := cmp.Diff(s.want, outcomeOf(r)); diff != "" {
			t.Errorf("%s (-want +got):\n%s (remaining %d)", s.name, diff, remaining(r))
		}
	}
}

func TestInvalidRequests(t *testing.T) {
	_, c, _ := memoryService(t, compatConfig)
	for _, req := range []*pb.RateLimitRequest{
		{Descriptors: []*rlpbDescriptor{desc("big", "x")}},
		{Domain: "test-domain"},
	} {
		_, err := c.ShouldRateLimit(bg, req)
		if got := status.Code(err); got != codes.InvalidArgument {
			t.Errorf("ShouldRateLimit(%v) = %v, want InvalidArgument", req, err)
		}
	}
}

// gather returns the value of every sample of reg, by name and labels
// ("name{a=x,b=y}").
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, c, _ := memoryService(t, compatConfig+`
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`, rls.WithRegisterer(reg))
	for range 3 {
		call(t, c, request("test-domain", 0, desc("small", "10.0.0.1")))
		call(t, c, request("test-domain", 0, desc("shadowed", "x")))
		call(t, c, request("test-domain", 0, desc("detailed", "v1")))
	}
	call(t, c, request("test-domain", 9, desc("big", "n")))
	call(t, c, request("test-domain", 0, desc("nope", "x")))
	call(t, c, request("elsewhere", 0, desc("nope", "x")))
	got := gather(t, reg)
	want := map[string]float64{
		"floodgate_rls_descriptor_decisions_total{code=ok,descriptor=small,domain=test-domain}":         1,
		"floodgate_rls_descriptor_decisions_total{code=over_limit,descriptor=small,domain=test-domain}": 2,
		"floodgate_rls_descriptor_decisions_total{code=ok,descriptor=shadowed,domain=test-domain}":      3,
		"floodgate_rls_shadow_over_limit_total{descriptor=shadowed,domain=test-domain}":                 2,
		"floodgate_rls_near_limit_total{descriptor=big,domain=test-domain}":                             1,
		"floodgate_rls_requests_total{code=over_limit,domain=test-domain}":                              4,
		"floodgate_rls_unmatched_descriptors_total{domain=test-domain}":                                 1,
		"floodgate_rls_unmatched_descriptors_total{domain=(unknown)}":                                   1,
		"floodgate_rls_over_limit_top{descriptor=test-domain.small}":                                    2,
		"floodgate_rls_over_limit_top{descriptor=test-domain.shadowed}":                                 2,
		"floodgate_rls_over_limit_top{descriptor=test-domain.detailed_v1}":                              2,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.Contains(k, "10.0.0.1") {
			t.Errorf("a request's value reached a label: %s", k)
		}
	}
	top := svc.Top(1)
	if len(top) != 1 || top[0].Count != 2 {
		t.Errorf("Top(1) = %v, want one descriptor counted twice", top)
	}
}

// failing is a store whose every call fails, as a store does that cannot
// reach its backend and has no fallback.
type failing struct{ *keyed.Map }

var errDown = errors.New("backend down")

func (f failing) ReserveN(context.Context, string, floodgate.Limit, int) (floodgate.Reservation, error) {
	return floodgate.Reservation{}, errDown
}

func TestFailurePolicy(t *testing.T) {
	m, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := mustParseDir(t, map[string]string{
		"open.yaml":   "domain: open\nfailure_policy: open\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"closed.yaml": "domain: closed\nfailure_policy: closed\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"local.yaml":  "domain: local\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	})
	svc, err := rls.New(failing{m}, cfg, rls.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, svc)
	for _, tc := range []struct{ domain, want string }{{"open", "OK"}, {"closed", "OVER_LIMIT"}, {"local", "OK"}} {
		if got := call(t, c, request(tc.domain, 0, desc("k", "v"))).GetOverallCode().String(); got != tc.want {
			t.Errorf("domain %s with the store down: %s, want %s", tc.domain, got, tc.want)
		}
	}
	got := gather(t, reg)
	for _, k := range []string{"floodgate_rls_store_fallback_total{domain=open,policy=open}",
		"floodgate_rls_store_fallback_total{domain=closed,policy=closed}",
		"floodgate_rls_store_fallback_total{domain=local,policy=local}"} {
		if got[k] != 1 {
			t.Errorf("%s = %v, want 1", k, got[k])
		}
	}
}

func mustParseDir(t *testing.T, files map[string]string) *rls.Config {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		writeConfig(t, dir, name, text)
	}
	cfg, err := rls.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
