// Command notifications shows workers in separate processes sharing one
// rate limit through Redis, toward a push provider that throttles above its
// rate (as FCM and APNs do).
//
// It starts a fake provider on loopback that accepts -rate notifications per
// second and answers 429 above that, then -workers worker processes (this
// binary, run as "notifications worker …") that each push notifications from
// several goroutines. Before each send a worker waits (floodgate.Wait, one
// sender at a time per worker) for a token from one bucket on Redis that all
// workers share, at the provider's rate: notifications are delayed, never
// dropped. At the end it prints what
// was sent, how often a sender had to wait, the provider's 429s and the rate
// the provider observed.
//
// Usage:
//
//	go run ./examples/notifications                 # starts its own redis-server
//	go run ./examples/notifications -redis host:port
//	go run ./examples/notifications -limit=false    # the same load without the limiter: expect 429s
//
// Without -redis it starts a redis-server on a free loopback port if one is
// installed, and says so and exits otherwise.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/floodgate-go/floodgate/internal/redistest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := workerMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		return
	}
	cfg := config{}
	flag.IntVar(&cfg.workers, "workers", 4, "worker processes")
	flag.IntVar(&cfg.senders, "senders", 8, "concurrent senders per worker")
	flag.Float64Var(&cfg.rate, "rate", 200, "the provider's limit, notifications per second")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "how long the workers send")
	flag.StringVar(&cfg.redis, "redis", "", "Redis address host:port (default: start a local redis-server)")
	flag.BoolVar(&cfg.limit, "limit", true, "share a limit on Redis (false: send unthrottled, to see the provider's 429s)")
	flag.Parse()
	sum, err := run(context.Background(), cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "notifications:", err)
		os.Exit(1)
	}
	if cfg.limit && !sum.ok() {
		os.Exit(1)
	}
}

type config struct {
	workers  int
	senders  int
	rate     float64
	duration time.Duration
	redis    string
	limit    bool
	// jitter is how much later than its decision on Redis a notification
	// may reach the provider without risking a 429: the provider's burst
	// exceeds the shared bucket's by jitter × rate. Default 100 ms.
	jitter time.Duration
}

// summary is the run's result.
type summary struct {
	report
	rate         float64 // the limit
	observed     float64 // the provider's accepted rate
	providerSeen int     // accepted by the provider
}

// ok reports whether the limiter did its job: no 429s, and the provider
// saw a rate within 5% of its limit.
func (s summary) ok() bool {
	return s.Throttled == 0 && math.Abs(s.observed-s.rate) <= 0.05*s.rate
}

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	if cfg.workers < 1 || cfg.senders < 1 || !(cfg.rate > 0) || cfg.duration <= 0 {
		return summary{}, errors.New("workers, senders, rate and duration must be positive")
	}
	addr := cfg.redis
	if addr == "" {
		if !redistest.Installed() {
			return summary{}, errors.New("no -redis address given and redis-server is not installed: " +
				"install it (apt-get install -y redis-server) or pass -redis host:port")
		}
		srv, err := redistest.Launch()
		if err != nil {
			return summary{}, err
		}
		defer srv.Close()
		addr = srv.Addr
		fmt.Fprintf(out, "started redis-server on %s\n", addr)
	}

	// The shared bucket has a burst of 50 ms of the rate; the provider
	// allows jitter more, which leaves room for network and scheduling
	// delays between the decision on Redis and the request's arrival. On
	// a busy two-CPU machine, nine processes and Redis take turns, and at
	// 1000/s a send reached the provider more than 50 ms after its
	// decision in a fifth of the runs; real providers count over seconds.
	if cfg.jitter <= 0 {
		cfg.jitter = 100 * time.Millisecond
	}
	// At least 2: a waiter wakes a little after its token came (Wait adds
	// up to a tenth to each sleep), and with room for one token only,
	// what the bucket gained meanwhile would be lost; a lone sender would
	// fall short of the rate.
	burst := max(2, int(cfg.rate/20))
	pburst := burst + max(1, int(cfg.rate*cfg.jitter.Seconds()))
	p, err := startProvider(cfg.rate, pburst)
	if err != nil {
		return summary{}, err
	}
	defer p.close()
	fmt.Fprintf(out, "provider on %s: %.0f/s, burst %d; %d workers × %d senders for %v, limiter %v\n",
		p.url, cfg.rate, pburst, cfg.workers, cfg.senders, cfg.duration, cfg.limit)

	exe, err := os.Executable()
	if err != nil {
		return summary{}, err
	}
	var mu sync.Mutex
	var total report
	var errs []error
	var wg sync.WaitGroup
	for i := range cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, exe, "worker",
				"-redis", addr, "-provider", p.url,
				"-rate", strconv.FormatFloat(cfg.rate, 'g', -1, 64), "-burst", strconv.Itoa(burst),
				"-senders", strconv.Itoa(cfg.senders), "-duration", cfg.duration.String(),
				"-limit="+strconv.FormatBool(cfg.limit), "-instances", strconv.Itoa(cfg.workers))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var rep report
			if err == nil {
				err = json.Unmarshal(stdout.Bytes(), &rep)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("worker %d: %v: %s", i, err, bytes.TrimSpace(stderr.Bytes())))
				return
			}
			total.Sent += rep.Sent
			total.Delayed += rep.Delayed
			total.Retries += rep.Retries
			total.Throttled += rep.Throttled
			total.Failed += rep.Failed
			total.Fallback += rep.Fallback
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return summary{}, err
	}
	accepted, _, observed := p.observed()
	sum := summary{report: total, rate: cfg.rate, observed: observed, providerSeen: accepted}
	fmt.Fprintf(out, "sent %d, delayed %d (after %d denied takes), 429s %d, failed %d, decided without Redis %d\n",
		total.Sent, total.Delayed, total.Retries, total.Throttled, total.Failed, total.Fallback)
	fmt.Fprintf(out, "provider observed %.1f/s (limit %.0f/s, %+.1f%%)\n",
		observed, cfg.rate, 100*(observed-cfg.rate)/cfg.rate)
	if cfg.limit {
		verdict := "OK: no 429s, observed rate within 5% of the limit"
		if !sum.ok() {
			verdict = "FAIL: 429s or observed rate off by more than 5%"
		}
		fmt.Fprintln(out, verdict)
	}
	return sum, nil
}
