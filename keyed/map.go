package keyed

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
)

var _ floodgate.Store = (*Map)(nil)

// A Map holds one token bucket per key, in memory, for at most a fixed
// number of keys. It is safe for concurrent use; the zero Map is not usable:
// build one with [New].
//
// Keys are hashed with a per-Map random seed (hash/maphash) and stored by
// hash alone, so the Map holds no key bytes. Two keys share a bucket only if
// 62 bits of their hashes agree: for n keys the chance that any two collide
// is below n²/2⁶³, about 1 in 9 million at a million keys.
type Map struct {
	seed     maphash.Seed
	shift    uint // 64 - log2(shards): the hash's top bits pick the shard
	shards   []shard
	capacity int64
	count    atomic.Int64 // keys tracked, across shards
	base     time.Time
	clock    Clock
	onEvict  func(Eviction)
	evictNF  bool
}

// shard is one independently locked part of a Map, 128 bytes: the table
// header is inline, so a take reaches the slots without another pointer
// hop, and two cores working on neighbouring shards do not share a cache
// line.
type shard struct {
	mu       sync.Mutex
	tab      table
	overflow state // shared by new keys that found no room (Protect)
	ovInit   bool
	stats    shardStats
}

// shardStats are a shard's counters, guarded by its lock.
type shardStats struct {
	Allowed, Rejected, Evictions, EvictedNotFull, Overflowed uint64
}

// Stats counts a Map's decisions and evictions since it was built.
type Stats struct {
	Takes    uint64 // takes with n ≥ 1, allowed or not
	Allowed  uint64
	Rejected uint64
	// Evictions counts buckets dropped to make room for new keys.
	Evictions uint64
	// EvictedNotFull counts evictions of buckets that had not refilled:
	// each handed a client a fresh burst. Only the [Evict] policy does it.
	EvictedNotFull uint64
	// Overflowed counts takes by new keys that found no room and were
	// decided by their shard's shared overflow bucket ([Protect] policy).
	// A steady rise means the capacity is too small for the active keys.
	Overflowed uint64
}

// New returns an empty Map configured by opts.
func New(opts ...Option) (*Map, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	m := &Map{
		seed:     maphash.MakeSeed(),
		shift:    uint(64 - bits.TrailingZeros(uint(o.shards))),
		shards:   make([]shard, o.shards),
		capacity: int64(o.capacity),
		base:     time.Now(),
		clock:    o.clock,
		onEvict:  o.onEvict,
		evictNF:  o.pressure == Evict,
	}
	for i := range m.shards {
		m.shards[i].tab.init()
	}
	return m, nil
}

// Hash returns the 62-bit hash that the Map stores for key, as reported in
// an [Eviction].
func (m *Map) Hash(key string) uint64 { return maphash.String(m.seed, key) & hashMask }

func (m *Map) shardOf(h uint64) *shard {
	if m.shift == 64 {
		return &m.shards[0]
	}
	return &m.shards[h>>m.shift]
}

// now reads the Map's clock as nanoseconds since the Map was built.
// time.Since on a monotonic base costs about half of time.Now.
func (m *Map) now() int64 {
	if m.clock != nil {
		return m.at(m.clock.Now())
	}
	return int64(time.Since(m.base))
}

func (m *Map) at(t time.Time) int64 { return int64(t.Sub(m.base)) }

// TakeN takes n tokens from key's bucket under lim, reading the clock once.
// See [Map.TakeAt] for the semantics. The context is not used: a memory
// take never blocks on I/O. The error is non-nil only for an invalid limit
// or a negative n.
func (m *Map) TakeN(_ context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	if err := check(lim, n); err != nil {
		return floodgate.Result{}, err
	}
	var res floodgate.Result
	m.take(&res, key, lim, n, m.now())
	return res, nil
}

// TakeAt takes n tokens from key's bucket under lim at time now, for tests
// and for callers that already read the clock. A now earlier than the
// bucket's last take counts as that time: bucket time never moves backwards.
//
//   - A key seen for the first time gets a full bucket.
//   - n ≤ 0 takes nothing and reports the bucket (allowed, creating nothing).
//   - n > lim.Burst is rejected with RetryAfter [floodgate.Never] and
//     changes nothing.
//   - [floodgate.Inf] allows everything and keeps no state.
//   - The empty key is a key like any other.
//
// TakeAt does not validate lim; TakeN does.
func (m *Map) TakeAt(key string, lim floodgate.Limit, n int, now time.Time) floodgate.Result {
	var res floodgate.Result
	m.take(&res, key, lim, n, m.at(now))
	return res
}

func check(lim floodgate.Limit, n int) error {
	if n < 0 {
		return ErrNegativeN
	}
	if lim.Rate >= 0 && lim.Burst >= 0 && lim.Burst <= floodgate.MaxBurst {
		return nil // the common case, without a call
	}
	return lim.Validate()
}

// take decides into res, which must be zero.
func (m *Map) take(res *floodgate.Result, key string, lim floodgate.Limit, n int, now int64) {
	if lim.Rate > math.MaxFloat64 { // Inf
		*res = floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst}
		return
	}
	h := maphash.String(m.seed, key)
	s := m.shardOf(h)
	if n <= 0 {
		s.mu.Lock()
		if st := s.tab.find(h, false); st != nil {
			*res = st.peek(lim, now)
		} else {
			*res = floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst}
		}
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	st := s.tab.find(h, true)
	var ev Eviction
	evicted := false
	if st == nil {
		if n > lim.Burst { // can never succeed: track nothing
			s.stats.Rejected++
			s.mu.Unlock()
			*res = floodgate.Result{Limit: lim, Remaining: lim.Burst, RetryAfter: floodgate.Never}
			return
		}
		st, evicted, ev = m.insert(s, h, lim, now)
	}
	st.take(res, lim, n, now)
	if res.Allowed {
		s.stats.Allowed++
	} else {
		s.stats.Rejected++
	}
	s.mu.Unlock()
	if evicted && m.onEvict != nil {
		m.onEvict(ev)
	}
}

// insert makes room for h in s, whose lock is held, and returns its new
// state, or the shard's overflow bucket when there is no room.
func (m *Map) insert(s *shard, h uint64, lim floodgate.Limit, now int64) (st *state, evicted bool, ev Eviction) {
	if m.count.Add(1) > m.capacity {
		evicted, ev.Hash, ev.Full = s.tab.evict(now, m.evictNF)
		m.count.Add(-1)
		if !evicted {
			s.stats.Overflowed++
			if !s.ovInit {
				s.overflow, s.ovInit = fullState(lim, now), true
			}
			return &s.overflow, false, ev
		}
		s.stats.Evictions++
		if !ev.Full {
			s.stats.EvictedNotFull++
		}
	}
	return s.tab.insert(h, fullState(lim, now)), evicted, ev
}

// Peek reports key's bucket under lim now without taking anything or
// creating a bucket: Remaining is the whole tokens available, ResetAfter
// the time until full. A key the Map does not track reports a full bucket.
func (m *Map) Peek(key string, lim floodgate.Limit) floodgate.Result {
	var res floodgate.Result
	m.take(&res, key, lim, 0, m.now())
	return res
}

// Tokens returns the tokens in key's bucket under lim now, with their
// fraction: a full bucket for a key the Map does not track, +Inf for
// [floodgate.Inf], and a negative number while WaitN reservations are owed.
func (m *Map) Tokens(key string, lim floodgate.Limit) float64 {
	return m.tokens(key, lim, m.now())
}

// TokensAt is [Map.Tokens] at time now.
func (m *Map) TokensAt(key string, lim floodgate.Limit, now time.Time) float64 {
	return m.tokens(key, lim, m.at(now))
}

func (m *Map) tokens(key string, lim floodgate.Limit, now int64) float64 {
	if lim.IsInf() {
		return lim.Rate
	}
	h := maphash.String(m.seed, key)
	s := m.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.tab.find(h, false)
	if st == nil {
		return float64(lim.Burst)
	}
	tokens, _ := st.refill(lim, now)
	return float64(tokens) / unit
}

// Reset forgets key's bucket, so its next take starts full, and reports
// whether the Map tracked it.
func (m *Map) Reset(key string) bool {
	h := maphash.String(m.seed, key)
	s := m.shardOf(h)
	s.mu.Lock()
	ok := s.tab.remove(h)
	s.mu.Unlock()
	if ok {
		m.count.Add(-1)
	}
	return ok
}

// Len returns the number of keys tracked, at most the capacity.
func (m *Map) Len() int { return int(m.count.Load()) }

// Stats returns the counters summed over shards. Each shard is read under
// its lock, so the sums are consistent per shard, not across shards.
func (m *Map) Stats() Stats {
	var t Stats
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		st := s.stats
		s.mu.Unlock()
		t.Allowed += st.Allowed
		t.Rejected += st.Rejected
		t.Evictions += st.Evictions
		t.EvictedNotFull += st.EvictedNotFull
		t.Overflowed += st.Overflowed
	}
	t.Takes = t.Allowed + t.Rejected
	return t
}
