package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// apiKeyHeader is the metadata key that carries a caller's API key.
const apiKeyHeader = "x-api-key"

// serviceConfig is every simulated caller's client service config. The retry
// policy is what a well-behaved client of a floodgate server runs: it retries
// a shed call at most twice, waiting the server's grpc-retry-pushback-ms when
// the rejection carries one (grpc-go then skips its own backoff, and a
// pushback of -1 stops the retries), and the retry throttle stops retrying
// altogether while most calls on the channel fail, so retries cannot
// multiply an overload. grpc-go retries only calls that the server rejected
// before running the handler, which is where floodgate rejects.
const serviceConfig = `{
  "methodConfig": [{
    "name": [{"service": "inventory.v1.Inventory"}],
    "retryPolicy": {
      "maxAttempts": 3,
      "initialBackoff": "0.05s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
    }
  }],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}`

// A schedule draws the arrival times of a Poisson process whose rate may
// change over time, rate(t) ≤ peak, by thinning: candidates arrive at the
// constant rate peak, and each is kept with probability rate(t)/peak. The
// result is exact for any rate function, and the same seed gives the same
// arrivals. A schedule is not safe for concurrent use.
type schedule struct {
	rng  *rand.Rand
	rate func(t time.Duration) float64
	peak float64
	t    float64 // seconds from the start to the last candidate
}

// newSchedule returns a schedule of arrivals at rate(t) calls per second,
// which must never exceed peak.
func newSchedule(seed1, seed2 uint64, peak float64, rate func(time.Duration) float64) *schedule {
	return &schedule{rng: rand.New(rand.NewPCG(seed1, seed2)), rate: rate, peak: peak}
}

// constantRate returns a rate function for a homogeneous process.
func constantRate(r float64) func(time.Duration) float64 {
	return func(time.Duration) float64 { return r }
}

// next returns the next arrival's offset from the start, and false once the
// next arrival would come at or after end.
func (s *schedule) next(end time.Duration) (time.Duration, bool) {
	if !(s.peak > 0) {
		return 0, false
	}
	limit := end.Seconds()
	for {
		s.t += s.rng.ExpFloat64() / s.peak
		if s.t >= limit {
			s.t = math.Inf(1) // stays past the end
			return 0, false
		}
		at := time.Duration(s.t * float64(time.Second))
		if r := s.rate(at); r >= s.peak || s.rng.Float64()*s.peak < r {
			return at, true
		}
	}
}

// A generator offers open-loop load to an inventory server: each caller
// sends calls at the times its schedule draws, whether or not earlier calls
// have returned, as independent users do. Waiting for replies (a closed loop)
// would slow the load down exactly when the server is overloaded and hide
// the overload it is meant to show.
type generator struct {
	prof     *profile
	capacity float64       // calls/s the ramp is a multiple of
	length   time.Duration // the run's length
	skus     []string
	callers  []*caller
	start    time.Time
}

// A caller is one simulated tenant (or the anonymous callers): its own
// connection, so that one caller's retry throttle never affects another's,
// its schedule and its statistics.
type caller struct {
	spec     callerSpec
	conn     *grpc.ClientConn
	client   inventoryv1.InventoryClient
	md       metadata.MD
	sched    *schedule
	pick     *rand.Rand // chooses SKUs, on the caller's loop only
	stats    callerStats
	inflight atomic.Int64
}

// newGenerator dials one client connection per caller of prof to addr.
// The ramp caller's rate makes the offered load ramp.factor × capacity over
// a run of length; seed makes the arrivals reproducible.
func newGenerator(addr string, prof *profile, capacity float64, length time.Duration, skus []string, seed uint64) (*generator, error) {
	g := &generator{prof: prof, capacity: capacity, length: length, skus: skus}
	for i, spec := range prof.Callers {
		c := &caller{spec: spec}
		conn, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(serviceConfig),
			grpc.WithStatsHandler(attemptCounter{&c.stats}),
		)
		if err != nil {
			g.close()
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		c.conn, c.client = conn, inventoryv1.NewInventoryClient(conn)
		if spec.Key != "" {
			c.md = metadata.Pairs(apiKeyHeader, spec.Key)
		}
		rate, peak := constantRate(spec.Rate), spec.Rate
		if spec.Ramp {
			rate, peak = g.rampRate, g.rampPeak()
		}
		c.sched = newSchedule(seed, uint64(i), peak, rate)
		c.pick = rand.New(rand.NewPCG(seed, uint64(i)+1<<32))
		g.callers = append(g.callers, c)
	}
	return g, nil
}

// rampRate is the ramp caller's rate at offset t: what the ramp asks for
// beyond the steady callers.
func (g *generator) rampRate(t time.Duration) float64 {
	return max(0, g.targetAt(t)-g.prof.steadyRate())
}

func (g *generator) rampPeak() float64 {
	return max(0, max(g.prof.Ramp.From, g.prof.Ramp.To)*g.capacity-g.prof.steadyRate())
}

// targetAt is the load the ramp asks for at offset t, in calls per second.
func (g *generator) targetAt(t time.Duration) float64 {
	return g.factorAt(t) * g.capacity
}

// factorAt is the ramp's multiple of the capacity at offset t.
func (g *generator) factorAt(t time.Duration) float64 {
	x := 0.0
	if g.length > 0 {
		x = min(float64(t)/float64(g.length), 1)
	}
	return g.prof.Ramp.factor(x)
}

// offeredAt is the load the callers offer at offset t, in calls per second:
// the ramp's target, or the steady callers' rates if those exceed it.
func (g *generator) offeredAt(t time.Duration) float64 {
	return g.prof.steadyRate() + g.rampRate(t)
}

// run sends the callers' calls from start until the run's length has passed
// or ctx is done, and returns once every call has finished. Calls in flight
// when ctx ends are cancelled.
func (g *generator) run(ctx context.Context, start time.Time) {
	g.start = start
	var calls, loops sync.WaitGroup
	for _, c := range g.callers {
		loops.Go(func() { g.loop(ctx, c, &calls) })
	}
	loops.Wait()
	calls.Wait()
}

func (g *generator) loop(ctx context.Context, c *caller, calls *sync.WaitGroup) {
	deadline := time.Duration(g.prof.Deadline)
	limit := int64(g.prof.MaxInFlight)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		at, ok := c.sched.next(g.length)
		if !ok {
			return
		}
		// A late loop does not sleep: the arrivals it owes go out at once,
		// so the offered rate holds even when the scheduler runs behind.
		if d := time.Until(g.start.Add(at)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		c.stats.offered()
		if c.inflight.Load() >= limit {
			c.stats.done(outcomeDropped, 0)
			continue
		}
		c.inflight.Add(1)
		sku := g.skus[c.pick.IntN(len(g.skus))]
		calls.Go(func() {
			defer c.inflight.Add(-1)
			c.call(ctx, deadline, sku)
		})
	}
}

// call makes one call with its deadline and records the outcome.
func (c *caller) call(ctx context.Context, deadline time.Duration, sku string) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	if c.md != nil {
		ctx = metadata.NewOutgoingContext(ctx, c.md)
	}
	start := time.Now()
	var err error
	switch c.spec.Method {
	case methodGetStock:
		_, err = c.client.GetStock(ctx, &inventoryv1.GetStockRequest{Sku: sku})
	default:
		_, err = c.client.Allocate(ctx, &inventoryv1.AllocateRequest{Sku: sku, Quantity: 1})
	}
	c.stats.done(classify(err), time.Since(start))
}

// close closes every caller's connection.
func (g *generator) close() {
	for _, c := range g.callers {
		if c.conn != nil {
			c.conn.Close()
		}
	}
}

// attemptCounter counts a caller's attempts on the wire: one per call, plus
// one per retry. Transparent retries (of attempts that never reached the
// server application) are not counted.
type attemptCounter struct{ s *callerStats }

func (a attemptCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}

func (a attemptCounter) HandleRPC(_ context.Context, st stats.RPCStats) {
	if b, ok := st.(*stats.Begin); ok && !b.IsTransparentRetryAttempt {
		a.s.attempt()
	}
}

func (a attemptCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (a attemptCounter) HandleConn(context.Context, stats.ConnStats) {}
