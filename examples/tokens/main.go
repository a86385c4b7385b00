// Command tokens holds tenants to quotas of tokens a minute on a
// completion-style streaming gRPC service (proto/completion/v1), whose
// calls' cost, the tokens of a reply, is known only when the stream ends.
// It runs three strategies side by side, against the same calls:
//
//   - charge-at-end: admit while the tenant's bucket holds a token (a
//     peek), charge the reply's tokens when it ends (Envoy AI Gateway,
//     agentgateway);
//   - check-then-count: admit when the bucket holds the call's estimate,
//     without taking it, count the tokens after (LiteLLM);
//   - floodgate: the middleware's metered quota (tenant.MeteredSpec), which
//     reserves the estimate as a call starts and settles the actual as it
//     ends, into bounded debt when the actual is more.
//
// The first two are written as a user would write them with floodgate's
// buckets without reservations (strategies.go, between the "user code"
// markers), so that the three differ in the strategy alone; -print-config
// prints floodgate's tenant config. Each call
// draws its reply: 200 to 4,000 tokens, 1,000 on average, streamed in 0.1
// to 1 s; the estimate is the most a reply costs, 4,000, unless callers
// state one (-estimate).
//
// Run without arguments it serves the three strategies on loopback, each
// with its buckets in memory and a quota of 100,000 tokens a minute in
// bursts of 20,000, puts them under 64 callers per tenant calling back to
// back for two minutes, and prints, for each strategy and tenant, the calls
// served and rejected (for debt apart), the tokens delivered, as the
// callers received them and at each call's end, the most delivered in any
// 60 s against the quota, and the rate, over the run and after its first
// 60 s; floodgate's most against its bound, the quota and one burst (and
// the debt limit, when estimates may run short). It draws the trailing
// minute's tokens as tokens.png (-chart).
//
//	go run ./examples/tokens
//	go run ./examples/tokens -demand 2                   # open-loop arrivals at twice the quota
//	go run ./examples/tokens -estimate half -debt 20000  # callers' estimates half their replies
//	go run ./examples/tokens -redis local -workers 4 -kill-after 1m
//
// -sim runs in simulated time: the load calls each strategy's interceptor
// directly, without gRPC's transport, over the service's own handler, whose
// model streams on a simulated clock that the stores and the Limiter read
// as well (keyed.WithClock, redisstore.WithClientClock,
// middleware.WithClock), so that ten minutes take seconds. -redis
// keeps the buckets on Redis ("local" starts a redis-server on loopback);
// -workers N starts N server processes sharing them (this command, run
// with -worker), the callers spread over them, and -kill-after kills the
// first with SIGKILL, holding its calls' reservations. With -sim the
// workers are stores of their own in this process.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/floodgate-go/floodgate/internal/redistest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "tokens:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokens", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := defaultConfig()
	fs.IntVar(&cfg.Quota, "quota", cfg.Quota, "each tenant's quota, in tokens a minute")
	fs.IntVar(&cfg.Burst, "burst", cfg.Burst, "each tenant's burst, in tokens: at least a reply's most, 4000")
	fs.IntVar(&cfg.Debt, "debt", cfg.Debt, "the debt limit, in tokens: 0 is one burst, -1 none")
	fs.IntVar(&cfg.Tenants, "tenants", cfg.Tenants, "tenants, each with the quota and its own callers")
	fs.IntVar(&cfg.Callers, "callers", cfg.Callers, "closed-loop callers per tenant and strategy, calling back to back")
	fs.Float64Var(&cfg.Demand, "demand", cfg.Demand, "open-loop arrivals instead, offering this multiple of the quota")
	fs.StringVar(&cfg.Estimate, "estimate", cfg.Estimate, "what callers state a call will cost: max (nothing: the server's estimate, 4000), half (half of each reply) or tokens")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the load runs")
	fs.DurationVar(&cfg.Backoff, "backoff", cfg.Backoff, "a rejected caller's mean wait before it asks again")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "the seed of the calls' draws")
	fs.BoolVar(&cfg.Sim, "sim", cfg.Sim, "run in simulated time, without gRPC")
	fs.StringVar(&cfg.Redis, "redis", cfg.Redis, "keep the buckets on the Redis at this `address` (local: start a redis-server); in memory by default")
	fs.DurationVar(&cfg.RedisDeadline, "redis-deadline", cfg.RedisDeadline, "bound each decision on Redis, past which the store's failure policy decides (0: the store's default, 50ms; 1s with -sim)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "server processes sharing the buckets (with -redis)")
	fs.DurationVar(&cfg.KillAfter, "kill-after", cfg.KillAfter, "kill the first worker after this long, with its calls in flight (0: never)")
	strategies := fs.String("strategies", strings.Join(cfg.Strategies, ","), "the strategies to run side by side")
	fs.StringVar(&cfg.Chart, "chart", cfg.Chart, "the chart `file` (PNG) to draw; empty draws none")
	worker := fs.Bool("worker", false, "serve the strategies for the load of another process (what -workers starts)")
	prefix := fs.String("prefix", "", "with -worker, the Redis key prefix of the run")
	printConfig := fs.Bool("print-config", false, "print floodgate's tenant config of the quota and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.Strategies = strings.Split(*strategies, ",")
	if *printConfig {
		_, err := io.WriteString(stdout, cfg.tenantConfig())
		return err
	}
	if *worker {
		return serveWorker(ctx, cfg, *prefix, func(addrs map[string]string) {
			var b strings.Builder
			b.WriteString("listening")
			for _, s := range cfg.Strategies {
				b.WriteString(" " + s + "=" + addrs[s])
			}
			fmt.Fprintln(stdout, b.String())
		})
	}
	if cfg.Redis == "local" {
		srv, err := redistest.Launch()
		if err != nil {
			return err
		}
		defer srv.Close()
		cfg.Redis = srv.Addr
	}
	start := starter(inProcess)
	if cfg.Workers > 1 && !cfg.Sim {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		start = processStarter(exe, stderr)
	}
	rep, err := experiment(ctx, cfg, start)
	if err != nil {
		return err
	}
	rep.write(stdout)
	if cfg.Chart != "" {
		if err := rep.chart(cfg.Chart); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "chart: %s\n", cfg.Chart)
	}
	return nil
}

// processStarter starts each worker as a process of its own: this
// command, run with -worker. Killing it is SIGKILL: it settles nothing,
// and its reservations keep their estimates charged.
func processStarter(exe string, stderr io.Writer) starter {
	return func(ctx context.Context, cfg config, prefix string, i int) (map[string]string, func(), error) {
		cmd := exec.Command(exe, "-worker", "-redis", cfg.Redis, "-prefix", prefix,
			"-quota", strconv.Itoa(cfg.Quota), "-burst", strconv.Itoa(cfg.Burst), "-debt", strconv.Itoa(cfg.Debt),
			"-redis-deadline", cfg.RedisDeadline.String(), "-strategies", strings.Join(cfg.Strategies, ","))
		cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		kill := func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "listening")
		if err != nil || !ok {
			kill()
			return nil, nil, fmt.Errorf("worker did not start: %q, %v", line, err)
		}
		addrs := make(map[string]string)
		for _, f := range strings.Fields(rest) {
			if s, a, ok := strings.Cut(f, "="); ok {
				addrs[s] = a
			}
		}
		return addrs, kill, nil
	}
}
