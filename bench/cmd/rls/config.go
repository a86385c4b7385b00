package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The configuration every server reads: envoyproxy/ratelimit's format, one
// file per domain, in the layout its runtime loader expects
// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml); floodgate-rls reads
// the same directory. The mix (mix.go) draws its descriptors from these
// domains, and the accuracy phase (accuracy.go) from bench-accuracy.

// Domains of the configuration.
const (
	domainAPI      = "bench-api"
	domainAuth     = "bench-auth"
	domainAccuracy = "bench-accuracy"
	domainProbe    = "bench-probe"
)

// The limits of the mix's descriptors, per second unless named otherwise.
const (
	limitTenant       = 500  // per tenant
	limitTenantSearch = 50   // per tenant and path under /search/ (a wildcard)
	limitTenantPath   = 6000 // per tenant and any other path, per minute
	limitAddress      = 20   // per remote address
	limitUser         = 1200 // per user, per minute
	limitFreeUser     = 5    // per user of the free plan
)

// accuracyLimits are the accuracy domain's limits: requests per unit of
// the steady and the edge descriptors, in the unit of the run (a minute;
// a second with -quick, so that a quick run crosses window edges within
// seconds). Their rates, 30/s and 10/s in a full run, 20/s in a quick
// one, give floodgate-rls's default lease (100 ms) a token or more, so
// that leases take part.
type accuracyLimits struct {
	Unit   string        `json:"unit"`
	Period time.Duration `json:"period"`
	Steady int           `json:"steady"`
	Edge   int           `json:"edge"`
}

func accuracyLimitsFor(quick bool) accuracyLimits {
	if quick {
		return accuracyLimits{Unit: "second", Period: time.Second, Steady: 20, Edge: 20}
	}
	return accuracyLimits{Unit: "minute", Period: time.Minute, Steady: 1800, Edge: 600}
}

// configFiles returns the configuration's files by name.
func configFiles(acc accuracyLimits) map[string]string {
	return map[string]string{
		domainAPI + ".yaml": fmt.Sprintf(`# The API gateway's limits: a bucket per tenant, nested ones per tenant
# and path, and one per remote address.
domain: %s
descriptors:
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: %d
    descriptors:
      - key: path
        value: /search/*
        rate_limit:
          unit: second
          requests_per_unit: %d
      - key: path
        rate_limit:
          unit: minute
          requests_per_unit: %d
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: %d
`, domainAPI, limitTenant, limitTenantSearch, limitTenantPath, limitAddress),
		domainAuth + ".yaml": fmt.Sprintf(`# The login service's limits: per user, tighter on the free plan, none
# for internal callers.
domain: %s
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: %d
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit:
          unit: second
          requests_per_unit: %d
  - key: plan
    value: internal
    rate_limit:
      unlimited: true
`, domainAuth, limitUser, limitFreeUser),
		domainAccuracy + ".yaml": fmt.Sprintf(`# The accuracy phase's descriptors: each value is its own bucket.
domain: %s
descriptors:
  - key: steady
    rate_limit:
      unit: %s
      requests_per_unit: %d
  - key: edge
    rate_limit:
      unit: %s
      requests_per_unit: %d
`, domainAccuracy, acc.Unit, acc.Steady, acc.Unit, acc.Edge),
		domainProbe + ".yaml": fmt.Sprintf(`# One request a day per value: a server that refuses the second has
# loaded this configuration.
domain: %s
descriptors:
  - key: probe
    rate_limit:
      unit: day
      requests_per_unit: 1
`, domainProbe),
	}
}

// Runtime layout of the configuration under a run's directory.
const (
	runtimeSubdir = "ratelimit"
	runtimeAppdir = "config" // envoyproxy/ratelimit's RUNTIME_APPDIRECTORY default
)

// writeConfig writes the configuration under root and returns the
// directory of its files.
func writeConfig(root string, acc accuracyLimits) (string, error) {
	dir := filepath.Join(root, runtimeSubdir, runtimeAppdir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for name, text := range configFiles(acc) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// configText returns the configuration as one text, its files in name
// order, for the page.
func configText(acc accuracyLimits) string {
	files := configFiles(acc)
	var b strings.Builder
	for _, name := range []string{domainAPI, domainAuth, domainAccuracy, domainProbe} {
		fmt.Fprintf(&b, "# --- %s.yaml\n%s", name, files[name+".yaml"])
	}
	return b.String()
}
