package redisstore

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/floodgate-go/floodgate"
)

// leaseTable holds the tokens this process leased from hot buckets.
//
// A key is hot when it sees a second decision within the lease time. A
// decision on a hot key without enough leased tokens asks Redis for its own
// tokens plus up to rate×d more, in one atomic take; the extra tokens are
// spent locally until d after the request was sent, then dropped. Every
// leased token was taken from the shared bucket no earlier than it was sent,
// and is spent within d of that, so over any window of length t all
// instances admit at most burst + rate×(t+d).
type leaseTable struct {
	mu   sync.Mutex
	d    int64 // ns
	size int
	m    map[string]*lease
}

type lease struct {
	lim       floodgate.Limit
	tokens    int   // whole tokens left to spend
	expires   int64 // local ns
	seen      int64 // local ns of the last decision on the key
	remaining int   // the shared bucket's whole tokens when leased
}

func newLeaseTable(d time.Duration, size int) *leaseTable {
	return &leaseTable{d: int64(d), size: size, m: make(map[string]*lease, size)}
}

func (l *leaseTable) remove(key string) {
	l.mu.Lock()
	delete(l.m, key)
	l.mu.Unlock()
}

// entryLocked returns key's entry, adding one (and evicting another when
// full) if there is none.
func (l *leaseTable) entryLocked(key string, now int64) *lease {
	if e := l.m[key]; e != nil {
		return e
	}
	if len(l.m) >= l.size {
		evictSampled(l.m, func(e *lease) bool { return now-e.seen > l.d && now >= e.expires })
	}
	e := &lease{seen: math.MinInt64 / 2}
	l.m[key] = e
	return e
}

// size returns how many tokens beyond n to lease under lim.
func (l *leaseTable) extra(lim floodgate.Limit, n int) int {
	x := lim.Rate * float64(l.d) / 1e9
	if x > float64(lim.Burst-n) {
		return lim.Burst - n
	}
	return int(x)
}

// takeLeased decides a take of 1 ≤ n ≤ burst with leases on.
func (s *Store) takeLeased(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	l := s.leases
	now := s.local()
	l.mu.Lock()
	e := l.entryLocked(key, now)
	if e.lim == lim && now < e.expires && e.tokens >= n {
		e.tokens -= n
		e.seen = now
		res := floodgate.Result{Allowed: true, Limit: lim, Remaining: e.tokens + e.remaining, Source: floodgate.SourceLease}
		l.mu.Unlock()
		s.decided(floodgate.SourceLease)
		return res, nil
	}
	hot := now-e.seen <= l.d
	e.seen = now
	l.mu.Unlock()

	o := op{key: s.Key(key), lim: lim, n: n, mode: modeTake}
	if x := l.extra(lim, n); hot && x > 0 {
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
		e := l.entryLocked(key, now)
		e.lim, e.tokens, e.expires, e.remaining = lim, x, now+l.d, res.Remaining-x
		l.mu.Unlock()
	} else if s.cache != nil && !r.allowed {
		s.cache.insert(key, lim, r.tokens*unit, now, res.RetryAfter)
	}
	return res, nil
}
