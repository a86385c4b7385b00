package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/loadreport"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// experimentConfig is what the experiments run.
type experimentConfig struct {
	Warmup, Measure time.Duration
	Conns           int
	SLO, Timeout    time.Duration
	// Pools are the replicas' pools; Hold how long a call holds a
	// connection. Loads are the offered loads, as multiples of the
	// fleet's capacity.
	Pools     []int
	Hold      time.Duration
	Loads     []float64
	Balancers string
	// Only names one experiment to run; MD and Chart are output files.
	Only, MD, Chart string
	// Start starts a server and returns its address and how to stop it.
	Start starter
}

// starter starts a server of c and returns its address and how to stop it.
type starter func(ctx context.Context, c replicaConfig) (addr string, stop func(), err error)

// processStarter runs each server as a process of its own: exe replica,
// on one CPU's worth of Go scheduler (GOMAXPROCS=1).
func processStarter(exe string, stderr io.Writer) starter {
	return func(ctx context.Context, c replicaConfig) (string, func(), error) {
		args := []string{"replica", "-pool", strconv.Itoa(c.Pool), "-hold", c.Hold.String(),
			"-reports=" + strconv.FormatBool(c.Reports), "-propagate=" + strconv.FormatBool(c.Propagate),
			"-trust-priority=" + strconv.FormatBool(c.TrustPriority), "-unlimited=" + strconv.FormatBool(c.Unlimited)}
		if c.HalveAfter > 0 {
			args = append(args, "-halve-after", c.HalveAfter.String())
		}
		if c.Forward != "" {
			args = append(args, "-forward", c.Forward)
		}
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return "", nil, err
		}
		if err := cmd.Start(); err != nil {
			return "", nil, err
		}
		stop := func() {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
		if err != nil || !ok {
			stop()
			return "", nil, fmt.Errorf("replica did not start: %q, %v", line, err)
		}
		return addr, stop, nil
	}
}

// inProcessStarter runs each server in this process, for tests.
func inProcessStarter(ctx context.Context, c replicaConfig) (string, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serveReplica(ctx, c, func(a string) { addrs <- a }) }()
	select {
	case a := <-addrs:
		return a, func() { cancel(); <-done }, nil
	case err := <-done:
		cancel()
		return "", nil, err
	}
}

// experiment runs the experiments cfg names and prints their tables.
func experiment(ctx context.Context, cfg experimentConfig, stdout io.Writer) error {
	var md strings.Builder
	w := io.MultiWriter(stdout, &md)
	capacity := 0.0
	for _, p := range cfg.Pools {
		capacity += float64(p) / cfg.Hold.Seconds()
	}
	if cfg.Only == "" || cfg.Only == "capacity" {
		measured, err := measureCapacity(ctx, cfg)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "## Capacity\n\nThe replicas without floodgate, each driven back to back by %d callers per connection of its pool for %v: %.0f calls/s in all, %.1f%% of their pools over their hold (%.0f/s).\n\n",
			capacityCallers, cfg.Measure/2, measured, 100*measured/capacity, capacity)
		capacity = measured
	}
	if cfg.Only == "" || cfg.Only == "balance" {
		fmt.Fprintf(w, "## Balancing: replicas of %v connections × %v (fleet capacity %.0f calls/s)\n\n", cfg.Pools, cfg.Hold, capacity)
		fmt.Fprintf(w, "| balancer | offered | served within %v | shed | shed by replica | p99 of served |\n|---|---|---|---|---|---|\n", cfg.SLO)
		for _, policy := range strings.Split(cfg.Balancers, ",") {
			for _, load := range cfg.Loads {
				r, err := balanceCell(ctx, cfg, policy, load*capacity)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "| %s | %.1f× (%.0f/s) | %.1f%% of offered, %.1f%% of capacity | %.2f%% | %s | %.0f ms |\n",
					policy, load, load*capacity, 100*r.inSLO/r.offered, 100*r.inSLO/cfg.Measure.Seconds()/capacity,
					100*r.shed/r.offered, r.shedByReplica(), r.p99.Seconds()*1000)
			}
		}
		fmt.Fprintln(w)
	}
	if cfg.Only == "" || cfg.Only == "halve" {
		if err := halveRun(ctx, cfg, capacity, w); err != nil {
			return err
		}
	}
	if cfg.Only == "" || cfg.Only == "chain" {
		if err := chainRun(ctx, cfg, w); err != nil {
			return err
		}
	}
	if cfg.MD != "" {
		return os.WriteFile(cfg.MD, []byte(md.String()), 0o644)
	}
	return nil
}

// capacityCallers is how many closed-loop callers per pool connection
// measure a replica's capacity: enough that a connection never idles.
const capacityCallers = 2

// measureCapacity starts each of the fleet's replicas alone, without
// floodgate, drives it back to back for half of cfg.Measure after a
// second's warm-up, and returns the calls per second they complete in all.
func measureCapacity(ctx context.Context, cfg experimentConfig) (float64, error) {
	var total float64
	for _, p := range cfg.Pools {
		a, stop, err := cfg.Start(ctx, replicaConfig{Pool: p, Hold: cfg.Hold, Unlimited: true})
		if err != nil {
			return 0, err
		}
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			stop()
			return 0, err
		}
		client := inventoryv1.NewInventoryClient(cc)
		var done atomic.Int64
		start := time.Now()
		from, end := start.Add(time.Second), start.Add(time.Second+cfg.Measure/2)
		var wg sync.WaitGroup
		for range capacityCallers * p {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
					_, err := client.Allocate(cctx, &inventoryv1.AllocateRequest{})
					cancel()
					if now := time.Now(); err == nil && now.After(from) && now.Before(end) {
						done.Add(1)
					}
				}
			})
		}
		wg.Wait()
		cc.Close()
		stop()
		total += float64(done.Load()) / (cfg.Measure / 2).Seconds()
	}
	return total, ctx.Err()
}

// cellResult is what one cell measured.
type cellResult struct {
	offered, inSLO, shed float64
	p99                  time.Duration
	replicas             []string
	picks, sheds         map[string]float64
	// shares are each replica's share of the calls sent in each bin of
	// the whole run (warm-up included), bins of binWidth.
	shares [][]float64
}

func (r cellResult) shedByReplica() string {
	total := 0.0
	for _, a := range r.replicas {
		total += r.sheds[a]
	}
	var parts []string
	for i, a := range r.replicas {
		share := 0.0
		if total > 0 {
			share = r.sheds[a] / total
		}
		parts = append(parts, fmt.Sprintf("r%d %.0f%%", i, 100*share))
	}
	return strings.Join(parts, ", ")
}

const binWidth = 250 * time.Millisecond

// startFleet starts cfg's replicas and returns their addresses and how to
// stop them all. halveAfter, if positive, halves the first replica's pool
// that long after it starts.
func startFleet(ctx context.Context, cfg experimentConfig, halveAfter time.Duration) ([]string, func(), error) {
	var addrs []string
	var stops []func()
	stopAll := func() {
		for _, s := range stops {
			s()
		}
	}
	for i, p := range cfg.Pools {
		c := replicaConfig{Pool: p, Hold: cfg.Hold, Reports: true}
		if i == 0 {
			c.HalveAfter = halveAfter
		}
		a, stop, err := cfg.Start(ctx, c)
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		addrs, stops = append(addrs, a), append(stops, stop)
	}
	return addrs, stopAll, nil
}

// balanceCell drives a fresh fleet at rate calls a second with the given
// balancer for cfg.Warmup+cfg.Measure and measures the second part.
func balanceCell(ctx context.Context, cfg experimentConfig, policy string, rate float64) (cellResult, error) {
	r, _, err := balanceCellAt(ctx, cfg, policy, rate, 0)
	return r, err
}

// balanceCellAt is balanceCell with the first replica's pool halved
// halveAfter after it starts; it also returns how long before the load
// the replicas' clocks started.
func balanceCellAt(ctx context.Context, cfg experimentConfig, policy string, rate float64, halveAfter time.Duration) (cellResult, time.Duration, error) {
	t0 := time.Now()
	addrs, stop, err := startFleet(ctx, cfg, halveAfter)
	if err != nil {
		return cellResult{}, 0, err
	}
	defer stop()
	sc := `{"loadBalancingConfig":[{"round_robin":{}}]}`
	if policy == "weighted_round_robin" {
		sc = loadreport.ServiceConfig
	}
	var eps []resolver.Endpoint
	for _, a := range addrs {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	var clients []inventoryv1.InventoryClient
	for range cfg.Conns {
		r := manual.NewBuilderWithScheme("fleet")
		r.InitialState(resolver.State{Endpoints: eps})
		cc, err := grpc.NewClient("fleet:///inventory", grpc.WithResolvers(r),
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc))
		if err != nil {
			return cellResult{}, 0, err
		}
		defer cc.Close()
		clients = append(clients, inventoryv1.NewInventoryClient(cc))
	}
	offset := time.Since(t0)
	calls := drive(ctx, cfg, clients, []stream{{rate: rate}})
	res := cellResult{replicas: addrs, picks: map[string]float64{}, sheds: map[string]float64{}}
	var lat []time.Duration
	bins := int((cfg.Warmup + cfg.Measure) / binWidth)
	counts := make([][]float64, bins)
	for i := range counts {
		counts[i] = make([]float64, len(addrs))
	}
	for _, c := range calls {
		if b := int(c.at / binWidth); b < bins {
			if i := slices.Index(addrs, c.peer); i >= 0 {
				counts[b][i]++
			}
		}
		if c.at < cfg.Warmup {
			continue
		}
		res.offered++
		res.picks[c.peer]++
		switch {
		case c.code == codes.OK:
			lat = append(lat, c.latency)
			if c.latency <= cfg.SLO {
				res.inSLO++
			}
		case c.code == codes.Unavailable || c.code == codes.ResourceExhausted:
			res.shed++
			res.sheds[c.peer]++
		}
	}
	res.p99 = quantile(lat, 0.99)
	for _, row := range counts {
		n := 0.0
		for _, v := range row {
			n += v
		}
		share := make([]float64, len(row))
		for i, v := range row {
			if n > 0 {
				share[i] = v / n
			} else {
				share[i] = math.NaN()
			}
		}
		res.shares = append(res.shares, share)
	}
	return res, offset, nil
}

// A stream is one caller's open-loop arrivals: rate calls a second, with
// md (an API key) on each.
type stream struct {
	name string
	rate float64
	md   metadata.MD
}

// call is one call's outcome; at is when it was sent, from the start.
type call struct {
	stream  string
	at      time.Duration
	latency time.Duration
	code    codes.Code
	peer    string
}

// drive sends each stream's Poisson arrivals, spread over clients, for
// cfg.Warmup+cfg.Measure, and returns every call once all have ended.
func drive(ctx context.Context, cfg experimentConfig, clients []inventoryv1.InventoryClient, streams []stream) []call {
	start := time.Now()
	end := cfg.Warmup + cfg.Measure
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	for si, s := range streams {
		for ci, client := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(si), uint64(ci)))
				rate := s.rate / float64(len(clients))
				next := time.Duration(0)
				for {
					next += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
					if next >= end || ctx.Err() != nil {
						return
					}
					if d := next - time.Since(start); d > 0 {
						time.Sleep(d)
					}
					wg.Add(1)
					go func(at time.Duration) {
						defer wg.Done()
						cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
						defer cancel()
						if s.md != nil {
							cctx = metadata.NewOutgoingContext(cctx, s.md)
						}
						var p peer.Peer
						t0 := time.Now()
						_, err := client.Allocate(cctx, &inventoryv1.AllocateRequest{}, grpc.Peer(&p))
						c := call{stream: s.name, at: at, latency: time.Since(t0), code: status.Code(err)}
						if errors.Is(err, context.DeadlineExceeded) {
							c.code = codes.DeadlineExceeded
						}
						if p.Addr != nil {
							c.peer = p.Addr.String()
						}
						mu.Lock()
						calls = append(calls, c)
						mu.Unlock()
					}(next)
				}
			}()
		}
	}
	wg.Wait()
	return calls
}

// quantile returns the q-quantile of ds (0 for none).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}
