package redisstore

import (
	"errors"
	"testing"
	"time"
)

// TestBreakerLateSuccess: a call that left before the breaker opened and
// succeeds after does not close it; the probe after the cooldown does.
func TestBreakerLateSuccess(t *testing.T) {
	var b breaker
	b.init(1, time.Hour, nil)
	now := time.Now()
	probe, ok := b.allow(now) // a slow call leaves
	if probe || !ok {
		t.Fatalf("allow on a closed breaker = %v, %v", probe, ok)
	}
	b.failure(false, now, errors.New("timeout")) // another call fails: open
	b.success(false)                             // the slow call answers late
	if !b.isOpen() || b.current() != BreakerOpen {
		t.Fatalf("a late success closed the breaker: state %v", b.current())
	}
	if _, ok := b.allow(now.Add(time.Minute)); ok {
		t.Fatal("a call went through during the cooldown")
	}
	probe, ok = b.allow(now.Add(2 * time.Hour))
	if !probe || !ok {
		t.Fatalf("allow after the cooldown = %v, %v; want the probe", probe, ok)
	}
	b.success(true)
	if b.isOpen() || b.current() != BreakerClosed {
		t.Errorf("the probe's success left the breaker %v", b.current())
	}
}
