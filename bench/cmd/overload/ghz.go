package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"go/build"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ghz (github.com/bojand/ghz) drives a few cells of the matrix as a second
// opinion on our own load generator: another client, another process,
// calls sent at a constant rate rather than Poisson arrivals, by its
// asynchronous mode (no limit on the calls in flight, as ours). Its
// calls carry the tenants' API keys in the same proportions as ours,
// drawn at random per call, so that E's quotas treat both alike.

// ghzInstall is how to install the ghz the matrix was written against.
const ghzInstall = "go install github.com/bojand/ghz/cmd/ghz@v0.120.0"

// ghzMetadata gives a call the heavy tenant's key half of the time, else
// one of the nine light tenants' keys (see share), with ghz's template
// functions. ghz executes the template per call only when its top level
// holds an action, not just an if: hence one index into the list of
// tenants, the heavy one nine times.
const ghzMetadata = `{"` + apiKeyHeader + `":"overload-key-{{index (list 0 0 0 0 0 0 0 0 0 1 2 3 4 5 6 7 8 9) (randomInt 0 18)}}"}`

// findGhz returns the ghz binary to use, or "" and why there is none.
// setting is -ghz: "off", "auto" (ghz on PATH, else in GOPATH/bin) or a
// path.
func findGhz(setting, proto string) (string, string) {
	var path string
	switch setting {
	case "off":
		return "", "ghz off (-ghz off)"
	case "", "auto":
		if p, err := exec.LookPath("ghz"); err == nil {
			path = p
		} else if p := filepath.Join(build.Default.GOPATH, "bin", "ghz"); isExecutable(p) {
			path = p
		} else {
			return "", "ghz is not installed (" + ghzInstall + ")"
		}
	default:
		if !isExecutable(setting) {
			return "", "no ghz at " + setting
		}
		path = setting
	}
	if _, err := os.Stat(proto); err != nil {
		return "", "ghz needs the inventory proto: " + err.Error()
	}
	return path, ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// ghzVersion names the ghz at path with its module version, which a ghz
// built by go install reports only in its build information.
func ghzVersion(path string) string {
	if bi, err := buildinfo.ReadFile(path); err == nil && bi.Main.Version != "" {
		return "ghz " + bi.Main.Version + " (" + path + ")"
	}
	return "ghz (" + path + ")"
}

// ghzArgs returns ghz's arguments for Allocate calls at rate calls/s for
// dur against addr, each with deadline, its JSON report written to out.
func ghzArgs(proto, addr string, rate float64, dur, deadline time.Duration, out string) []string {
	return []string{
		"--insecure", "--async",
		"--proto", proto,
		"--call", "inventory.v1.Inventory.Allocate",
		"-d", `{"sku":"sku-00001","quantity":1}`,
		"-m", ghzMetadata,
		"-r", strconv.Itoa(max(int(math.Round(rate)), 1)),
		"-z", dur.String(),
		"-t", deadline.String(),
		// As many connections as our ten tenants have.
		"-c", strconv.Itoa(numTenants), "--connections", strconv.Itoa(numTenants),
		"-O", "json", "-o", out,
		addr,
	}
}

// ghzReport is what the matrix reads of ghz's JSON report (-O json).
type ghzReport struct {
	Count   uint64      `json:"count"`
	Details []ghzDetail `json:"details"`
}

// ghzDetail is one call of a ghz report.
type ghzDetail struct {
	// Timestamp is when the call ended.
	Timestamp time.Time     `json:"timestamp"`
	Latency   time.Duration `json:"latency"`
	// Status is the gRPC code's name: "OK", "Unavailable", ...
	Status string `json:"status"`
	Error  string `json:"error"`
}

// ghzOutcomes map ghz's status names to outcomes, as classify maps codes.
var ghzOutcomes = map[string]outcome{
	"OK":                outOK,
	"ResourceExhausted": outRejected,
	"Unavailable":       outRejected,
	"DeadlineExceeded":  outDeadline,
}

// parseGhz reads a ghz JSON report into a raw run's calls, each starting
// at its offset from the first call's start. ghz does not say which key a
// call carried: every call is the heavy tenant's.
func parseGhz(b []byte) (*rawRun, error) {
	var rep ghzReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("ghz report: %w", err)
	}
	if len(rep.Details) == 0 {
		return nil, errors.New("ghz report: no calls")
	}
	if uint64(len(rep.Details)) < rep.Count {
		return nil, fmt.Errorf("ghz report: %d calls of %d in its details", len(rep.Details), rep.Count)
	}
	var first time.Time
	for i, d := range rep.Details {
		if s := d.Timestamp.Add(-d.Latency); i == 0 || s.Before(first) {
			first = s
		}
	}
	raw := &rawRun{}
	for _, d := range rep.Details {
		out, ok := ghzOutcomes[d.Status]
		if !ok {
			out = outOther
		}
		raw.Calls = append(raw.Calls, callRec{At: d.Timestamp.Add(-d.Latency).Sub(first), Lat: d.Latency, Tenant: heavyTenant, Out: out})
		raw.Sent[heavyTenant]++
	}
	return raw, nil
}

// ghzCut is how long before ghz stops (after cellDur) its judged window
// ends, besides the deadline: ghz closes its connections when it stops,
// failing the calls still in flight (UNAVAILABLE, "use of closed network
// connection"), which the judged window must leave out.
const ghzCut = 250 * time.Millisecond

// ghzCellRun analyses a steady cell's run by ghz at rate calls/s, each
// call with deadline: from cellSkip until the calls that began can no
// longer have been cut.
func ghzCellRun(raw *rawRun, c Cell, variant string, ready serverReady, capacity, rate float64, slo, deadline time.Duration) CellRun {
	w := raw.window(c.judged(), cellSkip, cellDur-deadline-ghzCut, c.Load, slo)
	// The window's tenant figures are meaningless: every call is
	// counted as the heavy tenant's.
	w.LightSuccess, w.LightP99, w.HeavySuccess, w.Jain, w.FairJain = -1, -1, -1, -1, -1
	w.TenantSent, w.TenantGood = nil, nil
	return CellRun{Cell: c.Name, Variant: variant, Driver: driverGhz, Server: ready, Capacity: capacity, Offered: rate, Judged: w}
}

// runGhz drives steady cell c with ghz against the server p, of variant v.
func (m *matrixRunner) runGhz(ctx context.Context, p *serverProc, c Cell, v string, capacity float64) (CellRun, error) {
	if c.Shape != shapeSteady || c.Cold {
		return CellRun{}, fmt.Errorf("ghz drives warm steady cells only, not %s", c.Name)
	}
	dir, err := os.MkdirTemp("", "floodgate-ghz-")
	if err != nil {
		return CellRun{}, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "report.json")
	rate := c.Load * capacity
	cmd := exec.CommandContext(ctx, m.mc.Ghz, ghzArgs(m.mc.GhzProto, p.ready.GRPC, rate, cellDur, m.cfg.Deadline, out)...)
	var msg bytes.Buffer
	cmd.Stdout, cmd.Stderr = &msg, &msg
	if err := cmd.Run(); err != nil {
		return CellRun{}, fmt.Errorf("ghz: %v: %s", err, strings.TrimSpace(msg.String()))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return CellRun{}, err
	}
	raw, err := parseGhz(b)
	if err != nil {
		return CellRun{}, err
	}
	p.stop()
	return ghzCellRun(raw, c, v, p.ready, capacity, float64(max(int(math.Round(rate)), 1)), m.cfg.SLO, m.cfg.Deadline), nil
}
