package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Every call to Redis needs a context that ends at its deadline. A timer per
// call (context.WithTimeout) was the largest client cost with many
// concurrent callers, so calls that start within the same millisecond share
// one: a slot ends budget after the start of its millisecond, so no call
// gets more than the budget, and at most about budget/1ms timers are live.
// While the process is starved of CPU the budget is stretched (see
// Store.stretch); each slot is made with the stretch of its millisecond.

type deadlineSlot struct {
	start    int64 // unix ns, a multiple of 1 ms
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelFunc // never called: the deadline releases the timer
}

type deadlineSlots struct {
	budget time.Duration
	mu     sync.Mutex
	cur    atomic.Pointer[deadlineSlot]
}

func (s *deadlineSlots) get(now time.Time, stretch func() time.Duration) *deadlineSlot {
	start := now.UnixNano() / int64(time.Millisecond) * int64(time.Millisecond)
	if sl := s.cur.Load(); sl != nil && sl.start == start {
		return sl
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.cur.Load(); sl != nil && sl.start == start {
		return sl
	}
	sl := &deadlineSlot{start: start, deadline: time.Unix(0, start).Add(s.budget + stretch())}
	sl.ctx, sl.cancel = context.WithDeadline(context.Background(), sl.deadline)
	s.cur.Store(sl)
	return sl
}

// slotCtx is the caller's context for values (tracing hooks read them), with
// its slot's deadline and cancellation. The caller's own cancellation does
// not reach the call, which ends by the deadline anyway; the store checks it
// when the call returns.
type slotCtx struct {
	context.Context
	sl *deadlineSlot
}

func (c *slotCtx) Deadline() (time.Time, bool) { return c.sl.deadline, true }
func (c *slotCtx) Done() <-chan struct{}       { return c.sl.ctx.Done() }
func (c *slotCtx) Err() error                  { return c.sl.ctx.Err() }

// callCtx returns the context for one call to Redis: bounded by the budget
// (stretched while the process is starved), or by ctx's deadline if that
// comes first (then with a timer of its own).
func (s *Store) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	now := time.Now()
	sl := s.slots.get(now, s.stretch)
	if dl, ok := ctx.Deadline(); ok && dl.Before(sl.deadline) {
		return context.WithDeadline(ctx, dl)
	}
	return &slotCtx{Context: ctx, sl: sl}, noCancel
}

func noCancel() {}
