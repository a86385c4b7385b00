package main

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// A clock runs the load's goroutines and times them: the wall clock for
// runs over gRPC, or simulated time.
type clock interface {
	Now() time.Time
	// Sleep waits for d, or until ctx ends.
	Sleep(ctx context.Context, d time.Duration)
	// Go runs f on a goroutine of its own, which Wait waits for.
	Go(f func())
	// Wait returns once every goroutine started by Go has returned.
	Wait()
}

// wallClock is the real time.
type wallClock struct{ wg sync.WaitGroup }

func (*wallClock) Now() time.Time { return time.Now() }

func (*wallClock) Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *wallClock) Go(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

func (c *wallClock) Wait() { c.wg.Wait() }

// simClock is simulated time, for runs without gRPC: it stands still while
// any of its goroutines runs (on the CPU, or waiting for Redis), and when
// all of them sleep it jumps to the earliest wake-up. A run of minutes
// takes as long as its decisions do. The stores read it too (keyed's
// WithClock, redisstore's WithClientClock), so that their buckets refill
// in simulated time.
//
// Its goroutines must block on nothing but Sleep and on one another
// briefly (a lock held across a Sleep would stop the clock for good).
type simClock struct {
	mu      sync.Mutex
	now     time.Time
	running int // goroutines not asleep; 1 at first, for the goroutine that starts the others
	q       sleepers
	seq     uint64
	idle    chan struct{} // closed once no goroutine runs or sleeps
}

// newSimClock returns a clock at start whose caller counts as running
// until it calls Wait, so that time stands still while it starts the
// load's goroutines.
func newSimClock(start time.Time) *simClock {
	return &simClock{now: start, running: 1, idle: make(chan struct{})}
}

func (c *simClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep ignores ctx: a simulated run ends when its time is up.
func (c *simClock) Sleep(_ context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	s := &sleeper{at: c.now.Add(d), seq: c.seq, wake: make(chan struct{})}
	c.seq++
	heap.Push(&c.q, s)
	c.running--
	c.advance()
	c.mu.Unlock()
	<-s.wake
}

func (c *simClock) Go(f func()) {
	c.mu.Lock()
	c.running++
	c.mu.Unlock()
	go func() {
		defer c.exit()
		f()
	}()
}

func (c *simClock) exit() {
	c.mu.Lock()
	c.running--
	c.advance()
	c.mu.Unlock()
}

// Wait stops counting its caller as running and waits for the others.
func (c *simClock) Wait() {
	c.exit()
	<-c.idle
}

// advance moves time to the earliest wake-up and wakes every goroutine
// due then, when none runs. It is called with mu held.
func (c *simClock) advance() {
	if c.running > 0 {
		return
	}
	if len(c.q) == 0 {
		close(c.idle)
		return
	}
	c.now = c.q[0].at
	for len(c.q) > 0 && !c.q[0].at.After(c.now) {
		s := heap.Pop(&c.q).(*sleeper)
		c.running++
		close(s.wake)
	}
}

type sleeper struct {
	at   time.Time
	seq  uint64 // first asleep, first woken, among those due at once
	wake chan struct{}
}

// sleepers is a min-heap of sleepers by wake-up time.
type sleepers []*sleeper

func (h sleepers) Len() int { return len(h) }
func (h sleepers) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h sleepers) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *sleepers) Push(x any)   { *h = append(*h, x.(*sleeper)) }
func (h *sleepers) Pop() any {
	old := *h
	s := old[len(old)-1]
	*h = old[:len(old)-1]
	return s
}
