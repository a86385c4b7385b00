// Command floodgate-rls serves Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService) from an envoyproxy/ratelimit
// config or a floodgate tenant config, with token buckets in memory or on
// Redis shared by every replica.
//
//	floodgate-rls -config ratelimit.yaml                 # in memory
//	floodgate-rls -config conf.d/ -redis 127.0.0.1:6379  # a fleet on one Redis
//	floodgate-rls -config conf.d/ -redis host1:7000,host2:7000,host3:7000 -lease on
//
// Flags:
//
//	-config PATH    config file, or a directory of them (one domain each); required
//	-merge-domains  merge the files of -config that name one domain, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG=true (default: refuse them)
//	-addr ADDR      gRPC listen address (default 127.0.0.1:8081; port 0 picks one)
//	-metrics ADDR   serve Prometheus /metrics (and /debug/rls/top) on ADDR; off when empty
//	-redis ADDRS    Redis address; for a Cluster, its nodes comma-separated ("host:7000," for one seed); in memory when empty
//	-prefix P       the first part of every Redis key (default floodgate): replicas with one prefix share buckets
//	-lease VALUE    redisstore leases: off (default), on (1s), or a lease time such as 500ms
//	-capacity N     buckets kept in memory without -redis (default 100000; past it new keys share an overflow bucket); with it, the buckets whose leases a replica tracks
//	-batch N        redisstore batching: at most N decisions a round trip (default 128; 0 off)
//	-deny-cache N   redisstore deny cache: the N buckets Redis refused last are refused locally until they could admit (default 65536; 0 off)
//	-deadline D     redisstore's deadline per decision (default 50ms)
//	-headers        add x-ratelimit-limit, -remaining and -reset to responses
//	-watch D        poll the config for changes every D (default 1s; 0 off); SIGHUP reloads too
//	-grace D        how long shutdown waits for calls in flight (default 10s)
//	-pprof          with -metrics, serve Go's profiles (net/http/pprof) under /debug/pprof/ too
//	-rlqs-interval D  Envoy's RLQS report interval (default 5s, as Envoy's): quotas are divided again every D, and last 2D+2s
//
// It also serves Envoy's rate-limit quota service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService, RLQS) on the
// same port from the same config: each limit is divided among the Envoys
// that report its bucket. With -redis, the replicas that share a Redis and
// -prefix divide each limit together, among all their Envoys.
//
// Once listening, it prints one line per listener to standard output,
// "floodgate-rls: grpc listening on HOST:PORT" and, with -metrics,
// "floodgate-rls: metrics listening on HOST:PORT", so that a caller that
// asked for port 0 learns the port. It serves grpc.health.v1 (the service
// names "" and envoy.service.ratelimit.v3.RateLimitService) and server
// reflection. SIGINT or SIGTERM stops it gracefully: health turns
// NOT_SERVING, calls in flight finish (up to -grace), then it exits 0.
// A config rejected at start is an error (exit 1); one rejected on reload
// is logged with every problem's file and line, and the previous config
// stays in force.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/promfloodgate"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/rls"
)

// defaultLease is the lease time of -lease on.
const defaultLease = time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, hup); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-rls:", err)
		os.Exit(1)
	}
}

type flags struct {
	config, addr, metrics, redis, lease string
	prefix                              string
	batch, capacity, denyCache          int
	deadline, watch, grace, rlqsEvery   time.Duration
	headers, pprof, mergeDomains        bool
}

func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("floodgate-rls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "config `path`: a file, or a directory of files (one domain each)")
	fs.BoolVar(&f.mergeDomains, "merge-domains", false, "merge the config files that name one domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG=true); refused when off")
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8081", "gRPC listen `address` (port 0 picks a free one)")
	fs.StringVar(&f.metrics, "metrics", "", "serve /metrics on `address`; off when empty")
	fs.StringVar(&f.redis, "redis", "", "Redis `address`; a Cluster's nodes comma-separated (a trailing comma for one seed); in memory when empty")
	fs.StringVar(&f.prefix, "prefix", "floodgate", "with -redis, the first part of every key: replicas with one `prefix` share buckets")
	fs.StringVar(&f.lease, "lease", "off", "redisstore leases: off, on ("+defaultLease.String()+") or a lease time")
	fs.IntVar(&f.capacity, "capacity", keyed.DefaultCapacity, "buckets kept in memory (without -redis; with it, the keys whose leases it tracks); past it, new keys share an overflow bucket")
	fs.IntVar(&f.batch, "batch", 128, "redisstore batching: most decisions per round trip (0 off)")
	fs.IntVar(&f.denyCache, "deny-cache", 65536, "redisstore deny cache: buckets Redis refused, refused locally until they could admit (0 off)")
	fs.DurationVar(&f.deadline, "deadline", 50*time.Millisecond, "redisstore deadline per decision")
	fs.BoolVar(&f.headers, "headers", false, "add x-ratelimit-* headers to responses")
	fs.DurationVar(&f.watch, "watch", time.Second, "config poll interval (0 off; SIGHUP reloads too)")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "how long shutdown waits for calls in flight")
	fs.BoolVar(&f.pprof, "pprof", false, "with -metrics, serve Go's profiles under /debug/pprof/")
	fs.DurationVar(&f.rlqsEvery, "rlqs-interval", 5*time.Second, "Envoy's RLQS report `interval`: quotas are divided again each interval")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.config == "" {
		return f, errors.New("-config is required")
	}
	if f.denyCache < 0 {
		return f, fmt.Errorf("-deny-cache %d: want 0 (off) or a number of buckets", f.denyCache)
	}
	if f.rlqsEvery <= 0 {
		return f, fmt.Errorf("-rlqs-interval %v: want a positive duration", f.rlqsEvery)
	}
	if f.pprof && f.metrics == "" {
		return f, errors.New("-pprof needs -metrics, the address it serves on")
	}
	return f, nil
}

// leaseTime parses -lease.
func leaseTime(v string) (time.Duration, error) {
	switch strings.ToLower(v) {
	case "off", "false", "0", "":
		return 0, nil
	case "on", "true":
		return defaultLease, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("-lease %q: want off, on or a non-negative duration", v)
	}
	return d, nil
}

// openStore returns the bucket store the flags ask for, and a function
// that releases it.
func openStore(f flags, reg prometheus.Registerer, log *slog.Logger) (floodgate.Reserver, func(), error) {
	if f.redis == "" {
		m, err := keyed.New(keyed.WithCapacity(f.capacity))
		return m, func() {}, err
	}
	lease, err := leaseTime(f.lease)
	if err != nil {
		return nil, nil, err
	}
	var addrs []string
	for _, a := range strings.Split(f.redis, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, nil, fmt.Errorf("-redis %q: no address", f.redis)
	}
	var client redis.UniversalClient
	if strings.Contains(f.redis, ",") {
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
	} else {
		client = redis.NewClient(&redis.Options{Addr: addrs[0], ContextTimeoutEnabled: true, MaxRetries: -1})
	}
	// Round trips, errors by kind, the breaker's state and the decisions
	// Redis did not make, beside the service's own metrics.
	obs, err := promfloodgate.NewRedisMetrics()
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	if err := reg.Register(obs); err != nil {
		client.Close()
		return nil, nil, err
	}
	opts := []redisstore.Option{
		redisstore.WithPrefix(f.prefix),
		redisstore.WithDeadline(f.deadline),
		redisstore.WithBatching(f.batch),
		redisstore.WithLogger(log),
		redisstore.WithObserver(obs),
	}
	if lease > 0 {
		opts = append(opts, redisstore.WithLeases(lease, f.capacity))
	}
	if f.denyCache > 0 {
		opts = append(opts, redisstore.WithDenyCache(f.denyCache))
	}
	st, err := redisstore.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return st, func() { st.Close(); client.Close() }, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, hup <-chan os.Signal) error {
	f, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	store, closeStore, err := openStore(f, reg, log)
	if err != nil {
		return err
	}
	defer closeStore()
	// Reloads are logged; the first load's rejection is returned instead.
	var started atomic.Bool
	onReload := func(path string, cfg *rls.Config, err error) {
		switch {
		case !started.Load():
		case err != nil:
			log.Error("floodgate-rls: config rejected, the previous one stays in force", "path", path, "error", err.Error())
		default:
			log.Info("floodgate-rls: config reloaded", "path", path, "domains", cfg.Domains())
		}
	}
	opts := []rls.Option{rls.WithRegisterer(reg), rls.WithResponseHeaders(f.headers), rls.WithOnReload(onReload),
		rls.WithMergeDomains(f.mergeDomains)}
	svc, err := rls.New(store, nil, opts...)
	if err != nil {
		return err
	}
	if err := svc.Load(f.config); err != nil {
		return err
	}
	started.Store(true)

	lis, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	svc.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("envoy.service.ratelimit.v3.RateLimitService", healthpb.HealthCheckResponse_SERVING)
	// With Redis, the replicas on it divide each limit together.
	qopts := []rls.QuotaOption{rls.WithReportInterval(f.rlqsEvery)}
	if rs, ok := store.(*redisstore.Store); ok {
		qopts = append(qopts, rls.WithQuotaStore(rs))
	}
	qs, err := rls.NewQuotaServer(svc, qopts...)
	if err != nil {
		lis.Close()
		return err
	}
	qs.Register(gs)
	hs.SetServingStatus(rls.QuotaServiceName, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(gs)

	var ms *http.Server
	if f.metrics != "" {
		ml, err := net.Listen("tcp", f.metrics)
		if err != nil {
			lis.Close()
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.Handle("/debug/rls/top", svc.TopHandler())
		if f.pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		ms = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = ms.Serve(ml) }()
		fmt.Fprintf(stdout, "floodgate-rls: metrics listening on %s\n", ml.Addr())
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(lis) }()
	fmt.Fprintf(stdout, "floodgate-rls: grpc listening on %s\n", lis.Addr())
	log.Info("floodgate-rls: serving", "grpc", lis.Addr().String(), "config", f.config, "domains", svc.Config().Domains(),
		"redis", f.redis, "lease", f.lease)

	wctx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	if f.watch > 0 {
		go func() { _ = svc.Watch(wctx, f.config, f.watch) }()
	}
	go func() { _ = qs.Run(wctx) }()

	for {
		select {
		case <-hup:
			_ = svc.Load(f.config) // logged and counted; a rejected config keeps the previous one
			continue
		case err := <-serveErr:
			return err
		case <-ctx.Done():
		}
		break
	}
	log.Info("floodgate-rls: shutting down", "grace", f.grace.String())
	hs.Shutdown()
	cancelWatch()
	// Streams end with UNAVAILABLE and no TTL of 0: Envoys keep their
	// assignments until they lapse, and reconnect on their next report.
	// A replica on Redis leaves its grants held until they lapse too.
	qs.Close()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	t := time.NewTimer(f.grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		gs.Stop()
		<-done
	}
	if ms != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = ms.Shutdown(sctx)
	}
	return nil
}
