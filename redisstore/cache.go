package redisstore

import (
	"sync"
	"time"

	"github.com/floodgate-go/floodgate"
)

// denyCache remembers buckets that Redis found short, so that requests on
// them are denied in process until the bucket could hold them again.
//
// An entry holds the bucket's tokens as Redis counted them and the local
// time the request was sent, which is no later than Redis's count. Tokens
// only grow by refill (or by a Refund, a Reset or a raised limit, which the
// entry does not see), so tokens + rate×(now − sent) bounds the bucket from
// above: a request that does not fit under the bound would be denied by
// Redis too. A request that fits goes to Redis.
//
// Lookups share a read lock: under load most decisions are cached denials,
// and with an exclusive lock they queued behind whichever of them the
// scheduler had just descheduled.
type denyCache struct {
	mu   sync.RWMutex
	size int
	m    map[string]denyEntry
}

type denyEntry struct {
	lim    floodgate.Limit
	tokens int64 // 1e-9 token units, as counted by Redis
	sent   int64 // local ns
	until  int64 // local ns: the denied request's retry-after
}

// maxDeny bounds how long a denial that can never turn into an admission
// under its limit (rate 0) stays cached; maxCached bounds every entry.
const (
	maxDeny   = time.Second
	maxCached = time.Hour
)

func newDenyCache(size int) *denyCache {
	return &denyCache{size: size, m: make(map[string]denyEntry, size)}
}

func (c *denyCache) lookup(key string, lim floodgate.Limit, n int, now int64) (floodgate.Result, bool) {
	c.mu.RLock()
	e, ok := c.m[key]
	c.mu.RUnlock()
	if !ok {
		return floodgate.Result{}, false
	}
	if e.lim != lim || now >= e.until {
		c.mu.Lock()
		if cur, ok := c.m[key]; ok && cur == e {
			delete(c.m, key)
		}
		c.mu.Unlock()
		return floodgate.Result{}, false
	}
	burst := int64(lim.Burst) * 1e9
	tokens := e.tokens
	if now > e.sent && lim.Rate > 0 {
		add := float64(now-e.sent) * lim.Rate
		if add >= float64(burst-tokens) {
			tokens = burst
		} else {
			tokens += int64(add)
		}
	}
	need := int64(n) * 1e9
	if tokens >= need {
		return floodgate.Result{}, false
	}
	res := floodgate.Result{
		Limit:      lim,
		Remaining:  int(tokens / 1e9),
		RetryAfter: waitFor(lim, need-tokens),
		ResetAfter: waitFor(lim, burst-tokens),
		Source:     floodgate.SourceCache,
	}
	return res, true
}

// insert records a denial of a request sent at sent, after which Redis
// counted tokens (in 1e-9 units) and asked to retry after retry.
func (c *denyCache) insert(key string, lim floodgate.Limit, tokens int64, sent int64, retry time.Duration) {
	switch {
	case retry == floodgate.Never:
		retry = maxDeny
	case retry > maxCached:
		retry = maxCached
	}
	e := denyEntry{lim: lim, tokens: tokens, sent: sent, until: sent + int64(retry)}
	c.mu.Lock()
	if _, ok := c.m[key]; !ok && len(c.m) >= c.size {
		c.evictLocked(sent)
	}
	c.m[key] = e
	c.mu.Unlock()
}

// evictLocked drops an expired entry if one of the first few it sees is,
// else an arbitrary one.
func (c *denyCache) evictLocked(now int64) {
	evictSampled(c.m, func(e denyEntry) bool { return now >= e.until })
}

// evictSampled deletes one entry of m: the first of up to eight that stale
// reports, else the first seen. Map iteration starts at a random place, so
// this is a random sample at constant cost, not a scan.
func evictSampled[E any](m map[string]E, stale func(E) bool) {
	i := 0
	var victim string
	for k, e := range m {
		if stale(e) {
			victim = k
			break
		}
		if i == 0 {
			victim = k
		}
		if i++; i == 8 {
			break
		}
	}
	delete(m, victim)
}

func (c *denyCache) remove(key string) {
	c.mu.Lock()
	delete(c.m, key)
	c.mu.Unlock()
}
