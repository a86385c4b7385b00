package middleware

import (
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/floodgate-go/floodgate/tenant"
)

// newLRU returns a golang-lru cache, safe for concurrent use, of size
// entries. The request path reads it with Peek, under the cache's read
// lock, which does not move an entry to the front: so that two cores do not
// queue on its mutex, a full cache drops the entry added longest ago, not
// the one used longest ago. An entry dropped while in use is rebuilt on its
// next call, at the price of a few allocations.
func newLRU[K comparable, V any](size int) *lru.Cache[K, V] {
	c, err := lru.New[K, V](size)
	if err != nil {
		panic(err) // only for a size ≤ 0
	}
	return c
}

// keyCache remembers which tenant each API key seen on the request path
// belongs to, so that a known key costs one lookup instead of a SHA-256
// and a digest lookup on every call. An entry holds the table it was
// resolved in and is a miss under any other: after a reload a revoked key
// stops resolving at once, and the old table's entries age out. Unknown
// and malformed keys are never cached, so a caller rotating made-up keys
// cannot push the known ones out.
type keyCache struct {
	lru *lru.Cache[string, keyEntry]
}

type keyEntry struct {
	table *tenant.Table
	ten   *tenant.Tenant
}

// keyCacheSize bounds the keys remembered; beyond it the key cached
// longest ago is hashed again on its next call.
const keyCacheSize = 4096

func newKeyCache() *keyCache { return &keyCache{newLRU[string, keyEntry](keyCacheSize)} }

func (c *keyCache) get(t *tenant.Table, key string) (*tenant.Tenant, bool) {
	e, ok := c.lru.Peek(key)
	if !ok || e.table != t {
		return nil, false
	}
	return e.ten, true
}

// lookup resolves key from the cache alone: a key not cached is anonymous.
func (c *keyCache) lookup(t *tenant.Table, key string) (*tenant.Tenant, bool) {
	if ten, ok := c.get(t, key); ok {
		return ten, true
	}
	return t.Anonymous(), false
}

// resolve resolves key through the cache, hashing it on a miss.
func (c *keyCache) resolve(t *tenant.Table, key string) (*tenant.Tenant, bool) {
	if ten, ok := c.get(t, key); ok {
		return ten, true
	}
	ten, found := t.TenantByKey(key)
	if found {
		// A copy, so the cache does not pin the request's header buffers.
		c.lru.Add(strings.Clone(key), keyEntry{table: t, ten: ten})
	}
	return ten, found
}

// penalties remembers, per bucket subject, until when (on the Limiter's
// clock) the interceptor last told the caller to wait under the gate: the
// tap handle's notion of a caller "over its share". Past penaltiesSize
// subjects the least recently penalized are forgotten, which errs towards
// admitting: the interceptor behind the tap still decides exactly.
type penalties struct {
	lru *lru.Cache[string, time.Time]
}

const penaltiesSize = 4096

func newPenalties() *penalties { return &penalties{newLRU[string, time.Time](penaltiesSize)} }

// note remembers that subject, a route's, must wait until until.
func (p *penalties) note(subject string, until time.Time) { p.lru.Add(subject, until) }

// left returns how long the subject's penalty still runs at now, ≤ 0 when
// it has none.
func (p *penalties) left(subject string, now time.Time) time.Duration {
	until, ok := p.lru.Peek(subject)
	if !ok {
		return 0
	}
	return until.Sub(now)
}
