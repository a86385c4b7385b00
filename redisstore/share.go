package redisstore

import (
	"context"
	"math"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
)

// shares holds this instance's share of every bucket (WithShares): an
// in-process bucket per key, at the part of the limit split off for it.
type shares struct {
	f float64
	m *keyed.Map
}

func newShares(f float64, keys int, clock floodgate.Clock) (*shares, error) {
	opts := []keyed.Option{keyed.WithCapacity(keys)}
	if clock != nil {
		opts = append(opts, keyed.WithClock(clock))
	}
	m, err := keyed.New(opts...)
	if err != nil {
		return nil, err
	}
	return &shares{f: f, m: m}, nil
}

// split returns this instance's share of lim, and reports whether it may
// decide on it now, and the part of lim that Redis holds, the pool. With N
// instances counted (or the local divisor rounded up, when larger), each
// share has a burst of b = ⌊f×burst/N⌋ whole tokens and the rate that goes
// with it, rate×b/burst; the pool has the rest of both: burst − N×b tokens
// at rate×(burst − N×b)/burst. So the shares and the pool together never
// hold more than the bucket would. A limit whose share would hold less than
// one token is not split (the pool is lim itself), nor is Inf or a limit
// that admits nothing.
//
// An instance whose count is not current (see instances.sharing: before
// its second registration in a row, or once its registrations stopped
// long enough for the others to drop it) decides nothing on its share and
// takes from the pool as if it were the only instance, the smallest pool
// any count gives: it never takes what the others' shares hold.
func (s *Store) split(lim floodgate.Limit) (share, pool floodgate.Limit, ok bool) {
	sh := s.shares
	if sh == nil || lim.Burst < 1 || lim.IsInf() {
		return floodgate.Limit{}, lim, false
	}
	k := 1
	ok = s.inst.sharing()
	if ok {
		k = max(int(s.inst.count.Load()), int(math.Ceil(s.opts.divisor)))
	}
	b := int(sh.f * float64(lim.Burst) / float64(k))
	if b < 1 {
		return floodgate.Limit{}, lim, false
	}
	rest := lim.Burst - k*b
	share = floodgate.Limit{Rate: part(lim.Rate, b, lim.Burst), Burst: b, Debt: floodgate.NoDebt}
	pool = floodgate.Limit{Rate: part(lim.Rate, rest, lim.Burst), Burst: rest, Debt: floodgate.NoDebt}
	// The debt limit splits as the burst does, in whole tokens: a part
	// whose share of it rounds to nothing carries none.
	debt := lim.DebtLimit()
	if d := int(float64(debt) * float64(b) / float64(lim.Burst)); d > 0 {
		share.Debt = d
	}
	if d := debt - k*max(share.Debt, 0); d > 0 {
		pool.Debt = d
	}
	return share, pool, ok
}

// part returns rate×n/of.
func part(rate float64, n, of int) float64 { return rate * float64(n) / float64(of) }

// poolOf returns the part of lim that Redis holds.
func (s *Store) poolOf(lim floodgate.Limit) floodgate.Limit {
	_, pool, _ := s.split(lim)
	return pool
}

// reserveShare reserves n ≥ 1 tokens of this instance's share of key's
// bucket, a reservation that settles on the share, and reports whether it
// could; a take is the same reservation never settled. A refusal takes
// nothing; its Result is the share's, in the share's tokens.
func (s *Store) reserveShare(key string, lim, share floodgate.Limit, n int) (floodgate.Reservation, floodgate.Result, bool) {
	if n > share.Burst {
		return floodgate.Reservation{}, floodgate.Result{Limit: share, RetryAfter: floodgate.Never}, false
	}
	r, err := s.shares.m.ReserveN(context.Background(), key, share, n)
	if err != nil || !r.Result.Allowed {
		return floodgate.Reservation{}, r.Result, false
	}
	s.shared.Add(1)
	s.decided(floodgate.SourceLease)
	r.Result = s.whole(r.Result, lim, share)
	return r, r.Result, true
}

// peekShare reports this instance's share of key's bucket, taking nothing.
func (s *Store) peekShare(key string, share floodgate.Limit) floodgate.Result {
	res, _ := s.shares.m.Peek(context.Background(), key, share)
	return res
}

// whole turns a decision of the share into one of lim: Remaining and Owed
// scaled from the share to the whole bucket, which is exact while every
// instance's share and the pool drain alike (as they do when the
// instances see a key's requests in equal parts), and Source
// floodgate.SourceLease.
func (s *Store) whole(res floodgate.Result, lim, share floodgate.Limit) floodgate.Result {
	scale := float64(lim.Burst) / float64(share.Burst)
	res.Limit = lim
	res.Remaining = int(float64(res.Remaining) * scale)
	res.Owed = int(math.Ceil(float64(res.Owed) * scale))
	res.Source = floodgate.SourceLease
	return res
}

// pooled turns a decision of the pool into one of lim: the Limit is lim,
// Remaining and Owed add the share's (sh, a decision or a peek of this
// instance's share; the zero Result when it has none), and a refusal may
// be retried as soon as either part could admit it.
func (s *Store) pooled(res floodgate.Result, lim floodgate.Limit, sh floodgate.Result) floodgate.Result {
	res.Limit = lim
	res.Remaining += sh.Remaining
	res.Owed += sh.Owed
	if !res.Allowed && !sh.Allowed && sh.Limit.Burst > 0 && sh.RetryAfter < res.RetryAfter {
		res.RetryAfter = sh.RetryAfter
	}
	return res
}

// beyondPool is the refusal of a take of n tokens, at most lim's burst,
// that the pool can never hold at once: until this instance's share holds
// them (sh, its refusal, says when), or for good when neither part can
// (see WithShares), decided here.
func (s *Store) beyondPool(lim, share floodgate.Limit, ok bool, n int, sh floodgate.Result) floodgate.Result {
	s.decided(floodgate.SourceLease)
	res := floodgate.Result{RetryAfter: floodgate.Never, Source: floodgate.SourceLease}
	if !ok || n > share.Burst {
		sh = floodgate.Result{}
	}
	return s.pooled(res, lim, sh)
}
