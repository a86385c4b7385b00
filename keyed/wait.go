package keyed

import (
	"context"
	"hash/maphash"
	"time"

	"github.com/floodgate-go/floodgate"
)

// WaitN takes n tokens from key's bucket under lim, waiting for them if the
// bucket is short. Unlike [floodgate.Wait], it reserves: the tokens are
// owed from the moment WaitN decides to wait, so waiters are served in the
// order they arrive and takes by others see the debt.
//
// WaitN returns at once, having taken nothing, with:
//   - [floodgate.ErrExceedsBurst] when n exceeds lim.Burst;
//   - [floodgate.ErrWouldExceedDeadline] when the tokens would come after
//     ctx's deadline, or never (a zero rate);
//   - ctx.Err() when ctx is already done;
//   - an error for an invalid lim or a negative n.
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
		return floodgate.ErrExceedsBurst
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := m.now()
	h := maphash.String(m.seed, key)
	s := m.shardOf(h)
	s.mu.Lock()
	st := s.tab.find(h, true)
	if st == nil {
		var evicted bool
		var ev Eviction
		st, evicted, ev = m.insert(s, h, lim, now)
		if evicted && m.onEvict != nil {
			defer m.onEvict(ev) // after the unlock below
		}
		if st != &s.overflow {
			// A new bucket is full and n ≤ burst: no wait.
			var res floodgate.Result
			st.take(&res, lim, n, now)
			s.stats.Allowed++
			s.mu.Unlock()
			return nil
		}
	}
	tokens, at := st.refill(lim, now)
	need := int64(n) * unit
	wait := waitFor(lim, need-tokens)
	if wait > 0 {
		deadline, ok := ctx.Deadline()
		if wait == never || ok && at+wait > m.at(deadline) {
			s.stats.Rejected++
			s.mu.Unlock()
			return floodgate.ErrWouldExceedDeadline
		}
	}
	st.set(lim, tokens-need, at)
	s.stats.Allowed++
	s.mu.Unlock()
	if wait == 0 {
		return nil
	}

	t := time.NewTimer(time.Duration(wait))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
	}
	// Give the reservation back. The bucket may have been evicted or
	// reset meanwhile; then there is nothing to give back to.
	s.mu.Lock()
	if st := s.tab.find(h, false); st != nil {
		tokens, at := st.refill(lim, m.now())
		st.set(lim, min(tokens+need, int64(lim.Burst)*unit), at)
	}
	s.stats.Allowed--
	s.stats.Rejected++
	s.mu.Unlock()
	return ctx.Err()
}
