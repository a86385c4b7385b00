package middleware

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate/tenant"
)

// keyCache remembers which tenant each API key seen on the request path
// belongs to in the table in force, so that a known key costs one map
// lookup instead of a SHA-256 and a digest lookup on every call. It belongs
// to one table: when the table in force changes (a reload), the cache starts
// over, so a revoked key stops resolving at once. Unknown and malformed
// keys are never cached, so a caller rotating made-up keys cannot fill it;
// it is bounded anyway, and a full cache starts over.
//
// The cache is split into shards, each copied on write: a lookup is one
// atomic load and one map access, with no lock to contend for. A write (a
// known key's first call after a reload) copies one shard, at most
// keyShardCap entries.
type keyCache struct {
	shards [keyShards]keyShard
}

type keyShard struct {
	cur atomic.Pointer[keyMap]
	mu  sync.Mutex // serializes writers
	_   [48]byte   // keep shards on separate cache lines
}

type keyMap struct {
	table *tenant.Table
	m     map[string]*tenant.Tenant
}

const (
	keyShards   = 32
	keyShardCap = 128
)

func newKeyCache() *keyCache { return &keyCache{} }

// shard picks a shard from the key's last byte and length: API keys end in
// random characters, and a real hash would cost more than the lookup.
func (c *keyCache) shard(key string) *keyShard {
	return &c.shards[(uint(key[len(key)-1])^uint(len(key)))%keyShards]
}

func (c *keyCache) get(t *tenant.Table, key string) (*tenant.Tenant, bool) {
	km := c.shard(key).cur.Load()
	if km == nil || km.table != t {
		return nil, false
	}
	ten, ok := km.m[key]
	return ten, ok
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
	if !found {
		return ten, false
	}
	s := c.shard(key)
	s.mu.Lock()
	old := s.cur.Load()
	next := &keyMap{table: t}
	if old == nil || old.table != t || len(old.m) >= keyShardCap {
		next.m = make(map[string]*tenant.Tenant, 1)
	} else {
		next.m = make(map[string]*tenant.Tenant, len(old.m)+1)
		for k, v := range old.m {
			next.m[k] = v
		}
	}
	// A copy, so the cache does not pin the request's header buffers.
	next.m[strings.Clone(key)] = ten
	s.cur.Store(next)
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
