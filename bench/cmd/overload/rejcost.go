package main

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// The rejection-cost scenario ("rejcost") measures the server's CPU per
// served call and per rejected call directly, against a fresh server, in
// four phases separated by quiet pauses:
//
//  1. idle: nothing is sent; the server's CPU over the phase is its idle
//     CPU (the gate's sampler, the runtime);
//  2. served: the ten tenants at rejcostServedLoad × capacity, which every
//     variant serves; (CPU − idle × duration) / calls served is the CPU
//     per served call;
//  3. reject: one caller, the reject tenant, at rejcostRejectLoad ×
//     capacity. B, C, D and E give it a quota of 1/s (burst 1), so the
//     middleware's interceptor rejects nearly every call; P1's global
//     limiter serves up to the capacity of them and rejects the rest.
//     (CPU − idle × duration − handlers entered × CPU per served call) /
//     rejections is the CPU per rejection;
//  4. floor: health checks (exempt from every variant's admission control)
//     at the reject phase's rate: the CPU of the cheapest call the server
//     answers, the floor under which no rejection can go.
//
// The CPU is the server cgroup's cpuacct.usage where the server runs in
// one, else the server process's user+system time (getrusage), read at
// each phase's ends; no stats are polled and no health probes sent during
// the phases, so nothing but the phase's calls and the idle work is in the
// figures. A, P2 and P3 reject nothing of this load and are skipped.
const (
	rejcostName       = "rejcost"
	rejcostServedLoad = 0.5
	rejcostRejectLoad = 3.0
	// rejcostMaxRate bounds the reject phase's rate, so that the load
	// generator (one CPU) keeps up with its schedule.
	rejcostMaxRate = 2000.0
	// rejcostSettle is the pause after a phase's last call has ended and
	// before its CPU is read, and between phases.
	rejcostSettle = 150 * time.Millisecond
)

// rejcostVariants are the variants that reject the scenario's load.
var rejcostVariants = []string{"B", "C", "D", "E", "P1"}

// rejcostDurations are the idle, served and reject phases' lengths.
func rejcostDurations(quick bool) (idle, served, reject time.Duration) {
	if quick {
		return 200 * time.Millisecond, 400 * time.Millisecond, 400 * time.Millisecond
	}
	return 3 * time.Second, 5 * time.Second, 5 * time.Second
}

// RejPhase is one phase of the rejection-cost scenario.
type RejPhase struct {
	Name   string  `json:"name"`
	Rate   float64 `json:"rate"`   // offered calls/s
	Secs   float64 `json:"secs"`   // from the first CPU reading to the last
	CPUSec float64 `json:"cpu_s"`  // server CPU seconds over Secs
	Sent   int     `json:"sent"`   // calls sent
	OK     int     `json:"ok"`     // calls that ended OK (client side)
	Rej    int     `json:"rej"`    // calls rejected (client side)
	Other  int     `json:"other"`  // calls that ended otherwise: deadline, error
	Handle uint64  `json:"handle"` // Allocate handlers entered (server side)
	Served uint64  `json:"served"` // Allocate handlers completed (server side)
	RejP50 float64 `json:"rej_p50_ms"`
	RejP99 float64 `json:"rej_p99_ms"`
	// Scale and State are the gate's at the phase's end.
	Scale float64 `json:"scale"`
	State string  `json:"state,omitempty"`
}

// RejCost is one variant's rejection-cost measurement.
type RejCost struct {
	Variant   string     `json:"variant"`
	CPUSource string     `json:"cpu_source"` // "cgroup cpuacct.usage" or "process getrusage"
	Phases    []RejPhase `json:"phases"`     // idle, served, reject
	IdleCPU   float64    `json:"idle_cpu"`   // CPUs
	// PerServedUs and PerRejectedUs are the CPU per served call and per
	// rejection in µs; Ratio is their ratio, -1 when undefined (no
	// rejections, or a non-positive figure).
	PerServedUs   float64 `json:"per_served_us"`
	PerRejectedUs float64 `json:"per_rejected_us"`
	Ratio         float64 `json:"ratio"`
	// ServedShare is the share of the reject phase's net CPU that the
	// subtraction of its handlers took: near 0 for B, C, D and E, large for
	// P1, whose figure is then correspondingly less precise.
	ServedShare float64 `json:"served_share"`
	// FloorUs is the CPU of a health check at the reject phase's rate, in
	// µs: the cheapest call the server can answer, exempt from admission
	// control. What a rejection costs above it is the admission control's.
	FloorUs float64 `json:"floor_us"`
	// Saturated tells that calls of the reject phase exceeded their
	// deadline or failed (more than 1% of them): the server ran out of
	// CPU, its handlers were cut short, and subtracting them at the served
	// phase's cost is wrong, so the rejection figure is undetermined. P1's
	// limiter, which serves the capacity, gets there.
	Saturated bool `json:"saturated"`
	// TapShed tells whether the gate shed during the reject phase, so
	// that some rejections came from the tap handle.
	TapShed bool `json:"tap_shed"`
}

// Valid reports whether the measurement gives a usable ratio.
func (rc RejCost) Valid() bool {
	return !rc.Saturated && rc.Ratio >= 0 && rc.PerServedUs > 0 && !math.IsNaN(rc.Ratio) && !math.IsInf(rc.Ratio, 0)
}

// phase returns the phase called name.
func (rc RejCost) phase(name string) *RejPhase {
	for i := range rc.Phases {
		if rc.Phases[i].Name == name {
			return &rc.Phases[i]
		}
	}
	return nil
}

// cpuReader reads the server's CPU time in ns.
type cpuReader struct {
	acct  string // the cgroup's cpuacct.usage, "" to use the stats endpoint
	hc    *http.Client
	stats string
}

func (r cpuReader) source() string {
	if r.acct != "" {
		return "cgroup cpuacct.usage"
	}
	return "process getrusage"
}

// read returns the server's CPU time, its stats and when.
func (r cpuReader) read() (int64, serverStats, time.Time, error) {
	st, err := fetchStats(r.hc, r.stats)
	if err != nil {
		return 0, st, time.Time{}, err
	}
	cpu := st.CPUNs
	if r.acct != "" {
		b, err := os.ReadFile(r.acct)
		if err != nil {
			return 0, st, time.Time{}, err
		}
		if cpu, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return 0, st, time.Time{}, err
		}
	}
	return cpu, st, time.Now(), nil
}

// fireStats counts what a phase's calls came to.
type fireStats struct {
	sent, ok, rej, other int
	rejLat               []time.Duration
}

// fire sends calls at rate for dur, open-loop with Poisson arrivals, each
// from a tenant pick returns (an index into the client's connections and
// an API key), and waits until every call has ended. The calls are
// Allocate, or health checks where the key is "".
func fire(ctx context.Context, c *client, rate float64, dur, deadline time.Duration, rng *rand.Rand, pick func(*rand.Rand) (int, string)) fireStats {
	var fs fireStats
	if rate <= 0 {
		return fs
	}
	var mu sync.Mutex
	var calls sync.WaitGroup
	start := time.Now()
	next := time.Duration(0)
	for {
		next += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if next >= dur {
			break
		}
		if wait := time.Until(start.Add(next)); wait > 0 {
			select {
			case <-ctx.Done():
				calls.Wait()
				return fs
			case <-time.After(wait):
			}
		}
		conn, key := pick(rng)
		fs.sent++
		calls.Go(func() {
			cctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, metadata.Pairs(apiKeyHeader, key)), deadline)
			defer cancel()
			t0 := time.Now()
			var err error
			if key == "" {
				_, err = healthpb.NewHealthClient(c.conns[conn]).Check(cctx, &healthpb.HealthCheckRequest{})
			} else {
				_, err = inventoryv1.NewInventoryClient(c.conns[conn]).Allocate(cctx, &inventoryv1.AllocateRequest{Sku: "sku-00001", Quantity: 1})
			}
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			switch classify(err) {
			case outOK:
				fs.ok++
			case outRejected:
				fs.rej++
				fs.rejLat = append(fs.rejLat, lat)
			default:
				fs.other++
			}
		})
	}
	calls.Wait()
	return fs
}

// measureRejCost runs the rejection-cost scenario against the server p of
// variant v.
func measureRejCost(ctx context.Context, p *serverProc, iso *Isolation, v string, capacity float64, cfg Config) (RejCost, error) {
	rc := RejCost{Variant: v, Ratio: -1}
	c, err := dial(p.ready.GRPC)
	if err != nil {
		return rc, err
	}
	defer c.close()
	rd := cpuReader{hc: &http.Client{Timeout: time.Second}, stats: "http://" + p.ready.Stats + "/stats"}
	if iso != nil && iso.CgroupAcct != "" {
		rd.acct = filepath.Join(iso.CgroupAcct, "cpuacct.usage")
	}
	rc.CPUSource = rd.source()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7e1))
	servedRate := rejcostServedLoad * capacity
	rejectRate := min(rejcostRejectLoad*capacity, rejcostMaxRate)
	tenants := func(r *rand.Rand) (int, string) {
		u := r.Float64()
		for i := range numTenants {
			if u -= share(i); u < 0 {
				return i, apiKey(i)
			}
		}
		return numTenants - 1, apiKey(numTenants - 1)
	}
	conn := 0
	rejecter := func(*rand.Rand) (int, string) {
		// Spread the calls over the connections, as several clients of
		// one tenant would.
		conn = (conn + 1) % numTenants
		return conn, rejectKey
	}
	prober := func(*rand.Rand) (int, string) {
		conn = (conn + 1) % numTenants
		return conn, ""
	}
	idleDur, servedDur, rejectDur := rejcostDurations(cfg.Quick)

	// Warm both paths up: the first calls of a fresh server pay for
	// allocations the steady state does not.
	fire(ctx, c, servedRate, min(servedDur/4, time.Second), cfg.Deadline, rng, tenants)
	fire(ctx, c, rejectRate, min(rejectDur/4, time.Second), cfg.Deadline, rng, rejecter)
	time.Sleep(2 * rejcostSettle)

	phase := func(name string, rate float64, dur time.Duration, pick func(*rand.Rand) (int, string)) (RejPhase, error) {
		ph := RejPhase{Name: name, Rate: rate}
		cpu0, st0, t0, err := rd.read()
		if err != nil {
			return ph, err
		}
		var fs fireStats
		if rate > 0 {
			fs = fire(ctx, c, rate, dur, cfg.Deadline, rng, pick)
			time.Sleep(rejcostSettle)
		} else {
			select {
			case <-ctx.Done():
			case <-time.After(dur):
			}
		}
		if err := ctx.Err(); err != nil {
			return ph, err
		}
		cpu1, st1, t1, err := rd.read()
		if err != nil {
			return ph, err
		}
		slices.Sort(fs.rejLat)
		ph.Secs, ph.CPUSec = t1.Sub(t0).Seconds(), float64(cpu1-cpu0)/1e9
		ph.Sent, ph.OK, ph.Rej, ph.Other = fs.sent, fs.ok, fs.rej, fs.other
		ph.Handle, ph.Served = st1.Handled-st0.Handled, st1.Served-st0.Served
		ph.RejP50, ph.RejP99 = ms(fs.rejLat, 0.5), ms(fs.rejLat, 0.99)
		ph.Scale, ph.State = st1.Scale, st1.State
		time.Sleep(rejcostSettle)
		return ph, nil
	}
	idle, err := phase("idle", 0, idleDur, nil)
	if err != nil {
		return rc, err
	}
	served, err := phase("served", servedRate, servedDur, tenants)
	if err != nil {
		return rc, err
	}
	reject, err := phase("reject", rejectRate, rejectDur, rejecter)
	if err != nil {
		return rc, err
	}
	floor, err := phase("floor", rejectRate, rejectDur, prober)
	if err != nil {
		return rc, err
	}
	rc.Phases = []RejPhase{idle, served, reject, floor}
	rc.TapShed = reject.State != "" && reject.Scale < 1
	rc.compute()
	return rc, nil
}

// compute derives the per-call figures from the phases.
func (rc *RejCost) compute() {
	rc.Ratio = -1
	idle, served, reject := rc.phase("idle"), rc.phase("served"), rc.phase("reject")
	if idle == nil || served == nil || reject == nil || idle.Secs <= 0 {
		return
	}
	rc.IdleCPU = idle.CPUSec / idle.Secs
	if served.Handle == 0 {
		return
	}
	perServed := (served.CPUSec - rc.IdleCPU*served.Secs) / float64(served.Handle)
	rc.PerServedUs = perServed * 1e6
	if reject.Rej == 0 {
		return
	}
	net := reject.CPUSec - rc.IdleCPU*reject.Secs
	paid := float64(reject.Handle) * perServed
	perRej := (net - paid) / float64(reject.Rej)
	rc.PerRejectedUs = perRej * 1e6
	if net > 0 {
		rc.ServedShare = paid / net
	}
	rc.Saturated = float64(reject.Other) > 0.01*float64(max(reject.Sent, 1))
	if perServed > 0 && perRej >= 0 && !rc.Saturated {
		rc.Ratio = perRej / perServed
	}
	if floor := rc.phase("floor"); floor != nil && floor.OK > 0 {
		rc.FloorUs = (floor.CPUSec - rc.IdleCPU*floor.Secs) / float64(floor.OK) * 1e6
	}
}

// errNoRejCost is returned by rejCostFor when the results hold no direct
// measurement for the variant.
var errNoRejCost = errors.New("no direct measurement")

// rejCostFor returns variant v's direct measurement.
func (res *Results) rejCostFor(v string) (RejCost, error) {
	for _, rc := range res.RejCosts {
		if rc.Variant == v {
			return rc, nil
		}
	}
	return RejCost{}, errNoRejCost
}
