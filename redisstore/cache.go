package redisstore

import (
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

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
// The entries live in an LRU that only Redis's denials refresh. Lookups use
// Peek, which shares the LRU's read lock: under load most decisions are
// cached denials, and with an exclusive lock they queued behind whichever
// of them the scheduler had just descheduled. An entry past its retry time
// is ignored and left for eviction, which is always safe: the cache only
// denies. (golang-lru's expirable LRU does not fit: it has one TTL for all
// entries, reads the wall clock rather than the store's, and starts a
// goroutine that never ends.)
type denyCache struct {
	*lru.Cache[string, denyEntry]
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

// newDenyCache returns a cache of size ≥ 1 entries.
func newDenyCache(size int) *denyCache {
	c, _ := lru.New[string, denyEntry](size) // fails only for size ≤ 0
	return &denyCache{c}
}

func (c *denyCache) lookup(key string, lim floodgate.Limit, n int, now int64) (floodgate.Result, bool) {
	e, ok := c.Peek(key)
	if !ok || e.lim != lim || now >= e.until {
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
		RetryAfter: waitFor(lim, need-tokens),
		ResetAfter: waitFor(lim, burst-tokens),
		Source:     floodgate.SourceCache,
	}
	if tokens > 0 {
		res.Remaining = int(tokens / 1e9)
	} else if tokens < 0 { // the bucket owes: rounded up
		res.Owed = int((-tokens + 1e9 - 1) / 1e9)
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
	c.Add(key, denyEntry{lim: lim, tokens: tokens, sent: sent, until: sent + int64(retry)})
}
