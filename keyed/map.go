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

var (
	_ floodgate.Store    = (*Map)(nil)
	_ floodgate.Peeker   = (*Map)(nil)
	_ floodgate.Resetter = (*Map)(nil)
	_ floodgate.Reserver = (*Map)(nil)
)

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
	base     time.Time
	clock    floodgate.Clock
	onEvict  func(Eviction)
	evictNF  bool

	// Written by inserts and removals only, on a cache line of their own:
	// every take reads the fields above.
	_                                     [64]byte
	tracked                               atomic.Int64 // keys tracked, across shards
	evictions, evictedNotFull, overflowed atomic.Uint64
	_                                     [32]byte
}

// shard is one part of a Map, 128 bytes. The slots pointer that every take
// reads has a cache line of its own, apart from the mutex; a take on a
// tracked key does not take the mutex (see [table]).
type shard struct {
	tab      table      // first line: read by takes; then n and hand
	mu       sync.Mutex // guards structural changes of tab, and overflow
	overflow state      // shared by new keys that found no room (Protect)
	ovInit   bool
	_        [15]byte
}

// Stats counts what a Map did to stay within its capacity since it was
// built. It counts no decisions: every take returns its own, and the
// middleware counts them per method.
type Stats struct {
	// Evictions counts buckets dropped to make room for new keys.
	Evictions uint64
	// EvictedNotFull counts evictions of buckets that had not refilled:
	// each handed a client a fresh burst. Only the [Evict] policy does it.
	EvictedNotFull uint64
	// Overflowed counts takes by new keys that found no room and were
	// decided by their shard's shared overflow bucket (under [Protect], or
	// rarely under [Evict], when no shard scanned had a bucket to evict).
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

// hash returns key's shard, which the top bits of its hash pick, and the 62
// bits of the hash that the shard stores. An empty slot stores 0, so hash 0
// is stored as 1: that adds 2⁻¹²³ to the chance that two keys share a
// bucket, and the bound documented on [Map] still holds. (hash is small
// enough to be inlined, which saves a take a few nanoseconds.)
func (m *Map) hash(key string) (*shard, uint64) {
	h := maphash.String(m.seed, key)
	// A shift by 64 gives 0 in Go: one shard takes every key.
	return &m.shards[h>>m.shift], max(h&hashMask, 1)
}

// now reads the Map's clock as nanoseconds since the Map was built.
// time.Since on a monotonic base costs about half of time.Now.
func (m *Map) now() int64 {
	if m.clock != nil {
		return m.at(m.clock.Now())
	}
	return int64(time.Since(m.base))
}

// at converts t to the Map's clock, within ±2^62 ns (146 years) of its
// base, so that the difference of two times always fits an int64.
func (m *Map) at(t time.Time) int64 {
	const bound = 1 << 62
	return min(max(int64(t.Sub(m.base)), -bound), bound)
}

// TakeN takes n tokens from key's bucket under lim, reading the clock once.
// See [Map.TakeAt] for the semantics. The context is not used: a memory
// take never blocks on I/O.
func (m *Map) TakeN(_ context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	if err := check(lim, n); err != nil {
		return floodgate.Result{}, err
	}
	var res floodgate.Result
	err := m.take(&res, key, lim, n, m.now())
	return res, err
}

// TakeAt takes n tokens from key's bucket under lim at time now, for tests
// and for callers that already read the clock. A now earlier than the
// bucket's last take counts as that time: bucket time never moves backwards.
//
//   - A key seen for the first time gets a full bucket.
//   - n == 0 takes nothing and reports the bucket (allowed, creating
//     nothing).
//   - n > lim.Burst is refused with RetryAfter [floodgate.Never] and changes
//     nothing; under a positive burst the error is then
//     [floodgate.ErrExceedsBurst], as [floodgate.Store] requires, while the
//     zero Limit, which admits nothing by design, refuses without an error.
//   - [floodgate.Inf] allows everything and keeps no state.
//   - The empty key is a key like any other; keys may be of any length.
//
// Otherwise the error is non-nil only for an invalid limit or a negative n
// ([floodgate.ErrNegativeN]), and the Result is then zero.
func (m *Map) TakeAt(key string, lim floodgate.Limit, n int, now time.Time) (floodgate.Result, error) {
	if err := check(lim, n); err != nil {
		return floodgate.Result{}, err
	}
	var res floodgate.Result
	err := m.take(&res, key, lim, n, m.at(now))
	return res, err
}

func check(lim floodgate.Limit, n int) error {
	if n < 0 {
		return floodgate.ErrNegativeN
	}
	if lim.Rate >= 0 && lim.Burst > 0 && lim.Burst <= floodgate.MaxBurst && uint(lim.Debt+1) <= floodgate.MaxBurst+1 {
		return nil // the common case, without a call
	}
	return lim.Validate()
}

// take decides a take of n ≥ 0 tokens into res, which must be zero; n == 0
// is a peek. The result is written through a pointer because a Result is
// seven words: returning it by value through the call chain cost more than
// the decision.
func (m *Map) take(res *floodgate.Result, key string, lim floodgate.Limit, n int, now int64) error {
	if lim.Rate > math.MaxFloat64 { // Inf
		*res = floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst}
		return nil
	}
	s, k := m.hash(key)
	// A take that cannot succeed, or takes nothing, creates no bucket.
	b, ev, evicted := m.lock(s, k, n >= 1 && n <= lim.Burst, lim, now)
	st := b.st
	if st == nil { // untracked: decide on the full bucket it would get
		full := fullState(lim, now)
		st = &full
	}
	if n == 0 {
		*res = st.peek(lim, now)
	} else {
		st.take(res, lim, n, now)
		b.meta |= refBit
	}
	if b.st != nil {
		b.unlock()
	}
	if evicted && m.onEvict != nil {
		m.onEvict(ev)
	}
	if n > lim.Burst && lim.Burst > 0 {
		return floodgate.ErrExceedsBurst
	}
	return nil
}

// A held is a bucket locked by its caller: a slot's, under the slot's lock
// bit, or a shard's overflow bucket, under the shard mutex.
type held struct {
	st   *state // nil: no bucket, nothing locked
	sl   *slot  // nil for the overflow bucket
	s    *shard
	meta uint64 // sl's meta before the lock
}

// unlock unlocks b, storing back its slot's meta.
func (b held) unlock() {
	if b.sl != nil {
		b.sl.meta.Store(b.meta)
		return
	}
	b.s.mu.Unlock()
}

// lock returns k's bucket in s, locked. A key s does not track gets, when
// create is set, a new full bucket, or s's overflow bucket when there is no
// room, and otherwise no bucket. An eviction that made room is returned for
// the caller to report after unlocking.
func (m *Map) lock(s *shard, k uint64, create bool, lim floodgate.Limit, now int64) (b held, ev Eviction, evicted bool) {
	// The fast path: a tracked key, found and locked without the mutex.
	if sl, old := s.tab.acquire(k); sl != nil {
		return held{st: &sl.st, sl: sl, meta: old}, ev, false
	}
	// A new key, or one that moved during the probe.
	s.mu.Lock()
	sl, old := s.tab.acquire(k) // under the mutex, a miss is final
	if sl == nil && create {
		if sl, ev, evicted = m.insert(s, k, lim, now); sl == nil {
			return held{st: &s.overflow, s: s}, ev, false // the mutex stays locked
		}
		old = k | refBit
	}
	s.mu.Unlock()
	if sl == nil {
		return held{}, ev, false
	}
	return held{st: &sl.st, sl: sl, meta: old}, ev, evicted
}

// insert makes room for k in s, whose mutex is held, and returns its new
// slot, locked, holding a full bucket; or nil when there is no room, and
// the caller uses the shard's overflow bucket, which insert initializes.
func (m *Map) insert(s *shard, k uint64, lim floodgate.Limit, now int64) (*slot, Eviction, bool) {
	// Count the key in only while below capacity, so that Len never
	// exceeds it; at capacity an eviction makes room one for one.
	for n := m.tracked.Load(); n < m.capacity; n = m.tracked.Load() {
		if m.tracked.CompareAndSwap(n, n+1) {
			return s.tab.insert(k, fullState(lim, now)), Eviction{}, false
		}
	}
	ev, ok := s.tab.evict(now, m.evictNF)
	if !ok && s.tab.n*len(m.shards) < int(m.capacity) {
		// This shard holds less than its share of the capacity, so others
		// hold more: make room in one of them.
		ev, ok = m.evictElsewhere(s, k, now)
	}
	if !ok {
		m.overflowed.Add(1)
		if !s.ovInit {
			s.overflow, s.ovInit = fullState(lim, now), true
		}
		return nil, ev, false
	}
	m.evictions.Add(1)
	if !ev.Full {
		m.evictedNotFull.Add(1)
	}
	return s.tab.insert(k, fullState(lim, now)), ev, true
}

// evictElsewhere evicts from up to four shards other than s, whose mutex the
// caller holds: it only tries their mutexes, so two shards making room in
// each other cannot deadlock, and a busy shard is skipped.
func (m *Map) evictElsewhere(s *shard, k uint64, now int64) (Eviction, bool) {
	n := len(m.shards)
	start := int(k * 0x9e3779b97f4a7c15 >> 32)
	for i, tried := 0, 0; i < n && tried < 4; i++ {
		o := &m.shards[(start+i)%n]
		if o == s {
			continue
		}
		tried++
		if !o.mu.TryLock() {
			continue
		}
		ev, ok := o.tab.evict(now, m.evictNF)
		o.mu.Unlock()
		if ok {
			return ev, true
		}
	}
	return Eviction{}, false
}

// Peek reports key's bucket under lim now without taking anything or
// creating a bucket: Remaining is the whole tokens available, ResetAfter
// the time until full. A key the Map does not track reports a full bucket.
// It returns an error only for an invalid limit; ctx is unused, there for
// the signature every store shares ([floodgate.Peeker]).
func (m *Map) Peek(_ context.Context, key string, lim floodgate.Limit) (floodgate.Result, error) {
	if err := lim.Validate(); err != nil {
		return floodgate.Result{}, err
	}
	var res floodgate.Result
	m.take(&res, key, lim, 0, m.now())
	return res, nil
}

// Tokens returns the tokens in key's bucket under lim now, with their
// fraction: a full bucket for a key the Map does not track, +Inf for
// [floodgate.Inf], and a negative number while the bucket owes tokens (a
// settle charged it below zero, or WaitN reservations are owed).
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
	s, k := m.hash(key)
	b, _, _ := m.lock(s, k, false, lim, now)
	if b.st == nil {
		return float64(lim.Burst)
	}
	tokens, _ := b.st.refill(lim, now)
	b.unlock()
	return float64(tokens) / unit
}

// Reset forgets key's bucket, so its next take starts full: it forgives
// any debt, which nothing else does. It never fails; ctx and the error are
// there for the signature every store shares ([floodgate.Resetter]).
func (m *Map) Reset(_ context.Context, key string) error {
	s, k := m.hash(key)
	s.mu.Lock()
	ok := s.tab.remove(k)
	s.mu.Unlock()
	if ok {
		m.tracked.Add(-1)
	}
	return nil
}

// Len returns the number of keys tracked, at most the capacity.
func (m *Map) Len() int { return int(m.tracked.Load()) }

// Stats returns the counters.
func (m *Map) Stats() Stats {
	return Stats{
		Evictions:      m.evictions.Load(),
		EvictedNotFull: m.evictedNotFull.Load(),
		Overflowed:     m.overflowed.Load(),
	}
}
