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

// split returns this instance's share of lim and the part of lim that
// Redis holds, the pool, and reports whether lim is split at all. With N
// instances counted (or the local divisor rounded up, when larger), each
// share has a burst of b = ⌊f×burst/N⌋ whole tokens and the rate that goes with it,
// rate×b/burst; the pool has the rest of both: burst − N×b tokens at
// rate×(burst − N×b)/burst. So the shares and the pool together never hold
// more than the bucket would. A limit whose share would hold less than one
// token is not split, nor is any limit before the first count (a new
// instance does not know how many share the limits yet), nor Inf or a
// limit that admits nothing: the pool is then lim itself.
func (s *Store) split(lim floodgate.Limit) (share, pool floodgate.Limit, ok bool) {
	sh := s.shares
	if sh == nil || lim.Burst < 1 || lim.IsInf() {
		return floodgate.Limit{}, lim, false
	}
	count := int(s.inst.count.Load())
	if count < 1 {
		return floodgate.Limit{}, lim, false
	}
	k := max(count, int(math.Ceil(s.opts.divisor)))
	b := int(sh.f * float64(lim.Burst) / float64(k))
	if b < 1 {
		return floodgate.Limit{}, lim, false
	}
	rest := lim.Burst - k*b
	share = floodgate.Limit{Rate: lim.Rate * float64(b) / float64(lim.Burst), Burst: b, Debt: lim.Debt}
	pool = floodgate.Limit{Rate: lim.Rate * float64(rest) / float64(lim.Burst), Burst: rest, Debt: lim.Debt}
	if lim.Debt > 0 {
		share.Debt = max(1, lim.Debt*b/lim.Burst)
		pool.Debt = max(1, lim.Debt*rest/lim.Burst)
	}
	return share, pool, true
}

// poolOf returns the part of lim that Redis holds.
func (s *Store) poolOf(lim floodgate.Limit) floodgate.Limit {
	_, pool, _ := s.split(lim)
	return pool
}

// takeShare takes n ≥ 1 tokens from this instance's share of key's bucket,
// and reports whether it could; a refusal takes nothing. The Result is the
// whole bucket's as far as this instance can tell: see whole.
func (s *Store) takeShare(key string, lim, share floodgate.Limit, n int) (floodgate.Result, bool) {
	if n > share.Burst {
		return floodgate.Result{}, false
	}
	s.register() // keep this instance counted while shares decide alone
	res, err := s.shares.m.TakeN(context.Background(), key, share, n)
	if err != nil || !res.Allowed {
		return floodgate.Result{}, false
	}
	s.shared.Add(1)
	s.decided(floodgate.SourceLease)
	return s.whole(res, lim, share), true
}

// reserveShare is takeShare for a reservation, which settles on the share.
func (s *Store) reserveShare(key string, lim, share floodgate.Limit, n int) (floodgate.Reservation, bool) {
	if n > share.Burst {
		return floodgate.Reservation{}, false
	}
	s.register()
	r, err := s.shares.m.ReserveN(context.Background(), key, share, n)
	if err != nil || !r.Result.Allowed {
		return floodgate.Reservation{}, false
	}
	s.shared.Add(1)
	s.decided(floodgate.SourceLease)
	r.Result = s.whole(r.Result, lim, share)
	return r, true
}

// whole turns a decision of the share into one of lim: Remaining and
// ResetAfter scaled from the share to the whole bucket, which is exact
// while every instance's share and the pool drain alike (as they do when
// the instances see a key's requests in equal parts), and Source
// floodgate.SourceLease.
func (s *Store) whole(res floodgate.Result, lim, share floodgate.Limit) floodgate.Result {
	res.Limit = lim
	res.Remaining = int(int64(res.Remaining) * int64(lim.Burst) / int64(share.Burst))
	res.Owed = int(int64(res.Owed) * int64(lim.Burst) / int64(share.Burst))
	res.Source = floodgate.SourceLease
	return res
}

// shareRoom returns the whole tokens this instance's share of key holds
// under share now.
func (s *Store) shareRoom(key string, share floodgate.Limit) int {
	return int(s.shares.m.Tokens(key, share))
}

// pooled turns a decision of the pool into one of lim: the limit is lim's,
// Remaining adds what this instance's share holds, and a refusal may be
// retried as soon as either the share or the pool could admit it.
func (s *Store) pooled(res floodgate.Result, key string, lim, share floodgate.Limit, n int) floodgate.Result {
	res.Limit = lim
	room := s.shareRoom(key, share)
	res.Remaining += max(room, 0)
	if !res.Allowed && n <= share.Burst && res.Owed == 0 {
		if wait := waitFor(share, int64(n-room)*1e9); wait < res.RetryAfter {
			res.RetryAfter = wait
		}
	}
	return res
}

// tooLarge is the refusal of a take that neither this instance's share of
// lim nor the pool can ever hold at once, although lim could (see
// WithShares).
func (s *Store) tooLarge(lim floodgate.Limit) floodgate.Result {
	s.counts[floodgate.SourceRedis].Add(1)
	return floodgate.Result{Limit: lim, RetryAfter: floodgate.Never, Source: floodgate.SourceRedis}
}
