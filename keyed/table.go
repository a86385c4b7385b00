package keyed

import (
	"runtime"
	"sync/atomic"
	"time"
)

// table is a shard's compact storage: an open-addressing hash table with
// linear probing and the bucket state inline in each 32-byte slot, so a take
// on an existing key touches one cache line of the table. Recency is kept
// CLOCK-style: a hit sets a reference bit, and the eviction scan clears it
// once before it may evict that slot (a second chance).
//
// The table stores 62 bits of each key's hash, never the key.
//
// # Locking
//
// A take on a key the table holds writes nothing shared but the key's own
// slot: it probes with atomic loads, locks the slot by setting the lock bit
// of its meta word with a compare-and-swap, updates the state and stores the
// meta back unlocked. Two cores taking from different keys then share no
// written cache line, which a shard mutex taken by every take would make
// them do.
//
// Everything that changes which slot holds which key (insert, grow, removal
// with its backward shift, eviction) runs under the shard mutex, and locks
// every occupied slot it reads the state of or moves. The lock-free probe
// relies on three rules:
//
//  1. A key is in at most one unlocked slot. A move publishes the entry at
//     its new place while the old one is still locked, and the old slot is
//     then overwritten, still locked, with another entry or emptied. A probe
//     that locks a slot holding its hash therefore holds the key's only live
//     state.
//  2. A probe that does not find its key proves nothing, since entries may
//     have moved behind it: every caller then takes the shard mutex and
//     probes again, and under the mutex a miss is final.
//  3. Grow replaces the slice of slots whole and leaves every slot of the
//     old one locked for good with hash 0, so a probe that still holds the
//     old slice misses and retries under the mutex.
//
// The lock bit is a spin lock held for a few dozen instructions; a holder
// never waits for anything while it holds one, except the mutex holder,
// which waits only for slots whose holders wait for nothing.
type table struct {
	// Read by every take; replaced, under the shard mutex, only by grow.
	// Its length is a power of two.
	slots atomic.Pointer[[]slot]
	_     [56]byte // keeps the shard mutex and the fields below apart

	// Guarded by the shard mutex.
	n    int    // occupied slots
	hand uint64 // CLOCK hand: the next slot the eviction scan looks at
}

type slot struct {
	meta atomic.Uint64 // lock bit, reference bit, 62 bits of hash; 0 = empty
	st   state         // guarded by the lock bit
}

const (
	lockBit  = 1 << 63
	refBit   = 1 << 62
	hashMask = refBit - 1

	minSlots = 16
	// scanSlots bounds one eviction scan: at a load of at most one half it
	// looks at about 32 buckets in 2 KiB of contiguous memory.
	scanSlots = 64
)

func (t *table) init() {
	s := make([]slot, minSlots)
	t.slots.Store(&s)
}

// load returns the current slots and the mask that reduces a hash to an
// index into them.
func (t *table) load() ([]slot, uint64) {
	s := *t.slots.Load()
	return s, uint64(len(s) - 1)
}

// acquire returns the slot holding k, locked, and its meta as it was before
// the lock (to store back when unlocking), or nil. Without the shard mutex a
// nil result means only "not found here": see rule 2 above.
func (t *table) acquire(k uint64) (*slot, uint64) {
	slots, mask := t.load()
	for i, probes := k&mask, mask; ; {
		s := &slots[i]
		m := s.meta.Load()
		if m&hashMask == k {
			if m&lockBit == 0 && s.meta.CompareAndSwap(m, m|lockBit) {
				return s, m
			}
			// Held by another caller, or being moved: look again, and
			// follow the entry if it has gone.
			s.wait(m)
			continue
		}
		if m&hashMask == 0 || probes == 0 {
			return nil, 0
		}
		i, probes = (i+1)&mask, probes-1
	}
}

// wait waits while s's meta is still m. A holder keeps a slot for a few
// dozen instructions, so wait spins first; but the holder's thread may have
// been descheduled (a busy machine, a CPU quota), and then spinning would
// only burn the CPU it needs: after a while wait yields, then sleeps, as
// sync.Mutex parks.
//
// A caller whose compare-and-swap failed passes the meta it expected: if
// that was unlocked, the slot changed under it and it must look again at
// once. (Waiting for a change there waits for ever when the holder stores
// back exactly that meta, as a peek does.)
func (s *slot) wait(m uint64) {
	if m&lockBit == 0 {
		return
	}
	for spins := 1; s.meta.Load() == m; spins++ {
		switch {
		case spins < 100:
		case spins < 120:
			runtime.Gosched()
		default:
			time.Sleep(time.Microsecond)
		}
	}
}

// lock waits for s to be unlocked, locks it, and returns its meta as it was
// before the lock. Only the shard mutex's holder calls it: s's hash cannot
// change meanwhile.
func (s *slot) lock() uint64 {
	for {
		m := s.meta.Load()
		if m&lockBit == 0 && s.meta.CompareAndSwap(m, m|lockBit) {
			return m
		}
		s.wait(m)
	}
}

// insert adds k, which must be absent, with st and returns its slot, locked;
// unlock it with k|refBit. The table grows to keep its load at most one
// half, which keeps probe sequences short. The shard mutex must be held.
func (t *table) insert(k uint64, st state) *slot {
	if 2*(t.n+1) > len(*t.slots.Load()) {
		t.grow()
	}
	t.n++
	slots, mask := t.load()
	for i := k & mask; ; i = (i + 1) & mask {
		// An empty slot is written by the shard mutex's holder only: no
		// probe can lock it, since no key hashes to 0.
		if s := &slots[i]; s.meta.Load() == 0 {
			s.st = st
			s.meta.Store(k | refBit | lockBit)
			return s
		}
	}
}

// grow doubles the slots. Each old slot is locked for good with hash 0
// before it is copied (rule 3), so no take can change a state after it was
// copied.
func (t *table) grow() {
	old, _ := t.load()
	fresh := make([]slot, 2*len(old))
	mask := uint64(len(fresh) - 1)
	for i := range old {
		m := old[i].lock()
		old[i].meta.Store(lockBit)
		if m == 0 {
			continue
		}
		// fresh is not yet visible to any take: the Store below publishes it.
		for j := m & hashMask & mask; ; j = (j + 1) & mask {
			if fresh[j].meta.Load() == 0 {
				fresh[j].st = old[i].st
				fresh[j].meta.Store(m)
				break
			}
		}
	}
	t.slots.Store(&fresh)
	t.hand = 0
}

// remove deletes k and reports whether the table held it. The shard mutex
// must be held.
func (t *table) remove(k uint64) bool {
	slots, mask := t.load()
	for i := k & mask; ; i = (i + 1) & mask {
		m := slots[i].meta.Load()
		if m&hashMask == k {
			slots[i].lock()
			t.removeAt(i)
			return true
		}
		if m == 0 { // the load is at most one half: there is a hole
			return false
		}
	}
}

// removeAt empties slot i, which the caller holds locked under the shard
// mutex, with backward-shift deletion: later members of the probe run move
// back so that lookups never stop early at a hole, and no tombstones
// accumulate. Each moved entry is published at its new place before its old
// slot is unlocked with other contents (rule 1).
func (t *table) removeAt(hole uint64) {
	t.n--
	slots, mask := t.load()
	for j := (hole + 1) & mask; ; j = (j + 1) & mask {
		m := slots[j].meta.Load()
		if m == 0 {
			break
		}
		// The entry at j may fill the hole unless its home lies cyclically
		// after the hole, where a probe for it would no longer pass j.
		if home := m & hashMask & mask; (j-home)&mask >= (j-hole)&mask {
			m = slots[j].lock()
			slots[hole].st = slots[j].st
			slots[hole].meta.Store(m)
			hole = j
		}
	}
	slots[hole].meta.Store(0)
}

// evict removes one bucket to make room and reports it. It prefers, in
// order: a full bucket not used since the hand last passed it; a full bucket
// used since; and, only when notFull is allowed, the not-yet-full bucket
// closest to full, preferring unused ones, among those that owed nothing
// when last counted. Evicting a full bucket changes no decision: a new
// bucket starts full too. Evicting one in debt would forgive the debt, so
// no pressure policy does. The shard mutex must be held.
//
// The scan locks each slot to read its state and keeps the best candidate
// locked until it is evicted or replaced, so no take can drain a bucket
// between the check that it is full and its eviction.
func (t *table) evict(now int64, notFull bool) (Eviction, bool) {
	slots, mask := t.load()
	const none = ^uint64(0)
	var (
		best     = none
		bestMeta uint64 // to unlock it with, reference bit cleared
		bestFull bool
		bestIdle bool
		i        = t.hand & mask
	)
	for range min(scanSlots, len(slots)) {
		s := &slots[i]
		if s.meta.Load() == 0 {
			i = (i + 1) & mask
			continue
		}
		m := s.lock()
		idle := m&refBit == 0
		m &^= refBit // the second chance is spent
		full := s.st.full(now)
		// A bucket that was below zero when last counted may still be:
		// only one that has refilled may go then.
		fit := full || notFull && s.st.tokens >= 0
		switch {
		case full && idle:
			if best != none {
				slots[best].meta.Store(bestMeta)
			}
			t.hand = i + 1
			t.removeAt(i)
			return Eviction{Hash: m & hashMask, Full: true}, true
		case best == none && fit,
			best != none && !bestFull && fit && (full || idle && !bestIdle ||
				idle == bestIdle && s.st.fullAt < slots[best].st.fullAt):
			if best != none {
				slots[best].meta.Store(bestMeta)
			}
			best, bestMeta, bestFull, bestIdle = i, m, full, idle
		default:
			s.meta.Store(m)
		}
		i = (i + 1) & mask
	}
	t.hand = i
	if best == none {
		return Eviction{}, false
	}
	t.removeAt(best)
	return Eviction{Hash: bestMeta & hashMask, Full: bestFull}, true
}
