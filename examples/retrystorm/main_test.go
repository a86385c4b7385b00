package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRetryStorm(t *testing.T) {
	var out bytes.Buffer
	cfg := config{duration: time.Second, limit: 100, overload: 3}
	if err := run(&out, cfg); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if !strings.Contains(out.String(), "throttled clients sent") {
		t.Errorf("output has no summary:\n%s", out.String())
	}
}

func TestThrottledClientsSendLess(t *testing.T) {
	addr, wire, stop, err := serve(100)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cfg := config{duration: time.Second, limit: 100, overload: 3}
	naive, err := flood(addr, wire, "naive", cfg)
	if err != nil {
		t.Fatal(err)
	}
	throttled, err := flood(addr, wire, "throttled", cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Naive clients retry every rejection, so at three times the quota
	// their attempts exceed their calls; the throttle drops most of its
	// calls on the client once the server rejects most of them.
	if naive.wire <= naive.offered {
		t.Errorf("naive: %d attempts on the wire for %d calls, want more attempts than calls", naive.wire, naive.offered)
	}
	if throttled.locally == 0 || throttled.wire >= naive.wire {
		t.Errorf("throttled: %d attempts on the wire (naive %d), %d dropped on the client; want fewer attempts and some drops",
			throttled.wire, naive.wire, throttled.locally)
	}
	if throttled.served == 0 || naive.served == 0 {
		t.Errorf("served: naive %d, throttled %d; want both to be served", naive.served, throttled.served)
	}
}

func TestRejectsBadConfig(t *testing.T) {
	for _, cfg := range []config{{duration: 0, limit: 1, overload: 1}, {duration: time.Second, limit: 0, overload: 1}, {duration: time.Second, limit: 1, overload: -1}} {
		if err := run(&bytes.Buffer{}, cfg); err == nil {
			t.Errorf("run(%+v) = nil, want an error", cfg)
		}
	}
}
