package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// callTimeout bounds every call of the driver: a call that takes longer
// counts as an error.
const callTimeout = time.Second

// A client is the driver's connections to one server or to the replicas
// of one variant: conns connections per address, in address order.
type client struct {
	conns []*grpc.ClientConn
	stubs []rlsv3.RateLimitServiceClient
}

func dial(addrs []string, conns int) (*client, error) {
	c := &client{}
	for range conns {
		for _, a := range addrs {
			conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				c.close()
				return nil, err
			}
			conn.Connect()
			c.conns = append(c.conns, conn)
			c.stubs = append(c.stubs, rlsv3.NewRateLimitServiceClient(conn))
		}
	}
	return c, nil
}

func (c *client) close() {
	for _, conn := range c.conns {
		conn.Close()
	}
}

// Measurement is one closed-loop or open-loop measurement of one variant.
type Measurement struct {
	Variant string `json:"variant"`
	Round   int    `json:"round,omitempty"`
	// Callers is the closed loop's callers; Rate the open loop's offered
	// arrivals per second.
	Callers int     `json:"callers,omitempty"`
	Rate    float64 `json:"rate,omitempty"`
	Seconds float64 `json:"seconds"`
	// Decisions are the calls answered OK or OVER_LIMIT within the
	// window; OverLimit those answered OVER_LIMIT; Errors the calls that
	// failed or timed out; Late the open loop's arrivals that found every
	// worker busy and were dropped.
	Decisions int64 `json:"decisions"`
	OverLimit int64 `json:"over_limit"`
	Errors    int64 `json:"errors"`
	Late      int64 `json:"late,omitempty"`
	// Fallbacks are floodgate-rls's decisions within the window that its
	// store could not make and its failure policy made instead.
	Fallbacks int64 `json:"fallbacks,omitempty"`
	// CPU-seconds over the window: the server processes', their
	// redis-server's (0 for a variant without Redis), the driver's.
	ServerCPU float64 `json:"server_cpu"`
	RedisCPU  float64 `json:"redis_cpu"`
	DriverCPU float64 `json:"driver_cpu"`
	// PerSecond is the decisions per second of wall time; PerCPUSecond
	// the decisions per CPU-second of the server and its redis-server.
	PerSecond    float64 `json:"decisions_per_s"`
	PerCPUSecond float64 `json:"decisions_per_cpu_s"`
	// Latencies in milliseconds: from the call's start (closed loop) or
	// its scheduled arrival (open loop) to its answer.
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	// Search holds the closed loop's tries at fewer callers, when the
	// first had a p99 above 5 ms: callers and p99 of each, in order.
	Search []Try `json:"search,omitempty"`
}

// A Try is one step of the search for the callers at which p99 ≤ 5 ms.
type Try struct {
	Callers int     `json:"callers"`
	P99     float64 `json:"p99_ms"`
	PerCPU  float64 `json:"per_cpu"`
}

// derive computes the rates from the counts.
func (m *Measurement) derive() {
	m.PerSecond = float64(m.Decisions) / m.Seconds
	m.PerCPUSecond = 0
	if cpu := m.ServerCPU + m.RedisCPU; cpu > 0 {
		m.PerCPUSecond = float64(m.Decisions) / cpu
	}
}

// OverShare is the share of decisions that were OVER_LIMIT.
func (m Measurement) OverShare() float64 {
	if m.Decisions == 0 {
		return 0
	}
	return float64(m.OverLimit) / float64(m.Decisions)
}

// cpuWindow reads the CPU time of the servers, of redis-server and of the
// driver at the window's start and end, and the servers' fallbacks just
// outside it, so that the scrape's CPU does not count.
type cpuWindow struct {
	servers   []int
	redis     int // 0: none
	procs     []*proc
	at        [2][3]float64
	fallbacks [2]int64
	err       error
}

func (w *cpuWindow) scrape(i int) {
	w.fallbacks[i] = 0
	for _, p := range w.procs {
		n, err := p.fallbacks()
		if err != nil {
			w.err = err
			return
		}
		w.fallbacks[i] += n
	}
}

func (w *cpuWindow) read(i int) {
	s, err := cpuOf(w.servers)
	if err != nil {
		w.err = err
		return
	}
	var r float64
	if w.redis != 0 {
		if r, err = cpuSeconds(w.redis); err != nil {
			w.err = err
			return
		}
	}
	d, err := cpuSeconds(os.Getpid())
	if err != nil {
		w.err = err
		return
	}
	w.at[i] = [3]float64{s, r, d}
}

func (w *cpuWindow) fill(m *Measurement) error {
	if w.err != nil {
		return w.err
	}
	m.ServerCPU = w.at[1][0] - w.at[0][0]
	m.RedisCPU = w.at[1][1] - w.at[0][1]
	m.DriverCPU = w.at[1][2] - w.at[0][2]
	m.Fallbacks = w.fallbacks[1] - w.fallbacks[0]
	m.derive()
	return nil
}

// recorder collects one goroutine's results within the window.
type recorder struct {
	lat       []time.Duration
	decisions int64
	over      int64
	errors    int64
}

func (r *recorder) record(resp *rlsv3.RateLimitResponse, err error, lat time.Duration) {
	switch {
	case err != nil:
		r.errors++
		return
	case resp.OverallCode == rlsv3.RateLimitResponse_OK:
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		r.over++
	default:
		r.errors++
		return
	}
	r.decisions++
	r.lat = append(r.lat, lat)
}

// summarize merges the recorders into m and computes its percentiles.
func summarize(m *Measurement, recs []*recorder) {
	var all []time.Duration
	for _, r := range recs {
		m.Decisions += r.decisions
		m.OverLimit += r.over
		m.Errors += r.errors
		all = append(all, r.lat...)
	}
	slices.Sort(all)
	q := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		i := min(len(all)-1, int(math.Ceil(p*float64(len(all))))-1)
		return float64(all[max(i, 0)]) / 1e6
	}
	m.P50, m.P90, m.P99, m.P999 = q(0.50), q(0.90), q(0.99), q(0.999)
	if len(all) > 0 {
		m.Max = float64(all[len(all)-1]) / 1e6
	}
}

// window times a measurement: warm-up from now, then the measured
// interval, with the CPU read at its two ends.
type window struct {
	from, to time.Time
	cpu      *cpuWindow
	done     chan struct{}
}

func startWindow(warm, measure time.Duration, cpu *cpuWindow) *window {
	w := &window{from: time.Now().Add(warm), cpu: cpu, done: make(chan struct{})}
	w.to = w.from.Add(measure)
	go func() {
		defer close(w.done)
		cpu.err = nil
		time.Sleep(time.Until(w.from))
		cpu.scrape(0)
		cpu.read(0)
		time.Sleep(time.Until(w.to))
		cpu.read(1)
		cpu.scrape(1)
	}()
	return w
}

func (w *window) in(t time.Time) bool { return !t.Before(w.from) && t.Before(w.to) }

// closedLoop runs callers closed-loop callers over the mix, each from its
// own offset into the pool, through warm and then measure; the calls
// answered within the measured interval count.
func closedLoop(ctx context.Context, cl *client, m *mix, callers int, warm, measure time.Duration, cpu *cpuWindow) (Measurement, error) {
	res := Measurement{Callers: callers, Seconds: measure.Seconds()}
	w := startWindow(warm, measure, cpu)
	recs := make([]*recorder, callers)
	var wg sync.WaitGroup
	for i := range callers {
		rec := &recorder{lat: make([]time.Duration, 0, 1<<14)}
		recs[i] = rec
		stub := cl.stubs[i%len(cl.stubs)]
		wg.Go(func() {
			for k := i * len(m.reqs) / callers; ctx.Err() == nil; k++ {
				req := m.reqs[k%len(m.reqs)]
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				t0 := time.Now()
				resp, err := stub.ShouldRateLimit(cctx, req)
				t1 := time.Now()
				cancel()
				if !t1.Before(w.to) {
					return
				}
				if w.in(t1) {
					rec.record(resp, err, t1.Sub(t0))
				}
			}
		})
	}
	wg.Wait()
	<-w.done
	if err := ctx.Err(); err != nil {
		return res, err
	}
	summarize(&res, recs)
	return res, cpu.fill(&res)
}

// openWorkers bounds the open loop's calls in flight: an arrival that
// finds them all busy is dropped and counted Late.
const openWorkers = 512

// openLoop offers Poisson arrivals at rate per second over the mix
// through warm and then measure. A call's latency runs from its scheduled
// arrival, so that the driver's own delays count against the server, not
// for it.
func openLoop(ctx context.Context, cl *client, m *mix, rate float64, seed uint64, warm, measure time.Duration, cpu *cpuWindow) (Measurement, error) {
	res := Measurement{Rate: rate, Seconds: measure.Seconds()}
	type job struct {
		at  time.Time
		req *rlsv3.RateLimitRequest
	}
	jobs := make(chan job, openWorkers)
	w := startWindow(warm, measure, cpu)
	recs := make([]*recorder, openWorkers)
	var wg sync.WaitGroup
	for i := range openWorkers {
		rec := &recorder{}
		recs[i] = rec
		stub := cl.stubs[i%len(cl.stubs)]
		wg.Go(func() {
			for j := range jobs {
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				resp, err := stub.ShouldRateLimit(cctx, j.req)
				t1 := time.Now()
				cancel()
				if w.in(t1) {
					rec.record(resp, err, t1.Sub(j.at))
				}
			}
		})
	}
	var late atomic.Int64
	r := rand.New(rand.NewPCG(seed, 0x09e9))
	next := time.Now()
	k := 0
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(w.to) {
			break
		}
		for !next.After(now) {
			select {
			case jobs <- job{at: next, req: m.reqs[k%len(m.reqs)]}:
			default:
				if w.in(next) {
					late.Add(1)
				}
			}
			k++
			next = next.Add(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
		}
		time.Sleep(time.Until(next))
	}
	close(jobs)
	wg.Wait()
	<-w.done
	if err := ctx.Err(); err != nil {
		return res, err
	}
	summarize(&res, recs)
	res.Late = late.Load()
	return res, cpu.fill(&res)
}

func (m Measurement) String() string {
	return fmt.Sprintf("%s: %.0f decisions/s, %.0f per CPU-s (server %.2f + redis %.2f CPU-s, driver %.2f), p50 %.2f ms, p99 %.2f ms, over limit %.1f%%, errors %d, fallbacks %d",
		m.Variant, m.PerSecond, m.PerCPUSecond, m.ServerCPU, m.RedisCPU, m.DriverCPU, m.P50, m.P99, 100*m.OverShare(), m.Errors, m.Fallbacks)
}
