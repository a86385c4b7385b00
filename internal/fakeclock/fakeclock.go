// Package fakeclock is the controlled clock of floodgate's tests and
// simulations: a floodgate.Clock (keyed.WithClock, redisstore's
// WithClientClock, rls's WithQuotaClock, …) whose time moves only when
// told. A Clock is safe for concurrent use.
package fakeclock

import (
	"sync"
	"time"
)

// A Clock reads the time it was set to.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a Clock reading t.
func New(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward (backward for d < 0).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set sets the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}
