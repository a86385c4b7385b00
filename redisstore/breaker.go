package redisstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// breaker is a consecutive-failure circuit breaker with one half-open
// probe. Closed, it lets every call through and counts failures in a row;
// at the threshold it opens for the cooldown, during which no call reaches
// Redis. Then the first caller becomes the probe: its success closes the
// breaker, its failure reopens it for another cooldown. Other callers keep
// using the failure policy while the probe is out.
//
// The closed path costs one atomic load.
type breaker struct {
	threshold int
	cooldown  time.Duration

	open  atomic.Bool // open or half-open
	fails atomic.Int64
	trips atomic.Uint64

	mu       sync.Mutex
	openedAt time.Time
	probing  bool
}

func (b *breaker) init(threshold int, cooldown time.Duration) {
	b.threshold, b.cooldown = threshold, cooldown
}

// allow reports whether a call may go to Redis, and whether it is the
// half-open probe, which must be ended by success, failure or abandon.
func (b *breaker) allow(now time.Time) (probe, ok bool) {
	if !b.open.Load() {
		return false, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open.Load() {
		return false, true
	}
	if b.probing || now.Sub(b.openedAt) < b.cooldown {
		return false, false
	}
	b.probing = true
	return true, true
}

func (b *breaker) success(probe bool) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if !probe && !b.open.Load() {
		return
	}
	b.mu.Lock()
	if probe {
		b.probing = false
	}
	b.open.Store(false)
	b.mu.Unlock()
}

func (b *breaker) failure(probe bool, now time.Time) {
	n := b.fails.Add(1)
	if !probe && (n < int64(b.threshold) || b.open.Load()) {
		return
	}
	b.mu.Lock()
	if probe {
		b.probing = false
	}
	if probe || !b.open.Load() {
		b.openedAt = now
		b.open.Store(true)
		b.trips.Add(1)
	}
	b.mu.Unlock()
}

// abandon ends a call that tells nothing about Redis (the caller's context
// ended first).
func (b *breaker) abandon(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// retryAfter is the time until the breaker next lets a call through: a
// fail-closed rejection's retry hint. It is at least 1 ms.
func (b *breaker) retryAfter(now time.Time) time.Duration {
	d := time.Millisecond
	if b.open.Load() {
		b.mu.Lock()
		if w := b.cooldown - now.Sub(b.openedAt); w > d {
			d = w
		}
		b.mu.Unlock()
	}
	return d
}

func (b *breaker) isOpen() bool { return b.open.Load() }
