package floodgate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
)

// ErrSettled is returned by [Reservation.Settle] on a reservation that was
// already settled. The second settle changes nothing.
var ErrSettled = errors.New("floodgate: reservation already settled")

// ErrDebtLimit is wrapped by the error of a settle that charged less than
// it was asked to because the bucket reached its limit's debt limit. The
// error is a [*DebtLimitError], which says how many tokens were not charged.
var ErrDebtLimit = errors.New("floodgate: charge exceeds the debt limit")

// A DebtLimitError reports a settle whose charge went past the bucket's
// debt limit: the bucket was charged down to that limit, in whole tokens,
// and Uncharged tokens were not charged at all. They are the only tokens a
// settle can leave uncounted (see [Settler]).
type DebtLimitError struct {
	// Uncharged is the whole tokens of the charge that were not charged,
	// at least 1.
	Uncharged int
}

func (e *DebtLimitError) Error() string {
	return ErrDebtLimit.Error() + ": " + strconv.Itoa(e.Uncharged) + " tokens not charged"
}

// Unwrap returns [ErrDebtLimit].
func (e *DebtLimitError) Unwrap() error { return ErrDebtLimit }

// A Settler settles takes whose actual cost became known after the call.
//
// SettleN settles a take of reserved tokens from key's bucket under lim that
// turned out to cost actual tokens, atomically:
//
//   - actual < reserved refunds reserved − actual, never above lim.Burst. A
//     bucket the store no longer holds had refilled (or was reset) and
//     stays full: the refund is dropped.
//   - actual > reserved charges actual − reserved whatever the bucket
//     holds: below zero if need be, down to lim.DebtLimit() tokens owed. A
//     charge that does not fit is applied in whole tokens down to the debt
//     limit, and the error is a [*DebtLimitError] (wrapping [ErrDebtLimit])
//     that says how many tokens were not charged.
//   - actual == reserved changes nothing.
//
// The Result reports the bucket after the settle: Allowed (true whenever
// the settle was applied, in full or down to the debt limit), Remaining,
// Owed and ResetAfter; RetryAfter is 0.
//
// SettleN applies under lim whatever limit the bucket was used under since
// the take: stores keep no limit, and the next take under another limit
// applies that one (a lower burst caps a fuller bucket; debt is kept).
// SettleN returns [ErrNegativeN] for a negative reserved or actual, and an
// error wrapping [ErrInvalidLimit] for an invalid lim, and then changes
// nothing. Under [Inf] it changes nothing. Other errors are the store's
// (a remote store unreachable, a context done).
//
// Tokens are never created: a refund returns at most what was reserved, and
// never above the burst. The only tokens a settle can fail to count are
// those a [*DebtLimitError] reports, so over any window of length t a
// bucket admits at most Burst + Rate·t + DebtLimit tokens of actual cost,
// plus the tokens reported not charged.
type Settler interface {
	SettleN(ctx context.Context, key string, lim Limit, reserved, actual int) (Result, error)
}

// A Reserver is a [Store] whose takes can be settled once their cost is
// known: for quotas whose cost (the tokens of a model's reply, the rows a
// query scanned, the bytes a stream sent) is known only after the call.
//
// ReserveN takes n tokens, the call's estimated cost, from key's bucket
// under lim as TakeN does, with the same Result and errors, and returns
// them as a [Reservation] to settle with the actual cost. With one
// exception: n == 0 reserves nothing but is refused while the bucket owes
// tokens (a TakeN of 0 is a peek, always allowed), so that a call with no
// estimate, all of whose cost is charged when it settles, is held back by
// debt like every other.
//
// A reservation that is never settled keeps its estimate charged: a process
// that dies holding reservations, or a caller that drops one, errs toward
// the limit (the bucket counts each call at its estimate), never over it.
type Reserver interface {
	Store
	Settler
	ReserveN(ctx context.Context, key string, lim Limit, n int) (Reservation, error)
}

// A Reservation is a take whose cost is settled after the call: the tokens a
// [Reserver] took as the call's estimate, to settle once with
// [Reservation.Settle] when the actual cost is known.
//
// A Reservation is a value and costs no allocation. Settle it through one
// variable, or pointers to it: Settle marks that variable settled, and a
// copy of an unsettled Reservation would settle again. Concurrent Settle
// calls on one variable are safe: one settles, the others return
// [ErrSettled].
//
// The zero Reservation, like a refused one, holds no tokens.
type Reservation struct {
	// Result is the decision on the reservation's take: Allowed reports
	// whether the tokens were reserved.
	Result Result

	s       Settler
	key     string
	lim     Limit
	n       int
	settled uint32 // atomic: 1 once Settle has run
}

// NewReservation returns a Reservation of n tokens taken from key's bucket
// under lim with the decision res, which s settles. It is for [Reserver]
// implementations. A nil s makes a Reservation whose store took nothing (a
// remote store's fail-open decision): it settles to nothing, as a refused
// one does.
func NewReservation(s Settler, key string, lim Limit, n int, res Result) Reservation {
	return Reservation{Result: res, s: s, key: key, lim: lim, n: n}
}

// Settle settles the reservation at its actual cost, once: it refunds the
// difference when actual is below the tokens reserved (never above the
// burst) and charges it when actual is above (below zero if need be, down
// to the limit's debt limit; the part beyond is not charged, and the error
// is a [*DebtLimitError]). Settle(ctx, 0) gives the whole estimate back: the
// call was not made. See [Settler] for the arithmetic and the bound.
//
// Settle applies under the limit the reservation was made under, also when
// the key's limit changed since (a config reload, the CPU gate): the refund
// is capped at that limit's burst and the charge at its debt limit, and the
// next take under the new limit applies the new one, as always (it caps a
// fuller bucket at the new burst and keeps any debt).
//
//   - A second Settle returns [ErrSettled] and changes nothing.
//   - A negative actual returns [ErrNegativeN] and changes nothing; the
//     reservation can still be settled.
//   - A refused reservation (Result.Allowed false), the zero Reservation and
//     one whose store took nothing hold no tokens: Settle marks it settled
//     and returns its Result and nil, whatever actual. To charge work done
//     despite a refusal, call the store's SettleN with reserved 0.
//   - An actual equal to the tokens reserved changes nothing and makes no
//     call: Settle returns the reservation's Result.
//
// Otherwise Settle returns what the store's SettleN returns. A settle whose
// call fails (a remote store unreachable, ctx done) is spent all the same,
// since the store may have applied it before failing: the bucket keeps the
// estimate, or the settle, never both. Settle with a live context: the
// call's own may have ended with the call (context.WithoutCancel keeps its
// values without its end).
func (r *Reservation) Settle(ctx context.Context, actual int) (Result, error) {
	if actual < 0 {
		return Result{}, ErrNegativeN
	}
	if !atomic.CompareAndSwapUint32(&r.settled, 0, 1) {
		return Result{}, ErrSettled
	}
	if r.s == nil || !r.Result.Allowed || actual == r.n {
		return r.Result, nil
	}
	return r.s.SettleN(ctx, r.key, r.lim, r.n, actual)
}

// Tokens returns the tokens reserved: the estimate the reservation took,
// and 0 for a refused one.
func (r *Reservation) Tokens() int {
	if !r.Result.Allowed {
		return 0
	}
	return r.n
}

// A Take asks for N tokens of Key's bucket under Limit: one of the buckets
// a request takes from together.
type Take struct {
	Key   string
	Limit Limit
	N     int
}

// An AllReserver reserves the takes of one request all or none, in one
// call: envoyproxy/ratelimit's descriptors of a request, or a tenant's
// quota and a route's, where a request one bucket refuses must take
// nothing from the others.
//
// ReserveAll reserves takes[i] into rs[i] for every i (rs must be at least
// as long as takes) and returns -1 when every take was reserved. Otherwise
// it returns the index of the first take refused, and no take holds tokens:
// each rs[i] settles to nothing (Tokens 0), and its Result is what take i's
// bucket decided or would have decided alone, Allowed when the take fitted.
// An error is ReserveN's for takes[refused] (an invalid take is refused
// before anything is taken); no take then holds tokens.
type AllReserver interface {
	Reserver
	ReserveAll(ctx context.Context, takes []Take, rs []Reservation) (refused int, err error)
}

// ReserveAll reserves takes on r all or none, as [AllReserver] says: with
// r's own ReserveAll when r is one, else with ReserveN, take after take,
// settling every reservation already taken to nothing when one is refused
// or fails. The takes after a refused one are then not decided: their
// Result is the zero Result.
func ReserveAll(ctx context.Context, r Reserver, takes []Take, rs []Reservation) (int, error) {
	if len(rs) < len(takes) {
		return -1, fmt.Errorf("floodgate: ReserveAll: %d reservations for %d takes", len(rs), len(takes))
	}
	if ar, ok := r.(AllReserver); ok {
		return ar.ReserveAll(ctx, takes, rs)
	}
	for i, t := range takes {
		var err error
		rs[i], err = r.ReserveN(ctx, t.Key, t.Limit, t.N)
		if err == nil && rs[i].Result.Allowed {
			continue
		}
		for j := range rs[:i] {
			rs[j].Settle(context.WithoutCancel(ctx), 0)
			rs[j] = NewReservation(nil, takes[j].Key, takes[j].Limit, 0, rs[j].Result)
		}
		res := rs[i].Result
		rs[i] = NewReservation(nil, t.Key, t.Limit, 0, res)
		for j := i + 1; j < len(takes); j++ {
			rs[j] = Reservation{}
		}
		return i, err
	}
	return -1, nil
}
