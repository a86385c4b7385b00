package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/examples/multitenant/internal/loadgen"
	"github.com/floodgate-go/floodgate/tenant"
)

// The demo end to end, short and small: a server on loopback behind the
// middleware, the test profile's callers, the table, the summary and the
// chart. With the gate policy and a calm CPU the noisy tenant is shed by its
// quota; with a hot one by the gate. With the overload controller a hot CPU
// sheds nothing: the gate only reads it. Either way the steady tenants and
// the anonymous callers are never shed. The CPU is scripted, so the
// machine's own load cannot turn the gate on or off, and the assertions
// count outcomes, never time them.
func TestDemoShedsOnlyTheNoisyTenant(t *testing.T) {
	for _, tc := range []struct {
		name         string
		policy       string
		cpu          float64
		shedBy, not  loadgen.Outcome
		wantShedding bool
	}{
		{name: "calm CPU", policy: policyAdaptive, cpu: 0.1, shedBy: loadgen.OutcomeQuota, not: loadgen.OutcomeOverload},
		// Before the gate's first reading, the noisy tenant is shed by its
		// quota: both reasons may appear.
		{name: "hot CPU", policy: policyAdaptive, cpu: 0.95, shedBy: loadgen.OutcomeOverload, not: loadgen.OutcomeOverload, wantShedding: true},
		// The test's server is far from its capacity: the controller has
		// nothing to shed, and the hot gate scales no quota.
		{name: "overload controller, hot CPU", policy: policyOverload, cpu: 0.95, shedBy: loadgen.OutcomeQuota, not: loadgen.OutcomeOverload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			chart := filepath.Join(t.TempDir(), "chart.png")
			sum, err := runDemo(context.Background(), demoConfig{
				Server: serverConfig{
					ConfigPath: testdata(t, "test-tenants.yaml"),
					Cost:       100 * time.Microsecond,
					Policy:     tc.policy,
					sampler:    scriptedCPU(tc.cpu),
					burner:     testBurner(),
					ctrlOpts:   roomyCtrl,
				},
				ProfilePath: testdata(t, "test-profile.yaml"),
				Duration:    2 * time.Second,
				Capacity:    100,
				Seed:        1,
				Every:       time.Second,
				Out:         chart,
				Stdout:      &out,
				tick:        250 * time.Millisecond,
			})
			if err != nil {
				t.Fatalf("runDemo = %v\n%s", err, out.String())
			}
			t.Logf("output:\n%s", out.String())

			var noisy *loadgen.CallerTotal
			for i := range sum.Callers {
				c := &sum.Callers[i]
				if c.Ramp {
					noisy = c
					continue
				}
				if c.Counts.By[loadgen.OutcomeOK] == 0 {
					t.Errorf("%s: no call admitted", c.Name)
				}
				if shed := c.Counts.Shed(); shed != 0 {
					t.Errorf("%s: %d calls shed, want none", c.Name, shed)
				}
				if got, want := c.Counts.By[loadgen.OutcomeOK], c.Counts.Sent(); got != want {
					t.Errorf("%s: %d of %d calls served, want all (counts %+v)", c.Name, got, want, c.Counts)
				}
			}
			if noisy == nil {
				t.Fatal("no ramp caller in the summary")
			}
			if noisy.Counts.By[tc.shedBy] == 0 {
				t.Errorf("noisy: no call shed by %v (counts %+v)", tc.shedBy, noisy.Counts)
			}
			if tc.not != tc.shedBy && noisy.Counts.By[tc.not] != 0 {
				t.Errorf("noisy: %d calls shed by %v, want none with this CPU", noisy.Counts.By[tc.not], tc.not)
			}
			if noisy.Counts.By[loadgen.OutcomeOK] == 0 {
				t.Error("noisy: no call admitted; its quota should still let some through")
			}
			if got := sum.Shedding > 0; got != tc.wantShedding {
				t.Errorf("shed load for %v, want shedding %v", sum.Shedding, tc.wantShedding)
			}
			wantLines := []string{"caller", "noisy", "anonymous", "summary:", "chart: " + chart}
			if tc.policy == policyOverload {
				if sum.Ctrl == nil || sum.Ctrl.Admitted == 0 {
					t.Errorf("controller %+v, want admitted calls", sum.Ctrl)
				}
				if !math.IsNaN(sum.MinScale) {
					t.Errorf("lowest gate scale %v with the controller, want none (NaN)", sum.MinScale)
				}
				wantLines = append(wantLines, "overload open: limit ", "overload controller: shed calls in 0s")
			} else if sum.Ctrl != nil {
				t.Errorf("controller %+v with the %s gate, want none", sum.Ctrl, tc.policy)
			}
			if sum.Server == nil || sum.Server.Admitted == 0 {
				t.Errorf("server stats %+v, want admitted calls", sum.Server)
			}

			for _, want := range wantLines {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
			png, err := os.ReadFile(chart)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("%s is not a PNG", chart)
			}
		})
	}
}

func TestRunRejectsBadInvocations(t *testing.T) {
	for _, args := range [][]string{
		{"frobnicate"},
		{"-duration", "0"},
		{"-config", "no-such-file.yaml", "-capacity", "1"},
		{"serve", "extra"},
		{"load", "-capacity", "-1"},
		{"-policy", "nope"},
		{"serve", "-policy", "nope"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
}

func TestMeasureCapacity(t *testing.T) {
	cfg := demoConfig{
		Server: serverConfig{
			ConfigPath: testdata(t, "test-tenants.yaml"),
			Cost:       100 * time.Microsecond,
			Policy:     "adaptive",
			sampler:    scriptedCPU(0.1),
			burner:     testBurner(),
		},
		probe: 200 * time.Millisecond,
	}
	prof, err := loadgen.LoadProfile(testdata(t, "test-profile.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	capacity, err := measure(context.Background(), cfg, prof, &out)
	if err != nil {
		t.Fatal(err)
	}
	if capacity <= 0 {
		t.Errorf("measure = %v, want a positive capacity", capacity)
	}
	if !strings.HasPrefix(out.String(), "capacity: ") {
		t.Errorf("measure printed %q, want a capacity line", out.String())
	}

	prof.ProbeKey = ""
	if _, err := measure(context.Background(), cfg, prof, &out); err == nil {
		t.Error("measure without a probe key = nil error, want one")
	}
}

// The demo's tenant config loads, and gives every keyed caller of the
// demo's profile a tenant: the steady ones a quota above their rate, and
// the noisy one the same weight as theirs, so that it is shed for holding
// more than its share, not for its tier.
func TestDemoTenants(t *testing.T) {
	reg, err := tenant.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Load(testdata(t, "tenants.yaml")); err != nil {
		t.Fatal(err)
	}
	table := reg.Table()
	prof, err := loadgen.LoadProfile(testdata(t, "profile.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range prof.Callers {
		if c.Key == "" {
			continue
		}
		ten, ok := table.TenantByKey(c.Key)
		if !ok {
			t.Errorf("%s: key names no tenant", c.Name)
			continue
		}
		if got, want := ten.Weight(), 1.0; got != want {
			t.Errorf("%s: weight %v, want %v", c.Name, got, want)
		}
		lim := ten.Rule("/inventory.v1.Inventory/Allocate").Limit
		if !c.Ramp && !(lim.Rate > c.Rate) {
			t.Errorf("%s: quota %v for a rate of %v/s, want more", c.Name, lim, c.Rate)
		}
	}
	ops, ok := table.TenantByKey(prof.ProbeKey)
	if !ok || ops.Priority() != floodgate.Critical || !ops.Rule("/inventory.v1.Inventory/Allocate").Limit.IsInf() {
		t.Errorf("probe tenant %v: want unlimited and critical", ops)
	}
}

// The server and the simulated callers name the API key header each on
// their own, since the server is the part to copy: they must agree.
func TestAPIKeyHeaderAgrees(t *testing.T) {
	if apiKeyHeader != loadgen.APIKeyHeader {
		t.Errorf("the server reads API keys from %q, the callers send them in %q", apiKeyHeader, loadgen.APIKeyHeader)
	}
}
