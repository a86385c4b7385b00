package redisstore

import (
	"errors"
	"github.com/floodgate-go/floodgate/remote"
	"testing"
	"time"
)

// TestBreakerLateSuccess: a call that left before the breaker opened and
// succeeds after does not close it; the probe after the cooldown does.
func TestBreakerLateSuccess(t *testing.T) {
	var b breaker
	b.init(1, time.Hour, nil)
	now := time.Now()
	if ok, probe := b.allow(now); !ok || probe { // a slow call leaves
		t.Fatalf("allow on a closed breaker = %v, %v", ok, probe)
	}
	b.failure(now, errors.New("timeout")) // another call fails: open
	b.success(now)                        // the slow call answers late
	if !b.isOpen() || b.current() != remote.BreakerOpen {
		t.Fatalf("a late success closed the breaker: state %v", b.current())
	}
	if ok, probe := b.allow(now.Add(time.Minute)); ok || probe {
		t.Fatalf("allow during the cooldown = %v, %v; want neither a call nor a probe", ok, probe)
	}
	if ok, probe := b.allow(now.Add(2 * time.Hour)); ok || !probe {
		t.Fatalf("allow after the cooldown = %v, %v; want the probe and no call", ok, probe)
	}
	if ok, probe := b.allow(now.Add(2 * time.Hour)); ok || probe {
		t.Fatalf("allow with the probe out = %v, %v; want neither", ok, probe)
	}
	b.probed(now.Add(2*time.Hour), nil)
	if b.isOpen() || b.current() != remote.BreakerClosed {
		t.Errorf("the probe's success left the breaker %v", b.current())
	}
}

// TestBreakerProbeFails: the breaker first waits an eighth of the cooldown
// before its probe; each failed probe reopens it for twice the last wait,
// at most the cooldown; a probe's success starts over.
func TestBreakerProbeFails(t *testing.T) {
	var b breaker
	b.init(2, time.Second, nil)
	now := time.Now()
	b.failure(now, errors.New("refused"))
	if b.isOpen() {
		t.Fatal("one failure of two opened the breaker")
	}
	b.failure(now, errors.New("refused"))
	if !b.isOpen() {
		t.Fatal("two failures of two left the breaker closed")
	}
	if _, probe := b.allow(now.Add(124 * time.Millisecond)); probe {
		t.Fatal("a probe before an eighth of the cooldown")
	}
	if _, probe := b.allow(now.Add(125 * time.Millisecond)); !probe {
		t.Fatal("no probe after an eighth of the cooldown")
	}
	end := now.Add(200 * time.Millisecond)
	for i, wait := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second} {
		b.probed(end, errors.New("refused"))
		if b.current() != remote.BreakerOpen || b.trips.Load() != uint64(i+2) {
			t.Fatalf("after failed probe %d: state %v, %d trips; want open, %d", i+1, b.current(), b.trips.Load(), i+2)
		}
		if _, probe := b.allow(end.Add(wait - time.Millisecond)); probe {
			t.Errorf("failed probe %d: a probe within %v", i+1, wait)
		}
		if _, probe := b.allow(end.Add(wait)); !probe {
			t.Errorf("failed probe %d: no probe %v after it", i+1, wait)
		}
		end = end.Add(wait)
	}
	b.probed(end, nil)
	b.failure(end, errors.New("refused"))
	b.failure(end, errors.New("refused"))
	if _, probe := b.allow(end.Add(125 * time.Millisecond)); !probe {
		t.Error("after a successful probe, the next opening waits more than an eighth of the cooldown")
	}
}

// TestBreakerTripAfterRecovery: a probe that failed does not open the
// breaker when a call that started after the probe was answered since.
func TestBreakerTripAfterRecovery(t *testing.T) {
	var b breaker
	b.init(5, time.Second, nil)
	start := time.Now()
	b.success(start.Add(10 * time.Millisecond)) // Redis came back
	b.trip(start, start.Add(time.Second), errors.New("refused"))
	if b.isOpen() {
		t.Fatal("a probe older than a success opened the breaker")
	}
	b.trip(start.Add(20*time.Millisecond), start.Add(time.Second), errors.New("refused"))
	if !b.isOpen() || b.trips.Load() != 1 {
		t.Errorf("a failed probe newer than every success left the breaker %v after %d trips", b.current(), b.trips.Load())
	}
}
