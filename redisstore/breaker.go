package redisstore

import (
	"github.com/floodgate-go/floodgate/remote"
	"sync"
	"sync/atomic"
	"time"
)

// breaker is a consecutive-failure circuit breaker with one half-open
// probe. Closed, it lets every call through and counts failures in a row;
// at the threshold it opens for a wait, during which no call reaches
// Redis. Then the first caller starts the probe, a call of the store's own
// that does not hold the caller up (see Store.probe): its success closes
// the breaker, its failure reopens it for twice the wait. The first wait
// is an eighth of the cooldown, and the wait never grows past it: a
// Redis that restarted in milliseconds is back in use in tens, while one
// that stays away is probed once a cooldown. Callers keep using the
// failure policy while the breaker is open.
//
// The closed path costs one atomic load, the open one three: callers that
// the open breaker turns away cost next to nothing, and under load they
// are many, so they must not queue on a lock whose holder may be
// descheduled.
type breaker struct {
	threshold int
	cooldown  time.Duration
	wait      time.Duration // the next open's wait, under mu

	open    atomic.Bool  // open or half-open
	until   atomic.Int64 // unix ns: the end of the cooldown
	probing atomic.Bool
	fails   atomic.Int64
	trips   atomic.Uint64
	okAt    atomic.Int64 // unix ns: the start of a recent call Redis answered, to the ms

	mu       sync.Mutex
	openedAt time.Time
	state    remote.BreakerState // as reported: half-open from the first probe to a probe's outcome

	// notify, when set, receives every change of state, outside mu and in
	// order: transitions queue in pending under mu, and whoever queued one
	// delivers the queue under notifyMu.
	notify   func(transition)
	notifyMu sync.Mutex
	pending  []transition
}

// transition is a change of the breaker's state.
type transition struct {
	from, to remote.BreakerState
	kind     remote.ErrorKind // to open: the failure that opened it
	openFor  time.Duration    // to closed: since the breaker last opened
}

func (b *breaker) init(threshold int, cooldown time.Duration, notify func(transition)) {
	b.threshold, b.cooldown, b.notify = threshold, cooldown, notify
	b.wait = firstWait(cooldown)
}

// firstWait is the wait of a breaker that opens after being closed.
func firstWait(cooldown time.Duration) time.Duration { return max(cooldown/8, time.Millisecond) }

// setLocked moves the reported state to s and reports whether that queued a
// transition to deliver.
func (b *breaker) setLocked(s remote.BreakerState, now time.Time, err error) bool {
	if b.state == s {
		return false
	}
	t := transition{from: b.state, to: s}
	b.state = s
	if b.notify == nil {
		return false
	}
	switch s {
	case remote.BreakerOpen:
		t.kind = KindOf(err)
	case remote.BreakerClosed:
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

// allow reports whether a call may go to Redis now. When it may not but
// the cooldown is over and no probe is out, probe is true: the caller must
// start the probe, which ends with probed.
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	if !b.open.Load() {
		return true, false
	}
	if b.probing.Load() || now.UnixNano() < b.until.Load() {
		return false, false
	}
	b.mu.Lock()
	if !b.open.Load() {
		b.mu.Unlock()
		return true, false
	}
	if b.probing.Load() || now.UnixNano() < b.until.Load() {
		b.mu.Unlock()
		return false, false
	}
	b.probing.Store(true)
	queued := b.setLocked(remote.BreakerHalfOpen, now, nil)
	b.mu.Unlock()
	if queued {
		b.deliver()
	}
	return false, true
}

// success records a call that started at start and that Redis answered.
// It never closes an open breaker: such a call left before the breaker
// opened, and says little about Redis now (a slow server answers some
// calls within the deadline while most miss it). Only the probe closes it.
func (b *breaker) success(start time.Time) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	// To the millisecond: a store per call would bounce the line between
	// cores.
	if t := start.UnixNano(); t-b.okAt.Load() > int64(time.Millisecond) {
		b.okAt.Store(t)
	}
}

// failure records a failed call; err is its error.
func (b *breaker) failure(now time.Time, err error) {
	n := b.fails.Add(1)
	if n < int64(b.threshold) || b.open.Load() {
		return
	}
	b.mu.Lock()
	queued := false
	if !b.open.Load() {
		queued = b.openLocked(now, err)
	}
	b.mu.Unlock()
	if queued {
		b.deliver()
	}
}

// trip opens a closed breaker at once: a probe with a generous budget,
// started at start, failed, which is evidence enough, unless a call that
// started later has been answered since (Redis came back meanwhile).
func (b *breaker) trip(start, now time.Time, err error) {
	if b.okAt.Load() > start.UnixNano() {
		return
	}
	b.mu.Lock()
	queued := false
	if !b.open.Load() {
		queued = b.openLocked(now, err)
	}
	b.mu.Unlock()
	if queued {
		b.deliver()
	}
}

func (b *breaker) openLocked(now time.Time, err error) bool {
	if !b.open.Load() {
		b.openedAt = now
	}
	b.until.Store(now.Add(b.wait).UnixNano())
	b.wait = min(2*b.wait, b.cooldown)
	b.open.Store(true)
	b.trips.Add(1)
	return b.setLocked(remote.BreakerOpen, now, err)
}

// probed ends the probe: a nil err closes the breaker, any other reopens
// it for a cooldown from now.
func (b *breaker) probed(now time.Time, err error) {
	b.mu.Lock()
	b.probing.Store(false)
	var queued bool
	if err == nil {
		b.fails.Store(0)
		b.open.Store(false)
		b.wait = firstWait(b.cooldown)
		queued = b.setLocked(remote.BreakerClosed, now, nil)
	} else {
		queued = b.openLocked(now, err)
	}
	b.mu.Unlock()
	if queued {
		b.deliver()
	}
}

// retryAfter is the time until the breaker next lets a call through: a
// fail-closed rejection's retry hint. It is at least 1 ms.
func (b *breaker) retryAfter(now time.Time) time.Duration {
	d := time.Millisecond
	if b.open.Load() {
		d = max(d, time.Duration(b.until.Load()-now.UnixNano()))
	}
	return d
}

func (b *breaker) isOpen() bool { return b.open.Load() }

// current returns the breaker's state as reported.
func (b *breaker) current() remote.BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}
