package rls

import (
	"sync"

	"github.com/floodgate-go/floodgate"
)

// reservations holds the reservations of requests that named themselves
// with a [ReservationKey] entry, until the charge on their response
// settles them, at most max of them and each for at most ttl. A
// reservation pushed out or expired keeps its estimate charged, which errs
// toward the limit.
type reservations struct {
	mu    sync.Mutex
	max   int
	ttl   int64 // ns
	m     map[string]*held
	order []string // insertion order, for expiry and eviction; may hold stale keys
	head  int
}

type held struct {
	r  floodgate.Reservation
	at int64 // ns, the clock's
}

func newReservations(max int, ttl int64) *reservations {
	return &reservations{max: max, ttl: ttl, m: map[string]*held{}}
}

// put keeps r under key, replacing any reservation kept there (which keeps
// its estimate charged).
func (t *reservations) put(key string, r floodgate.Reservation, now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	if _, ok := t.m[key]; !ok {
		for len(t.m) >= t.max && t.popLocked() {
		}
		t.order = append(t.order, key)
	}
	t.m[key] = &held{r: r, at: now}
}

// take removes and returns the reservation kept under key.
func (t *reservations) take(key string, now int64) (*floodgate.Reservation, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	h, ok := t.m[key]
	if !ok {
		return nil, false
	}
	delete(t.m, key)
	return &h.r, true
}

func (t *reservations) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// expireLocked drops the reservations older than ttl, oldest first.
func (t *reservations) expireLocked(now int64) {
	for t.head < len(t.order) {
		k := t.order[t.head]
		h, ok := t.m[k]
		if ok && now-h.at < t.ttl {
			break
		}
		if ok {
			delete(t.m, k)
		}
		t.advanceLocked()
	}
}

// popLocked drops the oldest reservation; false when there is none.
func (t *reservations) popLocked() bool {
	for t.head < len(t.order) {
		k := t.order[t.head]
		t.advanceLocked()
		if _, ok := t.m[k]; ok {
			delete(t.m, k)
			return true
		}
	}
	return false
}

func (t *reservations) advanceLocked() {
	t.order[t.head] = ""
	t.head++
	if t.head > 1024 && t.head*2 > len(t.order) {
		t.order = append(t.order[:0], t.order[t.head:]...)
		t.head = 0
	}
}
