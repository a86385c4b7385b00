package main

// The options of the server beyond the defaults of server.go: the CPU
// gate's policy and sampler (-policy, -sampler, -sched-p99), and buckets on
// Redis (-redis).

import (
	"fmt"
	"runtime"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/promfloodgate"
	"github.com/floodgate-go/floodgate/redisstore"
)

// Policies of serverConfig.Policy: what sheds under overload.
const (
	// policyOverload is the overload controller, with the gate as its
	// guard: the gate's readings go into the controller's snapshots and the
	// tables, and its scale into nothing.
	policyOverload = "overload"
	// policyAdaptive and policyFixed are the gate's policies alone, as
	// before the controller: every tenant's quota is scaled by one factor
	// while the CPU is saturated.
	policyAdaptive = "adaptive"
	policyFixed    = "fixed"
)

// checkPolicy returns an error for a policy name serverConfig does not know.
func checkPolicy(name string) error {
	switch name {
	case policyOverload, policyAdaptive, policyFixed:
		return nil
	}
	return fmt.Errorf("unknown policy %q: want overload, adaptive or fixed", name)
}

// newGate returns the CPU gate of cfg's policy and sampler, with the
// sampler's label and the CPUs it measures use against. With the overload
// controller the gate only reads the CPU: its policy is the default one
// without the scheduling guard, and its state changes go unlogged, since
// nothing acts on them.
func newGate(cfg serverConfig) (*cpugate.Gate, string, float64, error) {
	if err := checkPolicy(cfg.Policy); err != nil {
		return nil, "", 0, err
	}
	var policy cpugate.Policy = cpugate.Adaptive{SchedP99: cfg.SchedP99}
	logger := cfg.Logger
	switch cfg.Policy {
	case policyOverload:
		policy, logger = cpugate.Adaptive{}, nil
	case policyFixed:
		policy = cpugate.Fixed{SchedP99: cfg.SchedP99}
	}
	sampler, source, budget := cfg.sampler, "scripted", float64(runtime.NumCPU())
	if sampler == nil {
		var err error
		if sampler, source, budget, err = newSampler(cfg.Sampler); err != nil {
			return nil, "", 0, err
		}
		// The guard adds the scheduling latency to every reading, so the
		// table shows it whether or not the policy acts on it.
		sampler = cpugate.NewSchedGuard(sampler)
	}
	interval := cfg.gateInterval
	if interval == 0 {
		interval = cpugate.DefaultInterval
	}
	gate, err := cpugate.New(sampler, cpugate.WithPolicy(policy), cpugate.WithInterval(interval), cpugate.WithLogger(logger))
	return gate, source, budget, err
}

// newSampler returns the named CPU sampler ("" is auto), its source label
// and the CPUs it measures use against.
func newSampler(name string) (cpugate.Sampler, string, float64, error) {
	switch name {
	case "", "auto":
		s, source, err := cpugate.NewSampler()
		if err != nil {
			return nil, "", 0, err
		}
		switch s := s.(type) {
		case *cpugate.CgroupSampler:
			return s, source, s.Budget(), nil
		case *cpugate.ProcessSampler:
			return s, source, float64(s.CPUs()), nil
		}
		return s, source, float64(runtime.NumCPU()), nil
	case "cgroup":
		s, err := cpugate.NewCgroupSampler()
		if err != nil {
			return nil, "", 0, err
		}
		return s, s.Source(), s.Budget(), nil
	case "process":
		s, err := cpugate.NewProcessSampler()
		if err != nil {
			return nil, "", 0, err
		}
		return s, cpugate.SourceProcess, float64(s.CPUs()), nil
	case "host":
		s, err := cpugate.NewHostSampler()
		if err != nil {
			return nil, "", 0, err
		}
		return s, cpugate.SourceHost, float64(runtime.NumCPU()), nil
	}
	return nil, "", 0, fmt.Errorf("unknown sampler %q: want auto, cgroup, process or host", name)
}

// newRedisStore returns the bucket store on the Redis at cfg.Redis, whose
// breaker transitions go to cfg.Logger and, with cfg.Metrics, whose calls
// the returned RedisMetrics observes.
func newRedisStore(cfg serverConfig) (*redisstore.Store, *redis.Client, *promfloodgate.RedisMetrics, error) {
	opts := []redisstore.Option{redisstore.WithLogger(cfg.Logger)}
	var metrics *promfloodgate.RedisMetrics
	if cfg.Metrics != "" {
		var err error
		if metrics, err = promfloodgate.NewRedisMetrics(); err != nil {
			return nil, nil, nil, err
		}
		opts = append(opts, redisstore.WithObserver(metrics))
	}
	// The store's per-decision deadline reaches Redis only with context
	// timeouts on, and a failed call should fall back at once, not retry.
	client := redis.NewClient(&redis.Options{Addr: cfg.Redis, ContextTimeoutEnabled: true, MaxRetries: -1})
	store, err := redisstore.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, nil, nil, err
	}
	return store, client, metrics, nil
}
