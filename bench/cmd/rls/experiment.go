package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
)

// mixSeed draws the mix: the same requests in every run.
const mixSeed = 1

// servers starts the variants' servers and stops them all at the end.
type servers struct {
	cfg     *Config
	iso     Isolation
	root    string // RUNTIME_ROOT
	confDir string // the configuration's files
	redis   *redisProc
	fg, rl  string // floodgate-rls, service_cmd
	env     []string

	mu    sync.Mutex
	procs []*proc
}

// ratelimitEnv returns envoyproxy/ratelimit's settings for a server at
// grpcAddr, on the run's configuration and Redis (rlsproc.RatelimitEnv).
func (s *servers) ratelimitEnv(grpcAddr, httpAddr, debugAddr string) []string {
	return rlsproc.RatelimitEnv(s.root, runtimeSubdir, s.redis.Addr, grpcAddr, httpAddr, debugAddr)
}

// start starts one server of variant v and returns it serving. On Redis,
// floodgate-rls's fleet is the replicas that share buckets and count each
// other, by their key prefix: each configuration its own, as separate
// deployments sharing one Redis would be.
func (s *servers) start(ctx context.Context, v, fleet string) (*proc, error) {
	addr, err := rlsproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	var argv, env []string
	var metrics string
	health := ""
	switch v {
	case vNull:
		argv = append(slices.Clone(s.cfg.Exe), "null", "-addr", addr)
	case vMemory, vRedis:
		if metrics, err = rlsproc.FreeAddr(); err != nil {
			return nil, err
		}
		argv = []string{s.fg, "-config", s.confDir, "-addr", addr, "-metrics", metrics}
		if v == vRedis {
			lease := "off"
			if s.cfg.Lease > 0 {
				lease = s.cfg.Lease.String()
			}
			argv = append(argv, "-redis", s.redis.Addr, "-prefix", fleet, "-lease", lease)
		}
	case vRatelimit:
		httpAddr, err1 := rlsproc.FreeAddr()
		debugAddr, err2 := rlsproc.FreeAddr()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		argv = []string{s.rl}
		env = s.ratelimitEnv(addr, httpAddr, debugAddr)
		health = "ratelimit"
	default:
		return nil, fmt.Errorf("unknown variant %q", v)
	}
	p, err := startProc(ctx, s.iso, v, argv, env, addr, health)
	if err != nil {
		return nil, err
	}
	p.metrics = metrics
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p, nil
}

// startReplicas starts n servers of variant v and checks that they have
// loaded the configuration and, for more than one, share their buckets.
func (s *servers) startReplicas(ctx context.Context, v string, n int) ([]*proc, error) {
	var ps []*proc
	var addrs []string
	fleet := v + "-" + strconv.Itoa(n) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for range n {
		p, err := s.start(ctx, v, fleet)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
		addrs = append(addrs, p.addr)
	}
	if v != vNull {
		if err := probe(ctx, addrs, fleet); err != nil {
			return nil, fmt.Errorf("%s: %w", v, err)
		}
	}
	return ps, nil
}

func (s *servers) stopAll() {
	s.mu.Lock()
	ps := s.procs
	s.procs = nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// usesRedis reports whether variant v keeps its buckets in Redis, whose
// CPU then counts as its own.
func usesRedis(v string) bool { return v == vRedis || v == vRatelimit }

// experiment runs the experiment.
func experiment(ctx context.Context, cfg Config) (*Results, error) {
	cfg.defaults()
	if len(cfg.Variants) == 0 {
		cfg.Variants = slices.Clone(allVariants)
	}
	if cfg.Exe == nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Exe = []string{exe}
	}
	began := time.Now()
	res := &Results{
		Date:        began.UTC().Format(time.RFC3339),
		Config:      cfg,
		Machine:     machine(),
		Isolation:   detectIsolation(cfg.Pin),
		Mix:         newMix(mixSeed).summary,
		Versions:    map[string]string{},
		Unavailable: map[string]string{},
	}
	for _, n := range res.Isolation.Notes {
		cfg.logf("%s", n)
	}
	root, err := os.MkdirTemp("", "floodgate-rls-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	s := &servers{cfg: &cfg, iso: res.Isolation, root: root}
	if s.confDir, err = writeConfig(root, accuracyLimitsFor(cfg.Quick)); err != nil {
		return nil, err
	}

	wants := func(v string) bool { return slices.Contains(cfg.Variants, v) }
	skip := func(err error, vs ...string) error {
		if !errors.Is(err, errSkip) {
			return err
		}
		for _, v := range vs {
			if wants(v) {
				res.Unavailable[v] = strings.TrimPrefix(err.Error(), errSkip.Error()+": ")
				cfg.logf("%s will not run: %s", v, res.Unavailable[v])
			}
		}
		return nil
	}
	if wants(vMemory) || wants(vRedis) {
		bin, version, err := floodgateBinary(ctx, cfg.Floodgate, cfg.logf)
		if err != nil {
			if err := skip(err, vMemory, vRedis); err != nil {
				return nil, err
			}
		} else {
			s.fg = bin
			res.Versions[vMemory], res.Versions[vRedis] = version, version
		}
	}
	if wants(vRatelimit) {
		bin, err := ratelimitBinary(ctx, cfg.Ratelimit, cfg.logf)
		if err != nil {
			if err := skip(err, vRatelimit); err != nil {
				return nil, err
			}
		} else {
			s.rl = bin
			res.Versions[vRatelimit] = rlsproc.RatelimitModule + "@" + rlsproc.RatelimitVersion
		}
	}
	res.Versions[vNull] = "this program, " + runtime.Version()
	var variants []string
	for _, v := range cfg.Variants {
		if _, out := res.Unavailable[v]; !out {
			variants = append(variants, v)
		}
	}
	res.Config.Variants = variants
	if len(variants) == 0 {
		return nil, errors.New("no variant can run")
	}
	if slices.ContainsFunc(variants, usesRedis) {
		if s.redis, err = startRedis(s.iso); err != nil {
			return nil, err
		}
		defer s.redis.Close()
		res.Machine.Redis = s.redis.version
	}
	if wants(vRatelimit) && s.rl != "" {
		// The page shows the settings, not this run's directory and ports.
		res.Env = s.ratelimitEnv(":"+placeholder, ":"+placeholder, ":"+placeholder)
		for i, kv := range res.Env {
			if k, _, _ := strings.Cut(kv, "="); k == "RUNTIME_ROOT" || k == "REDIS_URL" {
				res.Env[i] = k + "=" + placeholder
			}
		}
	}
	defer s.stopAll()

	if cfg.Perf {
		if err := perf(ctx, s, variants, res); err != nil {
			return nil, err
		}
	}
	if cfg.Accuracy {
		if err := accuracy(ctx, s, variants, res); err != nil {
			return nil, err
		}
	}
	res.Machine.LoadEnd = loadavg()
	res.Elapsed = time.Since(began).Seconds()
	return res, nil
}

// perf measures every variant's saturation, in rounds, and then its
// latency at half of it.
func perf(ctx context.Context, s *servers, variants []string, res *Results) error {
	cfg := s.cfg
	m := newMix(mixSeed)
	clients := map[string]*client{}
	cpus := map[string]*cpuWindow{}
	for _, v := range variants {
		ps, err := s.startReplicas(ctx, v, 1)
		if err != nil {
			return err
		}
		cl, err := dial([]string{ps[0].addr}, cfg.Conns)
		if err != nil {
			return err
		}
		defer cl.close()
		clients[v] = cl
		cpus[v] = &cpuWindow{servers: []int{ps[0].Pid()}, procs: ps}
		if usesRedis(v) {
			cpus[v].redis = s.redis.pid
		}
	}
	callers := map[string]int{}
	for round := 1; round <= cfg.Rounds; round++ {
		// Each round after the first starts one variant later, so that
		// no variant always runs right after another.
		for i := range variants {
			v := variants[(i+round-1)%len(variants)]
			var meas Measurement
			var err error
			if round == 1 {
				meas, err = saturate(ctx, cfg, clients[v], m, cpus[v])
			} else {
				meas, err = closedLoop(ctx, clients[v], m, callers[v], cfg.Warm, cfg.Measure, cpus[v])
			}
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", v, round, err)
			}
			meas.Variant, meas.Round = v, round
			callers[v] = meas.Callers
			res.Saturation = append(res.Saturation, meas)
			cfg.logf("saturation, round %d: %s", round, meas)
		}
	}
	for i, v := range variants {
		rate := 0.5 * median(res.saturation(v), func(m Measurement) float64 { return m.PerSecond })
		meas, err := openLoop(ctx, clients[v], m, rate, cfg.Seed+uint64(i), cfg.Warm, cfg.OpenMeasure, cpus[v])
		if err != nil {
			return fmt.Errorf("%s, open loop: %w", v, err)
		}
		meas.Variant = v
		res.Latency = append(res.Latency, meas)
		cfg.logf("latency at %.0f/s (half the saturation): %s", rate, meas)
	}
	s.stopAll()
	return nil
}

// saturate measures the closed loop with cfg.Callers callers and, while
// the p99 exceeds targetP99, halves them, down to one.
func saturate(ctx context.Context, cfg *Config, cl *client, m *mix, cpu *cpuWindow) (Measurement, error) {
	var search []Try
	for callers := cfg.Callers; ; callers /= 2 {
		meas, err := closedLoop(ctx, cl, m, callers, cfg.Warm, cfg.Measure, cpu)
		if err != nil {
			return meas, err
		}
		ms := float64(targetP99) / 1e6
		if meas.P99 <= ms || callers == 1 {
			if len(search) > 0 {
				meas.Search = search
			}
			return meas, nil
		}
		search = append(search, Try{Callers: callers, P99: meas.P99, PerCPU: meas.PerCPUSecond})
		cfg.logf("p99 %.2f ms > %.0f ms with %d callers: halving them", meas.P99, ms, callers)
	}
}

// accuracy runs every configuration's patterns in one window.
func accuracy(ctx context.Context, s *servers, variants []string, res *Results) error {
	cfg := s.cfg
	lim := accuracyLimitsFor(cfg.Quick)
	at := accTimesFor(cfg.Quick)
	acc := &Accuracy{Limits: lim, Lease: cfg.Lease}
	var targets []*accTarget
	for _, v := range variants {
		var replicas []int
		switch v {
		case vMemory:
			replicas = []int{1} // replicas in memory share nothing
		case vRedis, vRatelimit:
			replicas = []int{1, 3}
		}
		for _, n := range replicas {
			ps, err := s.startReplicas(ctx, v, n)
			if err != nil {
				return err
			}
			var addrs []string
			for _, p := range ps {
				addrs = append(addrs, p.addr)
			}
			cl, err := dial(addrs, 1)
			if err != nil {
				return err
			}
			defer cl.close()
			acc.Runs = append(acc.Runs, AccuracyRun{Variant: v, Replicas: n})
			targets = append(targets, &accTarget{stubs: cl.stubs, procs: ps})
		}
	}
	if len(targets) == 0 {
		return nil
	}
	for i := range targets {
		targets[i].run = &acc.Runs[i]
	}
	acc.Edge = nextEdge(time.Now(), lim.Period, lim.Period/2+at.drainLead+time.Second)
	cfg.logf("accuracy: %d configurations, the window edge at %s (in %.0f s)", len(targets), acc.Edge.UTC().Format("15:04:05.000"), time.Until(acc.Edge).Seconds())
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Go(func() { t.drive(ctx, lim, at, acc.Edge, cfg.Lease) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, t := range targets {
		for _, p := range t.procs {
			n, err := p.fallbacks()
			if err != nil {
				return fmt.Errorf("%s metrics: %w", p.Name, err)
			}
			t.run.Fallbacks += n
			if n > 0 {
				cfg.logf("%s: %d fallbacks; its log ends: %s", p.Name, n, p.Output())
			}
		}
	}
	for _, r := range acc.Runs {
		cfg.logf("accuracy: %s", r)
	}
	res.Accuracy = acc
	s.stopAll()
	return nil
}

// saturation returns variant v's closed-loop measurements.
func (res *Results) saturation(v string) []Measurement {
	var ms []Measurement
	for _, m := range res.Saturation {
		if m.Variant == v {
			ms = append(ms, m)
		}
	}
	return ms
}

func median[T any](xs []T, f func(T) float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	vs := make([]float64, len(xs))
	for i, x := range xs {
		vs[i] = f(x)
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 1 {
		return vs[n/2]
	} else {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
}

func machine() Machine {
	m := Machine{CPUs: onlineCPUs(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadAvg: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.Model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
