// Package loadgen is the multitenant demo's load: simulated tenants sending
// open-loop Poisson calls to an inventory server (proto/inventory/v1), with
// deadlines and the retry policy of a well-behaved client, the live table of
// what became of their calls, the summary of a run, its chart, and the
// capacity probe that the ramp is a multiple of.
//
// A [Profile] (testdata/multitenant/profile.yaml) names the callers and the
// ramp of the offered load; [New] dials one connection per caller, and
// [Generator.Run] sends the calls, prints a table every few seconds and
// returns the run's [Summary], whose points [WriteChart] draws.
package loadgen

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/overload"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// APIKeyHeader is the metadata key that carries a caller's API key.
const APIKeyHeader = "x-api-key"

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

// A Generator offers open-loop load to an inventory server: each caller
// sends calls at the times its schedule draws, whether or not earlier calls
// have returned, as independent users do. Waiting for replies (a closed loop)
// would slow the load down exactly when the server is overloaded and hide
// the overload it is meant to show.
type Generator struct {
	prof     *Profile
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
	spec     CallerSpec
	conn     *grpc.ClientConn
	client   inventoryv1.InventoryClient
	md       metadata.MD
	sched    *schedule
	pick     *rand.Rand // chooses SKUs, on the caller's loop only
	stats    callerStats
	inflight atomic.Int64
}

// New dials one client connection per caller of prof to addr, which
// serves the SKUs skus. The ramp caller's rate makes the offered load
// prof.Ramp.Factor × capacity over a run of length; seed makes the arrivals
// reproducible. Close releases the connections.
func New(addr string, prof *Profile, capacity float64, length time.Duration, skus []string, seed uint64) (*Generator, error) {
	g := &Generator{prof: prof, capacity: capacity, length: length, skus: skus}
	for i, spec := range prof.Callers {
		c := &caller{spec: spec}
		conn, err := grpc.NewClient(addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(serviceConfig),
			grpc.WithStatsHandler(attemptCounter{&c.stats}),
		)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		c.conn, c.client = conn, inventoryv1.NewInventoryClient(conn)
		if spec.Key != "" {
			c.md = metadata.Pairs(APIKeyHeader, spec.Key)
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
func (g *Generator) rampRate(t time.Duration) float64 {
	return max(0, g.targetAt(t)-g.prof.SteadyRate())
}

func (g *Generator) rampPeak() float64 {
	return max(0, max(g.prof.Ramp.From, g.prof.Ramp.To)*g.capacity-g.prof.SteadyRate())
}

// targetAt is the load the ramp asks for at offset t, in calls per second.
func (g *Generator) targetAt(t time.Duration) float64 {
	return g.factorAt(t) * g.capacity
}

// factorAt is the ramp's multiple of the capacity at offset t.
func (g *Generator) factorAt(t time.Duration) float64 {
	x := 0.0
	if g.length > 0 {
		x = min(float64(t)/float64(g.length), 1)
	}
	return g.prof.Ramp.Factor(x)
}

// offeredAt is the load the callers offer at offset t, in calls per second:
// the ramp's target, or the steady callers' rates if those exceed it.
func (g *Generator) offeredAt(t time.Duration) float64 {
	return g.prof.SteadyRate() + g.rampRate(t)
}

// RunOptions says where [Generator.Run] prints and what of the server it
// shows besides the callers. The zero value prints nothing.
type RunOptions struct {
	// Gate, Ctrl and Counts are the server's when it runs in this process:
	// the tables and the chart then show the gate's CPU reading (its scale
	// too, without a controller) and the controller's state, and the
	// summary the counts of the server's decisions. Nil when the server is
	// elsewhere.
	Gate   *cpugate.Gate
	Ctrl   *overload.Controller
	Counts func() ServerCounts
	// Out receives the tables; nil discards them. Live redraws each table
	// over the last (for a terminal).
	Out  io.Writer
	Live bool
	// Tick is the sampling interval of the statistics and the chart, and
	// Every the time between two tables, rounded to ticks. Defaults 1s and
	// 2s.
	Tick, Every time.Duration
}

// Run sends the callers' calls until the run's length has passed or ctx is
// done, samples them every tick and prints a table every few ticks, and
// returns the run's summary once every call has finished. Calls in flight
// when ctx ends are cancelled.
func (g *Generator) Run(ctx context.Context, o RunOptions) *Summary {
	if o.Tick <= 0 {
		o.Tick = time.Second
	}
	if o.Every <= 0 {
		o.Every = 2 * time.Second
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	mon := newMonitor(g, o.Gate, o.Ctrl, o.Out, o.Live, int(max(o.Every/o.Tick, 1)))
	start := time.Now()
	done := make(chan struct{})
	go func() {
		g.send(ctx, start)
		close(done)
	}()
	ticker := time.NewTicker(o.Tick)
	defer ticker.Stop()
	last := start
	for {
		select {
		case <-done:
			// The calls still in flight when the schedule ended finished
			// after the last tick: count them in a last, shorter interval.
			if now := time.Now(); now.Sub(last) > o.Tick/10 {
				mon.sample(now.Sub(start), now.Sub(last))
			}
			return summarize(g, mon.points, o.Counts)
		case now := <-ticker.C:
			mon.sample(now.Sub(start), now.Sub(last))
			last = now
		}
	}
}

// send sends the callers' calls from start until the run's length has
// passed or ctx is done, and returns once every call has finished.
func (g *Generator) send(ctx context.Context, start time.Time) {
	g.start = start
	var calls, loops sync.WaitGroup
	for _, c := range g.callers {
		loops.Go(func() { g.loop(ctx, c, &calls) })
	}
	loops.Wait()
	calls.Wait()
}

func (g *Generator) loop(ctx context.Context, c *caller, calls *sync.WaitGroup) {
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
			c.stats.done(OutcomeDropped, 0)
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
	c.stats.done(Classify(err), time.Since(start))
}

// Close closes every caller's connection.
func (g *Generator) Close() {
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
