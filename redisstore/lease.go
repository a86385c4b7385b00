package redisstore

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/floodgate-go/floodgate"
)

// leaseTable holds the tokens this process leased from hot buckets.
//
// A key is hot when it sees a second decision within the lease time. A
// decision on a hot key without enough leased tokens asks Redis for its own
// tokens plus up to rate×d more, in one atomic take (no more than the key's
// pace here would spend within d: see paced); the extra tokens are spent
// locally until d after the request was sent, then dropped. Every
// leased token was taken from the shared bucket no earlier than it was sent,
// and is spent within d of that, so over any window of length t all
// instances admit at most burst + rate×(t+d). A reservation served from a
// lease settles on the shared bucket, whose debt limit adds to that bound
// as it does without leases; a settle that leaves the bucket in debt drops
// this process's lease on the key, while other processes may spend theirs
// for up to d more, tokens taken before the debt, which rate×d counts.
type leaseTable struct {
	mu sync.Mutex // guards m and its entries: a decision reads and updates its lease at once
	d  int64      // ns
	m  *simplelru.LRU[string, *lease]
}

type lease struct {
	lim       floodgate.Limit
	tokens    int   // whole tokens left to spend
	expires   int64 // local ns
	seen      int64 // local ns of the last decision on the key
	remaining int   // the shared bucket's whole tokens when leased
}

// newLeaseTable returns a table of keys ≥ 1 entries, which evicts the key
// whose last decision is oldest: its lease is spent or expired, or the key
// is the coldest.
func newLeaseTable(d time.Duration, keys int) *leaseTable {
	m, _ := simplelru.NewLRU[string, *lease](keys, nil) // fails only for keys ≤ 0
	return &leaseTable{d: int64(d), m: m}
}

func (l *leaseTable) remove(key string) {
	l.mu.Lock()
	l.m.Remove(key)
	l.mu.Unlock()
}

// entryLocked returns key's entry, adding one if there is none.
func (l *leaseTable) entryLocked(key string) *lease {
	e, ok := l.m.Get(key)
	if !ok {
		e = &lease{seen: math.MinInt64 / 2}
		l.m.Add(key, e)
	}
	return e
}

// extra returns how many tokens beyond n to lease under lim.
func (l *leaseTable) extra(lim floodgate.Limit, n int) int {
	x := lim.Rate * float64(l.d) / 1e9
	if x > float64(lim.Burst-n) {
		return lim.Burst - n
	}
	return int(x)
}

// paced caps a lease's extra tokens x at what this process would spend
// within the lease time d at the pace of its last two decisions on the
// key, gap apart, n tokens each, less one decision's worth for the pace's
// jitter: a replica that sees a third of a key's demand leases a third as
// much, instead of tokens that expire unspent while the other replicas
// are refused. A key decided less than twice a lease time here leases
// nothing.
func paced(x int, d, gap int64, n int) int {
	if gap <= 0 {
		return x
	}
	if want := ((d-1)/gap - 1) * int64(n); want < int64(x) {
		return int(max(want, 0))
	}
	return x
}

// takeLeased decides a take of 1 ≤ n ≤ burst with leases on.
func (s *Store) takeLeased(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	l := s.leases
	now := s.local()
	l.mu.Lock()
	e := l.entryLocked(key)
	if e.lim == lim && now < e.expires && e.tokens >= n {
		e.tokens -= n
		e.seen = now
		res := floodgate.Result{Allowed: true, Limit: lim, Remaining: e.tokens + e.remaining, Source: floodgate.SourceLease}
		l.mu.Unlock()
		s.decided(floodgate.SourceLease)
		return res, nil
	}
	gap := now - e.seen
	hot := gap <= l.d
	e.seen = now
	l.mu.Unlock()

	o := op{key: s.Key(key), lim: lim, n: n, mode: modeTake}
	if x := paced(l.extra(lim, n), l.d, gap, n); hot && x > 0 {
		o.mode, o.n, o.min = modeLease, n+x, n
	}
	r, err := s.call(ctx, &o)
	if err != nil {
		if cerr := ended(ctx); cerr != nil {
			return floodgate.Result{}, cerr
		}
		return s.fail(ctx, &o, key, err)
	}
	s.counts[floodgate.SourceRedis].Add(1)
	res := o.result(r)
	if o.mode == modeLease && r.allowed {
		x := int(r.taken) - n
		res.Remaining += x
		l.mu.Lock()
		e := l.entryLocked(key)
		if e.lim == lim && now < e.expires && e.tokens > 0 {
			// Another lease of this key landed while this one was in
			// flight (both were sent while the lease ran short): keep its
			// tokens, which the shared bucket no longer holds, and spend
			// them all by the earlier expiry, so that no token is spent
			// later than d after the request that took it was sent.
			e.tokens += x
			e.expires = min(e.expires, now+l.d)
		} else {
			e.tokens, e.expires = x, now+l.d
		}
		e.lim, e.remaining = lim, res.Remaining-x
		l.mu.Unlock()
	} else if s.cache != nil && !r.allowed {
		s.cache.insert(key, lim, r.tokens*unit, now, res.RetryAfter)
	}
	return res, nil
}
