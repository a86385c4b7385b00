package rls_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/rls"
)

const (
	mergeA = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	mergeB = "domain: d\ndescriptors:\n  - key: other\n    value: v\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
)

// TestMergeDomains loads a domain split across two files: refused by
// default, one domain with WithMergeDomains, each file's descriptors
// limited as configured.
func TestMergeDomains(t *testing.T) {
	dir := t.TempDir()
	a := writeConfig(t, dir, "a.yaml", mergeA)
	b := writeConfig(t, dir, "b.yaml", mergeB)
	writeConfig(t, dir, "c.yaml", "domain: e\n")

	_, err := rls.LoadConfig(dir)
	if err == nil || !strings.Contains(err.Error(), b+`: duplicate domain "d", also in `+a) {
		t.Errorf("LoadConfig without merging: %v, want a duplicate domain at %s", err, b)
	}
	_, err = rls.LoadConfig(dir, rls.WithMergeDomains(false))
	if err == nil {
		t.Errorf("LoadConfig with WithMergeDomains(false) accepted a split domain")
	}

	cfg, err := rls.LoadConfig(dir, rls.WithMergeDomains(true))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"d", "e"}, cfg.Domains()); diff != "" {
		t.Errorf("Domains() (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{a, b, filepath.Join(dir, "c.yaml")}, cfg.Files()); diff != "" {
		t.Errorf("Files() (-want +got):\n%s", diff)
	}
	svc, err := rls.New(newKeyed(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, svc)
	got := outcomeOf(call(t, c, request("d", 0, desc("k", "x"), desc("other", "v"))))
	if diff := cmp.Diff(outcome{"OK", []string{"OK", "OK"}, []uint32{0, 1}}, got); diff != "" {
		t.Errorf("a descriptor of each file (-want +got):\n%s", diff)
	}
}

// TestMergeDomainsRefused: what merging still refuses names both files.
func TestMergeDomainsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, a, b string
		want       string // the problem in b.yaml; {a} is a.yaml's path
	}{
		{"duplicate key", mergeA, "domain: d\ndescriptors:\n  - key: x\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
			"b.yaml:4: duplicate descriptor k, also at {a}:3"},
		{"duplicate value", mergeB, "domain: d\ndescriptors:\n  - key: other\n    value: v\n",
			"b.yaml:3: duplicate descriptor other_v, also at {a}:3"},
		{"duplicate wildcard", "domain: d\ndescriptors:\n  - key: p\n    value: a*\n", "domain: d\ndescriptors:\n  - key: p\n    value: a*\n",
			"b.yaml:3: duplicate descriptor p_a*, also at {a}:3"},
		// Children are not merged: the top-level descriptor is the duplicate.
		{"same parent, other children", "domain: d\ndescriptors:\n  - key: p\n    descriptors:\n      - key: c1\n",
			"domain: d\ndescriptors:\n  - key: p\n    descriptors:\n      - key: c2\n",
			"b.yaml:3: duplicate descriptor p, also at {a}:3"},
		{"failure policies differ", "domain: d\nfailure_policy: open\n", "domain: d\nfailure_policy: closed\n",
			"b.yaml:2: failure_policy closed differs from open set for domain \"d\" at {a}:2"},
		{"tenant config", "domain: api\n", "tiers:\n  free:\n    default: {rate: 1, burst: 1}\n",
			`b.yaml: duplicate domain "api", also in {a} (a tenant config's domain is not merged)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a := writeConfig(t, dir, "a.yaml", tc.a)
			bname := "b.yaml"
			if strings.HasPrefix(tc.b, "tiers") {
				bname = "api.yaml"
				tc.want = strings.Replace(tc.want, "b.yaml", "api.yaml", 1)
			}
			writeConfig(t, dir, bname, tc.b)
			_, err := rls.LoadConfig(dir, rls.WithMergeDomains(true))
			if !errors.Is(err, rls.ErrInvalidConfig) {
				t.Fatalf("LoadConfig = %v, want ErrInvalidConfig", err)
			}
			want := filepath.Join(dir, strings.ReplaceAll(tc.want, "{a}", a))
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error:\n%v\nwant it to hold %q", err, want)
			}
		})
	}
}

// TestMergeDomainsPolicy: one file may set the domain's failure_policy.
func TestMergeDomainsPolicy(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", mergeA)
	writeConfig(t, dir, "b.yaml", "domain: d\nfailure_policy: closed\n")
	writeConfig(t, dir, "c.yaml", "domain: d\nfailure_policy: closed\n")
	cfg, err := rls.LoadConfig(dir, rls.WithMergeDomains(true))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := cfg.FailurePolicy("d"); got != rls.FailureClosed {
		t.Errorf("FailurePolicy(d) = %v, want closed", got)
	}
}

// TestMergeDomainsReload: Load and Watch of a service that merges keep
// merging, and a reload that brings a duplicate is refused, the merged
// config staying in force.
func TestMergeDomainsReload(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", mergeA)
	loads := make(chan error, 16)
	svc, err := rls.New(newKeyed(t), nil, rls.WithMergeDomains(true),
		rls.WithOnReload(func(_ string, _ *rls.Config, err error) { loads <- err }))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Load(dir); err != nil {
		t.Fatal(err)
	}
	<-loads
	c := serve(t, svc)
	limitOf := func(key string) uint32 {
		t.Helper()
		return call(t, c, request("d", 0, desc(key, "v"))).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limitOf("other"); got != 0 {
		t.Fatalf("before b.yaml, other is limited to %d", got)
	}

	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- svc.Watch(ctx, dir, time.Millisecond) }()
	defer func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	}()
	b := writeConfig(t, dir, "b.yaml", mergeB)
	if err := <-loads; err != nil {
		t.Fatalf("Watch loading b.yaml: %v", err)
	}
	if got, want := limitOf("other"), uint32(2); got != want {
		t.Errorf("after b.yaml, other's limit = %d, want %d", got, want)
	}
	if got, want := limitOf("k"), uint32(1); got != want {
		t.Errorf("after b.yaml, k's limit = %d, want %d", got, want)
	}

	writeConfig(t, dir, "b.yaml", mergeB+"  - key: k\n")
	err = <-loads
	if err == nil || !strings.Contains(err.Error(), b+":6: duplicate descriptor k, also at ") {
		t.Errorf("Watch loading a duplicate: %v", err)
	}
	if got, want := limitOf("other"), uint32(2); got != want {
		t.Errorf("after a refused reload, other's limit = %d, want the previous %d", got, want)
	}
}

// TestLoadConfigOptions: LoadConfig validates the options it is given,
// as New does.
func TestLoadConfigOptions(t *testing.T) {
	p := writeConfig(t, "", "a.yaml", mergeA)
	if _, err := rls.LoadConfig(p, rls.WithTopK(0)); !errors.Is(err, floodgate.ErrInvalidOption) {
		t.Errorf("LoadConfig(WithTopK(0)) = %v, want ErrInvalidOption", err)
	}
	if _, err := rls.LoadConfig(p, nil, rls.WithMergeDomains(true)); err != nil {
		t.Errorf("LoadConfig(nil, WithMergeDomains(true)) = %v", err)
	}
}

func newKeyed(t *testing.T) *keyed.Map {
	t.Helper()
	m, err := keyed.New(keyed.WithClock(newFakeClock()))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
