package middleware

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate/tenant"
)

// digestCache remembers the SHA-256 digests of API keys that belonged to a
// tenant when first seen, so that a known key costs a map lookup instead of
// a SHA-256 on every call. It holds digests, not tenants: each call still
// looks the digest up in the table in force, so a reload that revokes a key
// takes effect at once. Unknown and malformed keys are never cached, so
// a caller rotating made-up keys cannot fill it; it is bounded anyway, and a
// full shard starts over.
type digestCache struct {
	seed   maphash.Seed
	shards [digestShards]digestShard
}

const (
	digestShards   = 16
	digestShardCap = 256
)

// A digestShard is copied on write: lookups are one atomic load and one map
// access, with no lock to contend for. Writes are rare (a known key seen for
// the first time) and copy at most digestShardCap entries.
type digestShard struct {
	m  atomic.Pointer[map[string][32]byte]
	mu sync.Mutex // serializes writers
	_  [48]byte   // keep shards on separate cache lines
}

func newDigestCache() *digestCache {
	c := &digestCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		m := map[string][32]byte{}
		c.shards[i].m.Store(&m)
	}
	return c
}

func (c *digestCache) shard(key string) *digestShard {
	return &c.shards[maphash.String(c.seed, key)&(digestShards-1)]
}

// lookup resolves key from the cache alone: a key not cached is anonymous.
func (c *digestCache) lookup(t *tenant.Table, key string) (*tenant.Tenant, bool) {
	d, ok := (*c.shard(key).m.Load())[key]
	if !ok {
		return t.Anonymous(), false
	}
	return t.TenantByDigest(d)
}

// resolve resolves key through the cache, hashing it on a miss.
func (c *digestCache) resolve(t *tenant.Table, key string) (*tenant.Tenant, bool) {
	s := c.shard(key)
	if d, ok := (*s.m.Load())[key]; ok {
		return t.TenantByDigest(d)
	}
	ten, found := t.TenantByKey(key)
	if !found {
		return ten, false
	}
	d := tenant.Digest(key)
	s.mu.Lock()
	old := *s.m.Load()
	var m map[string][32]byte
	if len(old) >= digestShardCap {
		m = make(map[string][32]byte, 1) // full: start over
	} else {
		m = make(map[string][32]byte, len(old)+1)
		for k, v := range old {
			m[k] = v
		}
	}
	// A copy, so the cache does not pin the request's header buffers.
	m[strings.Clone(key)] = d
	s.m.Store(&m)
	s.mu.Unlock()
	return ten, true
}

// penalties remembers, per bucket subject, until when the interceptor told
// the caller to wait: the tap handle's notion of a caller "over its share".
// It is a fixed table of one atomic word per slot (24 bits of the subject's
// hash, 40 bits of milliseconds since the Limiter's epoch), so noting and
// checking cost one hash and one atomic operation and memory never grows.
// Two subjects that share a slot overwrite each other; a tag mismatch
// reads as no penalty. The tap handle therefore errs towards admitting,
// and the interceptor behind it still decides exactly.
type penalties struct {
	seed  maphash.Seed
	slots [penaltySlots]atomic.Uint64
}

const (
	penaltySlots = 4096
	penaltyBits  = 40
	penaltyMask  = 1<<penaltyBits - 1
)

func newPenalties() *penalties { return &penalties{seed: maphash.MakeSeed()} }

func (p *penalties) note(subject string, until time.Duration) {
	if until < 0 {
		return
	}
	h := maphash.String(p.seed, subject)
	ms := uint64((until + time.Millisecond - 1) / time.Millisecond)
	if ms > penaltyMask {
		ms = penaltyMask
	}
	p.slots[h&(penaltySlots-1)].Store(h>>penaltyBits<<penaltyBits | ms)
}

// left returns how long the subject's penalty still runs at now, ≤ 0 when
// it has none.
func (p *penalties) left(subject string, now time.Duration) time.Duration {
	h := maphash.String(p.seed, subject)
	v := p.slots[h&(penaltySlots-1)].Load()
	if v == 0 || v>>penaltyBits != h>>penaltyBits {
		return 0
	}
	return time.Duration(v&penaltyMask)*time.Millisecond - now
}
