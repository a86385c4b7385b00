package rls_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/rls"
	"github.com/floodgate-go/floodgate/tenant"
)

// TestBadConfigs checks that every config envoyproxy/ratelimit refuses
// (its test/config files), and a few more, is an error naming the file and
// the line.
func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name, text, want string // want: "line: message fragment"
	}{
		{"bad yaml", "domain: d\n\tdescriptors: []\n", ":2: invalid YAML"},
		{"empty", "", "config is empty"},
		{"not UTF-8", "domain: d\ndescriptors:\n  - key: \xff\n", ":3: invalid YAML: invalid leading UTF-8 octet"},
		{"control character", "domain: d\n\ndescriptors: \x01\n", ":3: invalid YAML: control characters are not allowed"},
		{"not a mapping", "- a\n- b\n", ":1: config must be a mapping"},
		{"no domain", "descriptors:\n  - key: a\n", ":1: config has no domain"},
		{"empty domain", "domain: \"\"\n", ":1: domain must not be empty"},
		{"unknown root key", "domain: d\nlimits: []\n", `:2: config: unknown key "limits"`},
		{"misspelled key", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requestsperunit: 5\n",
			`:6: descriptor a: rate_limit: unknown key "requestsperunit"`},
		{"empty key", "domain: d\ndescriptors:\n  - value: a\n", ":3: descriptor has no key"},
		{"duplicate descriptor", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n", ":5: duplicate descriptor a_b"},
		{"duplicate key in a mapping", "domain: d\ndomain: e\n", `:2: config: duplicate key "domain"`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
			`:5: descriptor a: invalid rate limit unit "fortnight"`},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n", ":4: descriptor a: rate_limit has no unit"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n",
			":6: descriptor a: should not specify rate limit unit when unlimited"},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n",
			":8: descriptor a: should not have an empty replaces entry"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: n\n      replaces:\n        - name: n\n",
			":4: descriptor a: replaces should not contain name of same descriptor"},
		{"non-string key", "domain: d\ndescriptors:\n  - key: [a]\n", ":3: key must be a string"},
		{"list of non-maps", "domain: d\ndescriptors:\n  - a\n", ":3: a descriptor must be a mapping"},
		{"negative requests", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n",
			":6: requests_per_unit must be a whole number"},
		{"zero burst", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 0\n",
			":7: descriptor a: burst must be at least 1"},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
			":3: descriptor a_b: share_threshold needs a wildcard"},
		{"quota_mode", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n", ":4: quota_mode is not supported"},
		{"bad failure policy", "domain: d\nfailure_policy: sometimes\n", ":2: failure_policy must be local, open or closed"},
		{"bad shadow_mode", "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n", ":4: shadow_mode must be true or false"},
		{"bad tenant config", "tiers:\n  free:\n    default: {rate: -1, burst: 1}\n", ":3: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeConfig(t, "", "bad.yaml", tc.text)
			_, err := rls.LoadConfig(p)
			if err == nil {
				t.Fatalf("LoadConfig accepted:\n%s", tc.text)
			}
			if !errors.Is(err, rls.ErrInvalidConfig) {
				t.Errorf("error %v does not match ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), p+tc.want) && !strings.Contains(err.Error(), p+": "+tc.want) {
				t.Errorf("error:\n%v\nwant it to hold %q", err, p+tc.want)
			}
		})
	}
}

// TestConfigDirectory loads a directory of files, one domain each, and
// refuses one where two files name a domain.
func TestConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	writeConfig(t, dir, "b.yml", "domain: b\n")
	writeConfig(t, dir, ".hidden.yaml", "not: a config\n")
	writeConfig(t, dir, "notes.txt", "ignored")
	cfg, err := rls.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b"}, cfg.Domains()); diff != "" {
		t.Errorf("Domains() (-want +got):\n%s", diff)
	}
	writeConfig(t, dir, "c.yaml", "domain: a\n")
	_, err = rls.LoadConfig(dir)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "c.yaml")+`: duplicate domain "a", also in `+filepath.Join(dir, "a.yaml")) {
		t.Errorf("LoadConfig with a duplicate domain: %v", err)
	}
}

// TestReload checks that a reload keeps buckets whose descriptors it
// keeps, under the new limit, and that a rejected config leaves the
// previous one in force.
func TestReload(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			clock := newFakeClock()
			p := writeConfig(t, "", "rl.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
			svc, err := rls.New(b.store(t, clock), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := svc.Load(p); err != nil {
				t.Fatal(err)
			}
			c := serve(t, svc)
			call(t, c, request("d", 3, desc("k", "v"))) // 2 left of 5

			// Same descriptor, a higher limit: the bucket keeps its 2
			// tokens (the clock is still, so it gains none).
			writeConfig(t, filepath.Dir(p), "rl.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 50}\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
			if err := svc.Load(p); err != nil {
				t.Fatal(err)
			}
			got := outcomeOf(call(t, c, request("d", 0, desc("k", "v"))))
			if diff := cmp.Diff(outcome{"OK", []string{"OK"}, []uint32{1}}, got); diff != "" {
				t.Errorf("after reload (-want +got):\n%s", diff)
			}

			// A broken config: the error names file and line, and the
			// config in force stays.
			writeConfig(t, filepath.Dir(p), "rl.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: other\n    rate_limit: {unit: lightyear, requests_per_unit: 1}\n")
			err = svc.Load(p)
			if err == nil || !strings.Contains(err.Error(), p+":6: ") {
				t.Fatalf("Load of a broken config: %v, want an error at %s:6", err, p)
			}
			resp := call(t, c, request("d", 0, desc("k", "v")))
			if got := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 50 {
				t.Errorf("after a rejected reload the limit is %d, want the previous 50", got)
			}
			if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 0 {
				t.Errorf("after a rejected reload %d tokens remain, want 0", got)
			}
		})
	}
}

// TestTenantConfig serves a floodgate tenant config: tenants by API key
// and ID, per-method rules with costs, anonymous callers by address.
func TestTenantConfig(t *testing.T) {
	const key = "sk-test-0123456789abcdef"
	digest, err := tenant.HashKey(key)
	if err != nil {
		t.Fatal(err)
	}
	text := `
tiers:
  free:
    default: {rate: 2, burst: 2}
    methods:
      "/pkg.Svc/Expensive": {rate: 10, burst: 10, cost: 5}
tenants:
  acme:
    tier: free
    keys: ["` + digest + `"]
anonymous:
  default: {rate: 1, burst: 1}
  methods:
    "/pkg.Svc/Health": {rate: inf}
`
	p := writeConfig(t, "", "api.yaml", text)
	cfg, err := rls.LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"api"}, cfg.Domains()); diff != "" {
		t.Errorf("Domains() (-want +got):\n%s", diff)
	}
	m, err := keyed.New(keyed.WithClock(newFakeClock()))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, svc)
	steps := []struct {
		d    []string
		want outcome
	}{
		{[]string{"api_key", key, "method", "/pkg.Svc/Cheap"}, outcome{"OK", []string{"OK"}, []uint32{1}}},
		// The same tenant by ID: the same bucket.
		{[]string{"tenant", "acme", "method", "/pkg.Svc/Other"}, outcome{"OK", []string{"OK"}, []uint32{0}}},
		{[]string{"tenant", "acme", "method", "/pkg.Svc/Cheap"}, outcome{"OVER_LIMIT", []string{"OVER_LIMIT"}, []uint32{0}}},
		// Its own bucket, at a cost of 5 a call.
		{[]string{"api_key", key, "method", "/pkg.Svc/Expensive"}, outcome{"OK", []string{"OK"}, []uint32{5}}},
		{[]string{"api_key", key, "method", "/pkg.Svc/Expensive"}, outcome{"OK", []string{"OK"}, []uint32{0}}},
		// Anonymous callers, one bucket per address.
		{[]string{"remote_address", "10.0.0.1"}, outcome{"OK", []string{"OK"}, []uint32{0}}},
		{[]string{"remote_address", "10.0.0.1"}, outcome{"OVER_LIMIT", []string{"OVER_LIMIT"}, []uint32{0}}},
		{[]string{"api_key", "unknown-key-000000", "remote_address", "10.0.0.2"}, outcome{"OK", []string{"OK"}, []uint32{0}}},
		// An unlimited rule.
		{[]string{"remote_address", "10.0.0.1", "method", "/pkg.Svc/Health"}, outcome{"OK", []string{"OK"}, []uint32{4294967295}}},
	}
	for i, s := range steps {
		if diff := cmp.Diff(s.want, outcomeOf(call(t, c, request("api", 0, desc(s.d...))))); diff != "" {
			t.Errorf("step %d %v (-want +got):\n%s", i, s.d, diff)
		}
	}
	resp := call(t, c, request("api", 0, desc("tenant", "acme", "method", "/pkg.Svc/Cheap")))
	if got, want := resp.GetStatuses()[0].GetCurrentLimit(), (&pb.RateLimitResponse_RateLimit{RequestsPerUnit: 2, Unit: pb.RateLimitResponse_RateLimit_SECOND}); got.GetRequestsPerUnit() != want.RequestsPerUnit || got.GetUnit() != want.Unit {
		t.Errorf("current_limit = %v, want %v", got, want)
	}
}
