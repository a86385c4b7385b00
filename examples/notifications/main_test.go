package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate/internal/redistest"
)

// TestMain lets the test binary serve as a worker process: run starts
// os.Executable() with "worker" as the first argument.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := workerMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRun runs the example briefly: 3 workers share 100/s for 2 s. With the
// limiter the provider must answer no 429 and observe about the limit. The
// provider tolerates 300 ms of delay after a decision, not the example's
// 50 ms: the race detector and parallel test packages can hold a sender
// back that long on a small machine, and a 429 then says nothing of the
// limiter.
func TestRun(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	sum, err := run(context.Background(), config{
		workers: 3, senders: 4, rate: 100, duration: 2 * time.Second, redis: srv.Addr, limit: true,
		jitter: 300 * time.Millisecond,
	}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Throttled != 0 {
		t.Errorf("%d notifications throttled (429), want 0", sum.Throttled)
	}
	if sum.Delayed == 0 {
		t.Errorf("no sender was delayed: the load did not reach the limit")
	}
	// 2 s is short: allow 10% here; the example itself checks 5% over 5 s.
	if d := (sum.observed - sum.rate) / sum.rate; d < -0.10 || d > 0.10 {
		t.Errorf("provider observed %.1f/s, want within 10%% of %.0f/s", sum.observed, sum.rate)
	}
}

// TestWorkerHonoursRetryAfter: without the limiter, a sender that gets a
// 429 waits as its Retry-After says and sends the same notification again,
// as a well-behaved push client does, rather than hammering the provider
// with the next one.
func TestWorkerHonoursRetryAfter(t *testing.T) {
	p, err := startProvider(10, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if err := workerMain([]string{"-provider", p.url, "-limit=false", "-senders", "2", "-duration", "1500ms"}); err != nil {
		t.Fatal(err)
	}
	accepted, rejected, _ := p.observed()
	// Each sender is throttled at most once per Retry-After (1 s), and the
	// first attempts can all be accepted.
	if rejected > 4 || accepted == 0 {
		t.Errorf("provider accepted %d and answered 429 %d times in 1.5 s from 2 senders; want at most 4 429s", accepted, rejected)
	}
}

// TestWorkerPausesWhenProviderIsDown: an unreachable provider makes a
// sender pause between notifications, not spin on connection errors.
func TestWorkerPausesWhenProviderIsDown(t *testing.T) {
	p, err := startProvider(10, 1)
	if err != nil {
		t.Fatal(err)
	}
	url := p.url
	p.close() // nothing listens there now
	old := os.Stdout
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout = w
	err = workerMain([]string{"-provider", url, "-limit=false", "-senders", "2", "-duration", "500ms"})
	os.Stdout = old
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	// Two senders pausing 100 ms after each failure: about 10 in 500 ms.
	if rep.Failed == 0 || rep.Failed > 20 {
		t.Errorf("%d failed sends in 500 ms from 2 senders, want about 10", rep.Failed)
	}
}
