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
	state    BreakerState // as reported: half-open from the first probe to a probe's outcome

	// notify, when set, receives every change of state, outside mu and in
	// order: transitions queue in pending under mu, and whoever queued one
	// delivers the queue under notifyMu.
	notify   func(transition)
	notifyMu sync.Mutex
	pending  []transition
}

// transition is a change of the breaker's state.
type transition struct {
	from, to BreakerState
	kind     ErrorKind     // to open: the failure that opened it
	openFor  time.Duration // to closed: since the breaker last opened
}

func (b *breaker) init(threshold int, cooldown time.Duration, notify func(transition)) {
	b.threshold, b.cooldown, b.notify = threshold, cooldown, notify
}

// setLocked moves the reported state to s and reports whether that queued a
// transition to deliver.
func (b *breaker) setLocked(s BreakerState, now time.Time, err error) bool {
	if b.state == s {
		return false
	}
	t := transition{from: b.state, to: s}
	b.state = s
	if b.notify == nil {
		return false
	}
	switch s {
	case BreakerOpen:
		t.kind = KindOf(err)
	case BreakerClosed:
		t.openFor = now.Sub(b.openedAt)
	}
	b.pending = append(b.pending, t)
	return true
}

// deliver hands the queued transitions to notify. It must be called without
// mu held.
func (b *breaker) deliver() {
	b.notifyMu.Lock()
	defer b.notifyMu.Unlock()
	b.mu.Lock()
	ts := b.pending
	b.pending = nil
	b.mu.Unlock()
	for _, t := range ts {
		b.notify(t)
	}
}

// allow reports whether a call may go to Redis, and whether it is the
// half-open probe, which must be ended by success, failure or abandon.
func (b *breaker) allow(now time.Time) (probe, ok bool) {
	if !b.open.Load() {
		return false, true
	}
	b.mu.Lock()
	if !b.open.Load() {
		b.mu.Unlock()
		return false, true
	}
	if b.probing || now.Sub(b.openedAt) < b.cooldown {
		b.mu.Unlock()
		return false, false
	}
	b.probing = true
	queued := b.setLocked(BreakerHalfOpen, now, nil)
	b.mu.Unlock()
	if queued {
		b.deliver()
	}
	return true, true
}

// success records a call that Redis answered. Only the probe closes an open
// breaker: another success while it is open comes from a call that left
// before it opened, and says little about Redis now (a slow server answers
// some calls within the deadline while most miss it).
func (b *breaker) success(probe bool) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if !probe {
		return
	}
	b.mu.Lock()
	if probe {
		b.probing = false
	}
	b.open.Store(false)
	queued := b.setLocked(BreakerClosed, time.Now(), nil)
	b.mu.Unlock()
	if queued {
		b.deliver()
	}
}

// failure records a failed call; err is its error.
func (b *breaker) failure(probe bool, now time.Time, err error) {
	n := b.fails.Add(1)
	if !probe && (n < int64(b.threshold) || b.open.Load()) {
		return
	}
	b.mu.Lock()
	if probe {
		b.probing = false
	}
	queued := false
	if probe || !b.open.Load() {
		b.openedAt = now
		b.open.Store(true)
		b.trips.Add(1)
		queued = b.setLocked(BreakerOpen, now, err)
	}
	b.mu.Unlock()
	if queued {
		b.deliver()
	}
}

// abandon ends a call that tells nothing about Redis (the caller's context
// ended first). The breaker stays half-open: the next caller probes.
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

// current returns the breaker's state as reported.
func (b *breaker) current() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}
