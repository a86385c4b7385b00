package middleware

import (
	"encoding/binary"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
// keyShardCap entries. In front of the shards, a direct-mapped table of
// the keys last found, indexed by a few of their bytes, spares a hit the
// hashing of the whole key; a known key that shares its slot with another
// falls through to its shard.
type keyCache struct {
	recent atomic.Pointer[recentKeys]
	shards [keyShards]keyShard
}

// recentKeys is the recent table of one tenant table, replaced with the
// table so that it never pins an old one.
type recentKeys struct {
	table *tenant.Table
	slots [recentSlots]atomic.Pointer[keyEntry]
}

// keyEntry is one known key of one table, shared by its shard's maps (from
// copy to copy) and the recent table.
type keyEntry struct {
	table *tenant.Table
	key   string
	ten   *tenant.Tenant
}

const (
	recentBits  = 10
	recentSlots = 1 << recentBits
)

// recentSlot picks a slot from the key's length and its last eight bytes
// (fewer for a short key): API keys end in random characters.
func (r *recentKeys) slot(key string) *atomic.Pointer[keyEntry] {
	h := uint64(len(key))
	if n := len(key); n >= 8 {
		h ^= binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(key[n-8:]), 8))
	} else {
		for i := 0; i < n; i++ {
			h = h<<8 ^ uint64(key[i])
		}
	}
	return &r.slots[(h*0x9e3779b97f4a7c15)>>(64-recentBits)]
}

// remember puts e in the recent table of e's table, replacing the table
// of an older one.
func (c *keyCache) remember(e *keyEntry) {
	r := c.recent.Load()
	if r == nil || r.table != e.table {
		next := &recentKeys{table: e.table}
		if !c.recent.CompareAndSwap(r, next) {
			return // another call replaced it first; e will come again
		}
		r = next
	}
	r.slot(e.key).Store(e)
}

type keyShard struct {
	cur atomic.Pointer[keyMap]
	mu  sync.Mutex // serializes writers
	_   [48]byte   // keep shards on separate cache lines
}

type keyMap struct {
	table *tenant.Table
	m     map[string]*keyEntry
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
	if r := c.recent.Load(); r != nil && r.table == t {
		if e := r.slot(key).Load(); e != nil && e.key == key {
			return e.ten, true
		}
	}
	km := c.shard(key).cur.Load()
	if km == nil || km.table != t {
		return nil, false
	}
	e, ok := km.m[key]
	if !ok {
		return nil, false
	}
	c.remember(e)
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
	if !found {
		return ten, false
	}
	s := c.shard(key)
	s.mu.Lock()
	old := s.cur.Load()
	next := &keyMap{table: t}
	if old == nil || old.table != t || len(old.m) >= keyShardCap {
		next.m = make(map[string]*keyEntry, 1)
	} else {
		next.m = make(map[string]*keyEntry, len(old.m)+1)
		for k, v := range old.m {
			next.m[k] = v
		}
	}
	// A copy, so the cache does not pin the request's header buffers.
	e := &keyEntry{table: t, key: strings.Clone(key), ten: ten}
	next.m[e.key] = e
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
