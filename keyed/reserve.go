package keyed

import (
	"context"

	"github.com/floodgate-go/floodgate"
)

// ReserveN takes n tokens, a call's estimated cost, from key's bucket under
// lim, as [Map.TakeN] does, and returns them as a [floodgate.Reservation]
// to settle once with the actual cost ([floodgate.Reserver]). The
// Reservation's Result is TakeN's, and so are the errors, with the
// Reservation then refused. Two differences: n == 0 reserves nothing but
// is refused while the bucket owes tokens, with RetryAfter the time until
// it owes none; and under the zero Limit, which admits nothing, n == 0 is
// refused too, with RetryAfter [floodgate.Never]. ReserveN allocates
// nothing; the context is not used.
func (m *Map) ReserveN(_ context.Context, key string, lim floodgate.Limit, n int) (floodgate.Reservation, error) {
	if err := check(lim, n); err != nil {
		return floodgate.Reservation{}, err
	}
	var res floodgate.Result
	var err error
	if n == 0 {
		m.reserveNone(&res, key, lim, m.now())
	} else {
		err = m.take(&res, key, lim, n, m.now())
	}
	return floodgate.NewReservation(m, key, lim, n, res), err
}

// reserveNone decides a reservation of no tokens into res: admitted unless
// the bucket owes tokens, or the limit admits nothing.
func (m *Map) reserveNone(res *floodgate.Result, key string, lim floodgate.Limit, now int64) {
	switch {
	case lim.IsInf():
		*res = floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst}
		return
	case lim.IsZero():
		*res = floodgate.Result{Limit: lim, RetryAfter: floodgate.Never}
		return
	}
	// The bucket is made, as by a take: the settle will charge it, and a
	// key the Map has no room for is decided by its shard's overflow
	// bucket, which may owe.
	s, k := m.hash(key)
	b, ev, evicted := m.lock(s, k, true, lim, now)
	tokens, at := b.st.refill(lim, now)
	reset := waitFor(lim, less(int64(lim.Burst)*unit, tokens))
	if tokens < 0 {
		b.st.owing(reset, at) // as a refused take does
	}
	b.meta |= refBit
	b.unlock()
	if evicted && m.onEvict != nil {
		m.onEvict(ev)
	}
	*res = floodgate.Result{Allowed: tokens >= 0, Limit: lim, ResetAfter: toDuration(reset)}
	if tokens < 0 {
		res.RetryAfter = toDuration(waitFor(lim, less(0, tokens)))
	}
	count(res, tokens)
}

// SettleN settles a take of reserved tokens from key's bucket under lim
// that cost actual tokens ([floodgate.Settler]): it refunds reserved −
// actual, never above lim.Burst, or charges actual − reserved, below zero
// down to lim.DebtLimit() tokens owed; a charge that does not fit is
// applied in whole tokens down to the debt limit and the error is a
// [*floodgate.DebtLimitError] with the tokens not charged. A refund to a
// key the Map no longer tracks is dropped: its bucket had refilled, was
// reset, or was the shard's overflow bucket (which then keeps the
// estimate). It returns [floodgate.ErrNegativeN] for a negative count and
// an error for an invalid lim, changing nothing, and allocates nothing but
// its errors (a *floodgate.DebtLimitError among them); the context is not
// used.
func (m *Map) SettleN(_ context.Context, key string, lim floodgate.Limit, reserved, actual int) (floodgate.Result, error) {
	if reserved < 0 || actual < 0 {
		return floodgate.Result{}, floodgate.ErrNegativeN
	}
	if err := check(lim, 0); err != nil {
		return floodgate.Result{}, err
	}
	if lim.IsInf() {
		return floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst}, nil
	}
	var res floodgate.Result
	if left := m.settle(&res, key, lim, actual-reserved, m.now()); left > 0 {
		return res, &floodgate.DebtLimitError{Uncharged: left}
	}
	return res, nil
}

// settle applies a settle of delta tokens (a charge when positive, a
// refund when negative) to key's bucket into res and returns the tokens
// not charged. A charge goes to the key's bucket, made full if the Map
// does not track it, or to the shard's overflow bucket when there is no
// room; a refund or a zero delta creates nothing.
func (m *Map) settle(res *floodgate.Result, key string, lim floodgate.Limit, delta int, now int64) int {
	s, k := m.hash(key)
	b, ev, evicted := m.lock(s, k, delta > 0, lim, now)
	left := 0
	if b.st == nil {
		*res = floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst}
	} else {
		left = b.st.settle(res, lim, delta, now)
		b.meta |= refBit
		b.unlock()
	}
	if evicted && m.onEvict != nil {
		m.onEvict(ev)
	}
	return left
}
