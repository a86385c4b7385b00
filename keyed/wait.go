package keyed

import (
	"context"
	"math"
	"time"

	"github.com/floodgate-go/floodgate"
)

// WaitN takes n tokens from key's bucket under lim, waiting for them if the
// bucket is short. Unlike [floodgate.Wait], it reserves: the tokens are
// owed from the moment WaitN decides to wait, so waiters are served in the
// order they arrive and takes by others see the debt.
//
// WaitN returns at once, having taken nothing, with:
//   - [floodgate.ErrExceedsBurst] when n exceeds lim.Burst ≥ 1;
//   - [floodgate.ErrWouldExceedDeadline] when the tokens would come after
//     ctx's deadline, or never (a zero rate, or the zero Limit);
//   - ctx.Err() when ctx is already done;
//   - [floodgate.ErrNegativeN] for a negative n, and an error for an
//     invalid lim.
//
// When ctx ends during the wait, WaitN gives the reserved tokens back (up
// to the burst) and returns ctx.Err(). n == 0 and [floodgate.Inf] return nil
// at once.
func (m *Map) WaitN(ctx context.Context, key string, lim floodgate.Limit, n int) error {
	if err := check(lim, n); err != nil {
		return err
	}
	if n == 0 || lim.IsInf() {
		return nil
	}
	if n > lim.Burst {
		if lim.Burst == 0 {
			return floodgate.ErrWouldExceedDeadline // the zero Limit admits nothing
		}
		return floodgate.ErrExceedsBurst
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := m.now()
	s, k := m.hash(key)
	b, ev, evicted := m.lock(s, k, true, lim, now)
	wait, err := m.reserve(ctx, b.st, lim, n, now)
	b.meta |= refBit
	b.unlock()
	if evicted && m.onEvict != nil {
		m.onEvict(ev)
	}
	if err != nil || wait == 0 {
		return err
	}
	return m.sleep(ctx, s, k, b.sl == nil, lim, n, wait)
}

// reserve takes n tokens from st, which the caller holds locked, unless
// they would come after ctx's deadline, and returns how long they take to
// arrive.
func (m *Map) reserve(ctx context.Context, st *state, lim floodgate.Limit, n int, now int64) (int64, error) {
	tokens, at := st.refill(lim, now)
	need := int64(n) * unit
	if tokens < math.MinInt64+need {
		// Reservations already owe more than an int64 counts: with a
		// burst above 2^32, the queue is bounded by the arithmetic.
		return 0, floodgate.ErrWouldExceedDeadline
	}
	wait := waitFor(lim, less(need, tokens))
	if wait > 0 {
		deadline, ok := ctx.Deadline()
		if wait == never || ok && at+wait > m.at(deadline) {
			return 0, floodgate.ErrWouldExceedDeadline
		}
	}
	st.set(lim, tokens-need, at)
	return wait, nil
}

// sleep waits for a reservation of n tokens in key k's bucket, or in the
// shard's overflow bucket, to come due, and gives it back if ctx ends first.
func (m *Map) sleep(ctx context.Context, s *shard, k uint64, overflow bool, lim floodgate.Limit, n int, wait int64) error {
	t := time.NewTimer(time.Duration(wait))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
	}
	// Give the reservation back while it is still owed. Until it comes
	// due the bucket is in debt; one that is not was reset or evicted and
	// made anew, and owes this reservation nothing.
	give := func(st *state) {
		tokens, at := st.refill(lim, m.now())
		if tokens >= 0 {
			return
		}
		st.set(lim, min(tokens+int64(n)*unit, int64(lim.Burst)*unit), at)
	}
	if overflow {
		s.mu.Lock()
		give(&s.overflow)
		s.mu.Unlock()
	} else if b, _, _ := m.lock(s, k, false, lim, 0); b.st != nil {
		give(b.st)
		b.unlock()
	}
	return ctx.Err()
}
