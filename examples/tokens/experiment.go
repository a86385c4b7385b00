package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	completionv1 "github.com/floodgate-go/floodgate/proto/completion/v1"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/tenant"
)

// The strategies, by name, in the order of the report.
const (
	stratChargeAtEnd    = "charge-at-end"
	stratCheckThenCount = "check-then-count"
	stratFloodgate      = "floodgate"
)

var allStrategies = []string{stratChargeAtEnd, stratCheckThenCount, stratFloodgate}

// A store is what the strategies need of floodgate's stores: keyed.Map and
// redisstore.Store are both.
type store interface {
	floodgate.Reserver
	floodgate.Peeker
}

var (
	_ store = (*keyed.Map)(nil)
	_ store = (*redisstore.Store)(nil)
)

// A config is one run of the experiment.
type config struct {
	// Quota is a tenant's tokens a minute, Burst its bucket's size and
	// Debt its debt limit (0: one burst, floodgate.NoDebt: none).
	Quota, Burst, Debt int
	Tenants            int
	// Callers is the closed-loop callers per tenant and strategy, unless
	// Demand is positive: open-loop arrivals offering Demand times the
	// quota, in replies of 1,000 tokens on average.
	Callers int
	Demand  float64
	// Estimate is what callers state: "max" (nothing: the server's
	// estimate, the most a reply costs), "half" (half of each reply) or a
	// number of tokens.
	Estimate string
	Duration time.Duration
	Backoff  time.Duration
	Seed     uint64
	// Sim runs in simulated time, without gRPC.
	Sim bool
	// Redis is the address of the Redis the buckets live on; "" keeps
	// them in memory.
	Redis string
	// RedisDeadline bounds each decision on Redis (0: the store's
	// default, 50 ms; in simulated time, 1 s), past which the store's
	// failure policy decides, in a bucket of each process's own.
	RedisDeadline time.Duration
	// Workers is the server processes sharing the buckets on Redis, and
	// KillAfter when the first of them is killed (0: never).
	Workers   int
	KillAfter time.Duration
	// Strategies are the strategies run side by side.
	Strategies []string
	// Chart is the PNG to draw; "" draws none.
	Chart string
}

func defaultConfig() config {
	return config{
		Quota: 100_000, Burst: 20_000, Tenants: 1, Callers: 64, Estimate: "max",
		Duration: 2 * time.Minute, Backoff: 100 * time.Millisecond, Seed: 1, Workers: 1,
		Strategies: allStrategies, Chart: "tokens.png",
	}
}

func (c *config) validate() error {
	switch {
	case c.Quota < 1:
		return fmt.Errorf("-quota %d: want at least 1 token a minute", c.Quota)
	case c.Burst < maxReply || c.Burst > floodgate.MaxBurst:
		return fmt.Errorf("-burst %d: want from %d (a reply's most tokens, the estimate) to %d", c.Burst, maxReply, floodgate.MaxBurst)
	case c.Debt < floodgate.NoDebt || c.Debt > floodgate.MaxBurst:
		return fmt.Errorf("-debt %d: want -1 (none), 0 (one burst) or a number of tokens", c.Debt)
	case c.Tenants < 1:
		return fmt.Errorf("-tenants %d: want at least 1", c.Tenants)
	case c.Demand < 0 || c.Demand == 0 && c.Callers < 1:
		return fmt.Errorf("-callers %d, -demand %v: want callers ≥ 1, or a positive demand", c.Callers, c.Demand)
	case c.RedisDeadline < 0:
		return fmt.Errorf("-redis-deadline %v: want a positive deadline, or 0 for the store's", c.RedisDeadline)
	case c.Duration <= 0 || c.Backoff <= 0:
		return fmt.Errorf("-duration %v, -backoff %v: want both positive", c.Duration, c.Backoff)
	case c.Workers < 1 || c.Workers > 1 && c.Redis == "":
		return fmt.Errorf("-workers %d: want 1, or more with -redis (workers share buckets on Redis)", c.Workers)
	case c.KillAfter < 0 || c.KillAfter > 0 && c.Workers < 2:
		return fmt.Errorf("-kill-after %v: want a time with -workers 2 or more", c.KillAfter)
	case len(c.Strategies) == 0:
		return fmt.Errorf("-strategies: want at least one of %s", strings.Join(allStrategies, ", "))
	}
	for _, s := range c.Strategies {
		if !slices.Contains(allStrategies, s) {
			return fmt.Errorf("-strategies: %q is none of %s", s, strings.Join(allStrategies, ", "))
		}
	}
	if _, err := c.estimator(); err != nil {
		return err
	}
	return nil
}

// limit is a tenant's bucket.
func (c *config) limit() floodgate.Limit {
	return floodgate.Limit{Rate: float64(c.Quota) / 60, Burst: c.Burst, Debt: c.Debt}
}

func (c *config) quota() quota { return quota{Limit: c.limit(), Estimate: maxReply} }

// estimator returns what a caller states for a reply of n tokens.
func (c *config) estimator() (func(n int) int, error) {
	switch c.Estimate {
	case "max":
		return func(int) int { return noEstimate }, nil
	case "half":
		return func(n int) int { return n / 2 }, nil
	}
	v, err := strconv.Atoi(c.Estimate)
	if err != nil || v < 0 || v > maxReply {
		return nil, fmt.Errorf("-estimate %q: want max, half or a number of tokens from 0 to %d", c.Estimate, maxReply)
	}
	return func(int) int { return v }, nil
}

// shortEstimates reports whether callers may state less than a reply
// costs, so that settles charge beyond the estimates, into debt.
func (c *config) shortEstimates() bool { return c.Estimate != "max" }

func (c *config) tenants() []string {
	out := make([]string, c.Tenants)
	for i := range out {
		out[i] = "tenant-" + strconv.Itoa(i+1)
	}
	return out
}

// newStore returns strategy's store: in memory, or on Redis under prefix,
// reading clk (nil: its default clock).
func newStore(cfg config, strategy string, client redis.UniversalClient, prefix string, clk floodgate.Clock) (store, error) {
	if client == nil {
		return keyed.New(keyed.WithClock(clk))
	}
	opts := []redisstore.Option{redisstore.WithPrefix(prefix), redisstore.WithName(strategy)}
	deadline := cfg.RedisDeadline
	if clk != nil {
		opts = append(opts, redisstore.WithClientClock(clk))
		if deadline == 0 {
			// Simulated time stands still while Redis answers: a call
			// that a loaded machine makes slow costs no simulated time,
			// and the failure policy must not decide it.
			deadline = time.Second
		}
	}
	if deadline > 0 {
		opts = append(opts, redisstore.WithDeadline(deadline))
	}
	return redisstore.New(client, opts...)
}

// interceptor returns strategy's interceptor over st, whose Limiter (for
// floodgate) reads clk (nil: the wall clock).
func interceptor(cfg config, strategy string, st store, clk floodgate.Clock) (grpc.StreamServerInterceptor, error) {
	switch strategy {
	case stratChargeAtEnd:
		return chargeAtEnd(st, cfg.quota()), nil
	case stratCheckThenCount:
		return checkThenCount(st, cfg.quota()), nil
	}
	table, err := tenant.Parse("tenants.yaml", []byte(cfg.tenantConfig()))
	if err != nil {
		return nil, err
	}
	lim, err := reserveSettle(st, table, clk)
	if err != nil {
		return nil, err
	}
	return lim.StreamServerInterceptor(), nil
}

// tenantConfig is floodgate's tenant config of cfg's tenants and quota.
func (c *config) tenantConfig() string {
	debt := "" // one burst
	switch {
	case c.Debt == floodgate.NoDebt:
		debt = "0"
	case c.Debt > 0:
		debt = strconv.Itoa(c.Debt)
	}
	return tenantConfig(c.tenants(), c.Quota, c.Burst, debt)
}

// runPrefix returns a Redis key prefix of this run's own, so that a run
// meets no bucket an earlier one left.
func runPrefix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return "tokens-" + hex.EncodeToString(b)
}

// A starter starts worker i, serving every strategy of cfg with buckets
// under prefix, and returns each strategy's address and a func that kills
// the worker at once.
type starter func(ctx context.Context, cfg config, prefix string, i int) (addrs map[string]string, kill func(), err error)

// experiment runs cfg and returns its report.
func experiment(ctx context.Context, cfg config, start starter) (*report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	estimate, _ := cfg.estimator()
	var client redis.UniversalClient
	if cfg.Redis != "" {
		client = redis.NewClient(&redis.Options{Addr: cfg.Redis})
		defer client.Close()
		if err := client.Ping(ctx).Err(); err != nil {
			return nil, fmt.Errorf("redis %s: %w", cfg.Redis, err)
		}
	}
	prefix := runPrefix()
	l := &load{duration: cfg.Duration, tenants: cfg.tenants(), callers: cfg.Callers, estimate: estimate,
		backoff: cfg.Backoff, workers: cfg.Workers, seed: cfg.Seed}
	if cfg.Demand > 0 {
		l.callers, l.rate = 0, cfg.Demand*float64(cfg.Quota)/60/meanReply
	}
	var targets []target
	if cfg.Sim {
		sc := newSimClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		l.clock, l.start = sc, sc.Now()
		for _, s := range cfg.Strategies {
			t := &simTarget{clock: sc, start: l.start, model: &model{clock: sc}}
			for i := range cfg.Workers {
				st, err := newStore(cfg, s, client, prefix, sc)
				if err != nil {
					return nil, err
				}
				wk := simWorker{}
				if i == 0 {
					wk.killAt = cfg.KillAfter
				}
				if wk.killAt > 0 {
					st = &mortal{store: st, dead: func() bool { return sc.Now().Sub(l.start) >= wk.killAt }}
				}
				if wk.intercept, err = interceptor(cfg, s, st, sc); err != nil {
					return nil, err
				}
				t.workers = append(t.workers, wk)
			}
			targets = append(targets, t)
		}
	} else {
		conns := make([]map[string]*grpc.ClientConn, cfg.Workers)
		kills := make([]func(), cfg.Workers)
		defer func() {
			for i, kill := range kills {
				if kill != nil {
					kill()
				}
				for _, c := range conns[i] {
					c.Close()
				}
			}
		}()
		for i := range cfg.Workers {
			addrs, kill, err := start(ctx, cfg, prefix, i)
			if err != nil {
				return nil, fmt.Errorf("worker %d: %w", i, err)
			}
			kills[i], conns[i] = sync.OnceFunc(kill), make(map[string]*grpc.ClientConn)
			for _, s := range cfg.Strategies {
				c, err := grpc.NewClient(addrs[s], grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					return nil, err
				}
				conns[i][s] = c
			}
		}
		for _, s := range cfg.Strategies {
			t := &grpcTarget{}
			for i := range cfg.Workers {
				t.clients = append(t.clients, completionv1.NewCompletionClient(conns[i][s]))
			}
			targets = append(targets, t)
		}
		wc := &wallClock{}
		l.clock, l.start = wc, time.Now()
		if cfg.KillAfter > 0 {
			t := time.AfterFunc(cfg.KillAfter, kills[0])
			defer t.Stop()
		}
	}
	tallies := l.run(ctx, targets)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return newReport(cfg, tallies), nil
}

// serveWorker serves every strategy of cfg, each on a loopback port of its
// own, with buckets under prefix, until ctx ends; ready gets the
// addresses once they listen.
func serveWorker(ctx context.Context, cfg config, prefix string, ready func(map[string]string)) error {
	var client redis.UniversalClient
	if cfg.Redis != "" {
		client = redis.NewClient(&redis.Options{Addr: cfg.Redis})
		defer client.Close()
	}
	addrs := make(map[string]string)
	var servers []*grpc.Server
	errs := make(chan error, len(cfg.Strategies))
	for _, s := range cfg.Strategies {
		st, err := newStore(cfg, s, client, prefix, nil)
		if err != nil {
			return err
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		icpt, err := interceptor(cfg, s, st, nil)
		if err != nil {
			return err
		}
		srv := grpc.NewServer(grpc.StreamInterceptor(icpt))
		completionv1.RegisterCompletionServer(srv, &model{clock: &wallClock{}})
		servers = append(servers, srv)
		addrs[s] = lis.Addr().String()
		go func() { errs <- srv.Serve(lis) }()
	}
	ready(addrs)
	<-ctx.Done()
	for _, srv := range servers {
		srv.Stop()
	}
	for range servers {
		<-errs
	}
	return nil
}

// inProcess starts worker i in this process; killing it stops its
// servers at once, failing the calls in flight, whose settles (and
// takes) then reach the store all the same: a process killed for real
// (processStarter) settles nothing.
func inProcess(ctx context.Context, cfg config, prefix string, i int) (map[string]string, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	ready := make(chan map[string]string, 1)
	done := make(chan error, 1)
	go func() { done <- serveWorker(ctx, cfg, prefix, func(a map[string]string) { ready <- a }) }()
	select {
	case a := <-ready:
		return a, func() { cancel(); <-done }, nil
	case err := <-done:
		cancel()
		return nil, nil, err
	}
}
