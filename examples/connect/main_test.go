package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun floods the server briefly: each caller is admitted its burst and
// no more than its rate allows after it, and every other call is rejected
// with resource_exhausted, a Retry-After and the RateLimit fields.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	sum, err := run(context.Background(), config{duration: 300 * time.Millisecond, senders: 2}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !sum.ok() {
		t.Error("a caller was admitted more than its quota allows, fewer than its burst, or rejected otherwise")
	}
	for _, want := range []string{"resource_exhausted", "Retry-After seen: 1s", "ErrorInfo RATE_LIMITED", `last RateLimit: "/inventory.v1.Inventory/GetStock";r=0`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestRunRefusesNoDuration(t *testing.T) {
	if _, err := run(context.Background(), config{senders: 1}, &bytes.Buffer{}); err == nil {
		t.Error("run with no duration: nil error")
	}
}
