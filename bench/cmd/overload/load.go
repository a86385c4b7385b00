package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/throttle"
)

// A Segment is a stretch of a scenario at one offered load.
type Segment struct {
	Name string `json:"name"`
	// Dur is the segment's length.
	Dur time.Duration `json:"dur"`
	// Load is the offered load as a multiple of the measured capacity.
	Load float64 `json:"load"`
	// HeavyX multiplies the heavy tenant's rate (the tenant burst); 0 is 1.
	HeavyX float64 `json:"heavy_x,omitempty"`
	// CostX multiplies the handler's cost: 2 doubles it (capacity change);
	// 0 is 1.
	CostX float64 `json:"cost_x,omitempty"`
	// Skip is how long after the segment's start its measurement window
	// begins: the transition is left out of the converged figures.
	Skip time.Duration `json:"skip"`
	// Measure marks the segments that get a window of their own.
	Measure bool `json:"measure"`
	// Client is how the segment's clients treat rejections: clientOnce
	// (every scenario but the retry storm), clientNaive or
	// clientThrottled.
	Client string `json:"client,omitempty"`
}

// rate returns tenant i's rate in calls per second during s.
func (s Segment) rate(i int, capacity float64) float64 {
	r := s.Load * capacity * share(i)
	if i == heavyTenant && s.HeavyX > 0 {
		r *= s.HeavyX
	}
	return r
}

// A Scenario is a sequence of segments against one fresh server.
type Scenario struct {
	Name     string    `json:"name"`
	Title    string    `json:"title"`
	Segments []Segment `json:"segments"`
	// Neighbour runs a CPU-burning neighbour beside the server for the
	// whole scenario.
	Neighbour bool `json:"neighbour,omitempty"`
	// Settle is, in the capacity change, how long after the change its
	// "settled" window begins: the window in which goodput must have
	// reached the new capacity.
	Settle time.Duration `json:"settle,omitempty"`
}

// Duration returns the scenario's length.
func (sc Scenario) Duration() time.Duration {
	var d time.Duration
	for _, s := range sc.Segments {
		d += s.Dur
	}
	return d
}

// segmentAt returns the index of the segment at offset t, or -1 after the
// end.
func (sc Scenario) segmentAt(t time.Duration) int {
	for i, s := range sc.Segments {
		if t < s.Dur {
			return i
		}
		t -= s.Dur
	}
	return -1
}

// segmentStart returns the offset at which segment i starts.
func (sc Scenario) segmentStart(i int) time.Duration {
	var d time.Duration
	for _, s := range sc.Segments[:i] {
		d += s.Dur
	}
	return d
}

// Outcome of a call, as the client sees it.
type outcome uint8

const (
	outOK       outcome = iota
	outRejected         // RESOURCE_EXHAUSTED or UNAVAILABLE: admission control said no
	outDeadline         // DEADLINE_EXCEEDED
	outOther
)

func classify(err error) outcome {
	switch status.Code(err) {
	case codes.OK:
		return outOK
	case codes.ResourceExhausted, codes.Unavailable:
		return outRejected
	case codes.DeadlineExceeded:
		return outDeadline
	}
	return outOther
}

// callRec is one call: when it started (from the scenario's start), how
// long it took, whose it was and how it ended. A call whose client retries
// is one record, from its first attempt to the end of its last; Dropped
// tells that the last was dropped on the client by its throttle.
type callRec struct {
	At      time.Duration
	Lat     time.Duration
	Tenant  uint8
	Out     outcome
	Dropped bool
}

// probeRec is one health probe.
type probeRec struct {
	At time.Duration
	OK bool
}

// pollRec is one reading of the server's stats.
type pollRec struct {
	At time.Duration
	serverStats
}

// rawRun is everything one scenario recorded against one server.
type rawRun struct {
	Calls  []callRec
	Probes []probeRec
	Polls  []pollRec
	Sent   [numTenants]int
	// Wire tells that the scenario's clients retry (see
	// Scenario.retries), and Attempts are then every attempt that went on
	// the network.
	Wire     bool
	Attempts []attemptRec
}

// loadConfig is what the load generator needs besides the scenario.
type loadConfig struct {
	Capacity  float64
	Deadline  time.Duration
	Seed      uint64
	ThrottleK float64 // 0: the throttle's default
}

// client is the load generator's connections to one server: one per
// tenant, as ten separate clients would have, and one for health probes;
// in the retry storm, also a throttled one per tenant (dialThrottled).
type client struct {
	conns     [numTenants]*grpc.ClientConn
	throttled [numTenants]*grpc.ClientConn
	health    *grpc.ClientConn
}

func dial(addr string) (*client, error) {
	c := &client{}
	var err error
	for i := range c.conns {
		// The wire counter does nothing to calls that carry no trace,
		// that is, outside the retry storm.
		if c.conns[i], err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(wireInterceptor)); err != nil {
			c.close()
			return nil, err
		}
	}
	if c.health, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		c.close()
		return nil, err
	}
	if err := warmUp(append(c.conns[:], c.health)...); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// warmUp connects conns before the clock starts, so that the first calls
// do not pay for the handshake.
func warmUp(conns ...*grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, conn := range conns {
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			return fmt.Errorf("warm-up health check: %w", err)
		}
	}
	return nil
}

func (c *client) close() {
	for _, conn := range append(append(c.conns[:], c.throttled[:]...), c.health) {
		if conn != nil {
			conn.Close()
		}
	}
}

// runScenario drives sc against the server p: open-loop Poisson arrivals
// per tenant, a deadline on every call and no retries (but where the
// segment's clients retry), a health probe every second and a look at the
// server's stats every 250 ms. It returns when the scenario is over and
// every call has ended.
func runScenario(ctx context.Context, p *serverProc, sc Scenario, cfg loadConfig) (*rawRun, error) {
	c, err := dial(p.ready.GRPC)
	if err != nil {
		return nil, err
	}
	defer c.close()
	if slices.ContainsFunc(sc.Segments, func(s Segment) bool { return s.Client == clientThrottled }) {
		if err := c.dialThrottled(p.ready.GRPC, cfg.ThrottleK); err != nil {
			return nil, err
		}
	}

	run := &rawRun{Wire: sc.retries()}
	var mu sync.Mutex
	var calls sync.WaitGroup
	start := time.Now()
	total := sc.Duration()
	ctx, cancel := context.WithTimeout(ctx, total+cfg.Deadline+2*time.Second)
	defer cancel()
	record := func(t0 time.Time, err error) {
		a := attemptRec{At: t0.Sub(start), Lat: time.Since(t0), Out: classify(err)}
		mu.Lock()
		run.Attempts = append(run.Attempts, a)
		mu.Unlock()
	}

	var loops sync.WaitGroup
	for i := range numTenants {
		loops.Go(func() {
			inv := inventoryv1.NewInventoryClient(c.conns[i])
			var throttled inventoryv1.InventoryClient
			if c.throttled[i] != nil {
				throttled = inventoryv1.NewInventoryClient(c.throttled[i])
			}
			md := metadata.Pairs(apiKeyHeader, apiKey(i))
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1))
			next := time.Duration(0)
			sent := 0
			for {
				seg := sc.segmentAt(next)
				if seg < 0 {
					break
				}
				r := sc.Segments[seg].rate(i, cfg.Capacity)
				if r <= 0 {
					next = sc.segmentStart(seg) + sc.Segments[seg].Dur
					continue
				}
				// Poisson arrivals: exponential gaps at the rate in force.
				// A gap that crosses into a segment of another rate is
				// redrawn there, which the process's lack of memory allows.
				gap := time.Duration(rng.ExpFloat64() / r * float64(time.Second))
				end := sc.segmentStart(seg) + sc.Segments[seg].Dur
				if next+gap >= end {
					next = end
					continue
				}
				next += gap
				if wait := time.Until(start.Add(next)); wait > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(wait):
					}
				}
				sent++
				at := next
				mode := sc.Segments[seg].Client
				calls.Go(func() {
					cctx, ccancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), cfg.Deadline)
					defer ccancel()
					if run.Wire {
						cctx = context.WithValue(cctx, wireKey{}, &wireTrace{record: record})
					}
					req := &inventoryv1.AllocateRequest{Sku: "sku-00001", Quantity: 1}
					t0 := time.Now()
					var err error
					switch mode {
					case clientNaive:
						err = callNaive(cctx, func(ctx context.Context) error {
							_, err := inv.Allocate(ctx, req)
							return err
						})
					case clientThrottled:
						_, err = throttled.Allocate(cctx, req)
					default:
						_, err = inv.Allocate(cctx, req)
					}
					rec := callRec{At: at, Lat: time.Since(t0), Tenant: uint8(i), Out: classify(err), Dropped: errors.Is(err, throttle.ErrThrottled)}
					mu.Lock()
					run.Calls = append(run.Calls, rec)
					mu.Unlock()
				})
			}
			mu.Lock()
			run.Sent[i] = sent
			mu.Unlock()
		})
	}

	// Segment boundaries: the capacity change signals the server.
	loops.Go(func() {
		cost := 1.0
		for i, s := range sc.Segments {
			want := max(s.CostX, 1)
			if want != cost {
				if wait := time.Until(start.Add(sc.segmentStart(i))); wait > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(wait):
					}
				}
				sig := syscall.SIGUSR1
				if want == 1 {
					sig = syscall.SIGUSR2
				}
				_ = p.signal(sig)
				cost = want
			}
		}
	})

	// Health probes, once a second, with the same deadline.
	loops.Go(func() {
		hc := healthpb.NewHealthClient(c.health)
		for k := 0; ; k++ {
			at := time.Duration(k)*time.Second + 500*time.Millisecond
			if at >= total {
				return
			}
			if wait := time.Until(start.Add(at)); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			pctx, pcancel := context.WithTimeout(ctx, cfg.Deadline)
			resp, err := hc.Check(pctx, &healthpb.HealthCheckRequest{})
			pcancel()
			ok := err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
			mu.Lock()
			run.Probes = append(run.Probes, probeRec{At: at, OK: ok})
			mu.Unlock()
		}
	})

	// The server's stats, every 250 ms until the last call has ended.
	pollDone := make(chan struct{})
	var poller sync.WaitGroup
	poller.Go(func() {
		hc := &http.Client{Timeout: 200 * time.Millisecond}
		url := "http://" + p.ready.Stats + "/stats"
		poll := func() {
			st, err := fetchStats(hc, url)
			if err != nil {
				return
			}
			mu.Lock()
			run.Polls = append(run.Polls, pollRec{At: time.Since(start), serverStats: st})
			mu.Unlock()
		}
		poll()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-pollDone:
				poll()
				return
			case <-t.C:
				poll()
			}
		}
	})

	loops.Wait()
	calls.Wait()
	close(pollDone)
	poller.Wait()
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	return run, nil
}

func fetchStats(hc *http.Client, url string) (serverStats, error) {
	var st serverStats
	resp, err := hc.Get(url)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// percentile returns the q-quantile (0..1) of sorted durations, NaN when
// there are none.
func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i]) / float64(time.Millisecond)
}
