package redisstore

import (
	"context"

	"github.com/floodgate-go/floodgate"
)

// ReserveN takes n tokens, a call's estimated cost, from key's bucket under
// lim, as [Store.TakeN] does (one script call, the deny cache, leases,
// batching and the failure policy alike), and returns them as a
// [floodgate.Reservation] to settle once with the actual cost
// ([floodgate.Reserver]). Its Result and errors are TakeN's, except that a
// reservation of 0 tokens is refused while the bucket owes tokens (and
// under the zero Limit, for good).
//
// The Reservation settles where its tokens were taken, which its Result's
// Source says:
//
//   - floodgate.SourceRedis and floodgate.SourceLease: on Redis, with
//     [Store.SettleN];
//   - floodgate.SourceFallback: on the [Local] policy's fallback store,
//     under the scaled limit it decided with, when that store is a
//     [floodgate.Settler] (the default keyed.Map is); otherwise nowhere;
//   - floodgate.SourceFailOpen: nowhere, since nothing was taken;
//   - a refusal: nowhere, as every refused Reservation.
//
// A process that dies holding reservations leaves their estimates charged
// on Redis: the bucket counts each such call at its estimate, which errs
// toward the limit, never over it. So does a reservation whose caller's
// context ended after Redis took the tokens: ReserveN then returns the
// context's error, and the tokens stay taken.
func (s *Store) ReserveN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Reservation, error) {
	res, st, err := s.take(ctx, key, lim, n, true)
	if !res.Allowed {
		st = nil
	}
	return floodgate.NewReservation(st, key, lim, n, res), err
}

// SettleN settles a take of reserved tokens from key's bucket under lim
// that cost actual tokens ([floodgate.Settler]), in one script call on
// Redis (or one decision of a batch), atomically, on the bucket's one key,
// so in one Cluster slot:
//
//   - actual < reserved refunds the difference, never above lim.Burst; a
//     bucket whose key is gone had refilled (or was reset) and stays so;
//   - actual > reserved charges the difference whatever the bucket holds,
//     below zero if need be, down to lim.DebtLimit() tokens owed, in whole
//     tokens; what does not fit is not charged, and the error is a
//     [*floodgate.DebtLimitError] that says how much;
//   - a bucket left owing tokens keeps its key until it is full again, as
//     every bucket below its burst does, so the debt outlives no TTL.
//
// A refund drops this process's deny-cache entry for key; a settle that
// leaves the bucket owing drops this process's lease on key, so that its
// takes are refused from then on (other processes' leases end within the
// lease time: see [WithLeases]).
//
// SettleN never goes to the failure policy: a settle Redis does not apply
// is applied nowhere else. It returns [floodgate.ErrNegativeN] for a
// negative count, an error for an invalid limit or a key longer than
// [MaxKeyLen], making no call, and an error wrapping [ErrUnavailable] when
// Redis cannot answer, or the context's error when it ends first. The
// refund is then lost, which errs toward the limit, and so is the charge,
// which does not: charge it again once Redis answers with
// SettleN(ctx, key, lim, 0, actual−reserved) (a call that timed out after
// Redis applied it is then charged twice, which errs toward the limit).
// Settles count in no [Stats] field but Errors.
func (s *Store) SettleN(ctx context.Context, key string, lim floodgate.Limit, reserved, actual int) (floodgate.Result, error) {
	if reserved < 0 || actual < 0 {
		return floodgate.Result{}, floodgate.ErrNegativeN
	}
	if err := check(key, lim, 0); err != nil {
		return floodgate.Result{}, err
	}
	if lim.IsInf() {
		return floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst, Source: floodgate.SourceRedis}, nil
	}
	if err := ctx.Err(); err != nil {
		return floodgate.Result{}, err
	}
	return s.settle(ctx, key, lim, reserved, actual)
}

// settle is SettleN past its checks.
func (s *Store) settle(ctx context.Context, key string, lim floodgate.Limit, reserved, actual int) (floodgate.Result, error) {
	delta := actual - reserved
	if s.cache != nil && delta < 0 {
		s.cache.Remove(key)
	}
	o := op{key: s.Key(key), lim: lim, n: delta, mode: modeSettle}
	r, err := s.call(ctx, &o)
	if err != nil {
		return floodgate.Result{}, s.unavailable(ctx, err)
	}
	res := o.result(r)
	if s.leases != nil && r.tokens < 0 {
		s.leases.owes(key)
	}
	if left := int64(delta) - r.taken; delta > 0 && left > 0 {
		return res, &floodgate.DebtLimitError{Uncharged: int(left)}
	}
	return res, nil
}
