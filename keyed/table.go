package keyed

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
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
// written cache line, which the shard mutex (written by every take) made
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
//     probes again, and under the mutex a miss is final. (This is the
//     seqlock's retry, without the counter: a lock-free probe only ever
//     reports hits.)
//  3. Slots only ever grow in number, and grow stores the new array before
//     its mask while probes load the mask before the array, so a probe never
//     indexes past the end of the array it holds. Grow leaves every slot of
//     the old array locked with hash 0, so a probe that still holds the old
//     array misses and retries under the mutex.
//
// The lock bit is a spin lock held for a few dozen instructions; a holder
// never waits for anything while it holds one, except the mutex holder,
// which waits only for slots whose holders wait for nothing.
type table struct {
	// Read by every take; written, under the shard lock, only on grow.
	mask  atomic.Uint64
	slots atomic.Pointer[slot] // the first of mask+1 slots
	_     [48]byte             // keeps the shard lock's cache line apart

	// Guarded by the shard lock.
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

// keyOf returns the 62 bits of h that a slot stores. An empty slot stores 0,
// so hash 0 is stored as 1: that adds 2⁻¹²³ to the chance that two keys
// share a bucket, and the bound documented on [Map] still holds.
func keyOf(h uint64) uint64 {
	k := h & hashMask
	if k == 0 {
		k = 1
	}
	return k
}

func (t *table) init() {
	s := make([]slot, minSlots)
	t.slots.Store(&s[0])
	t.mask.Store(minSlots - 1)
}

func at(base *slot, i uint64) *slot {
	return (*slot)(unsafe.Add(unsafe.Pointer(base), uintptr(i)*unsafe.Sizeof(slot{})))
}

// acquire returns the slot holding k, locked, and its meta as it was before
// the lock (to store back with release), or nil. Without the shard lock a
// nil result means only "not found here": see rule 2 above.
func (t *table) acquire(k uint64) (*slot, uint64) {
	mask := t.mask.Load() // before slots: rule 3
	base := t.slots.Load()
	i := k & mask
	for probes := mask; ; {
		s := at(base, i)
		m := s.meta.Load()
		if m&hashMask == k {
			if m&lockBit == 0 && s.meta.CompareAndSwap(m, m|lockBit) {
				return s, m
			}
			// Held by another take, or being moved: look again, and
			// follow the entry if it has gone.
			wait(s, m)
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
// once. (Waiting for a change there waited for ever when the holder stored
// back exactly that meta.)
func wait(s *slot, m uint64) {
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
// before the lock. Only the shard lock's holder calls it: s's hash cannot
// change meanwhile.
func (s *slot) lock() uint64 {
	for {
		m := s.meta.Load()
		if m&lockBit == 0 && s.meta.CompareAndSwap(m, m|lockBit) {
			return m
		}
		wait(s, m)
	}
}

// release unlocks s, which the caller locked, storing m. Only the take path
// uses it: elsewhere an atomic store costs nothing that matters.
func (s *slot) release(m uint64) {
	storeRelease((*uint64)(unsafe.Pointer(&s.meta)), m)
}

// indexOf returns the index of s, a slot of the current array.
func (t *table) indexOf(s *slot) uint64 {
	return uint64(uintptr(unsafe.Pointer(s))-uintptr(unsafe.Pointer(t.slots.Load()))) / uint64(unsafe.Sizeof(slot{}))
}

// insert adds k, which must be absent, with st and returns its slot, locked;
// release it with k|refBit. The table grows to keep its load at most one
// half, which keeps probe sequences short. The shard lock must be held.
func (t *table) insert(k uint64, st state) *slot {
	if 2*(t.n+1) > int(t.mask.Load()+1) {
		t.grow()
	}
	t.n++
	mask, base := t.mask.Load(), t.slots.Load()
	for i := k & mask; ; i = (i + 1) & mask {
		s := at(base, i)
		// An empty slot is written by the shard lock's holder only: no
		// take can lock it, since no key hashes to 0.
		if s.meta.Load() == 0 {
			s.st = st
			s.meta.Store(k | refBit | lockBit)
			return s
		}
	}
}

// grow doubles the slots. Each old slot is locked for good with hash 0 as it
// is copied (rule 3), so no take can change a state after it was copied.
func (t *table) grow() {
	oldMask, old := t.mask.Load(), t.slots.Load()
	fresh := make([]slot, 2*(oldMask+1))
	mask := uint64(len(fresh) - 1)
	for i := uint64(0); i <= oldMask; i++ {
		s := at(old, i)
		var m uint64
		for {
			m = s.meta.Load()
			if m&lockBit == 0 && s.meta.CompareAndSwap(m, lockBit) {
				break
			}
			wait(s, m)
		}
		if m == 0 {
			continue
		}
		// fresh is not yet visible to any take: plain order suffices,
		// and the Store of slots below publishes it.
		for j := m & hashMask & mask; ; j = (j + 1) & mask {
			if fresh[j].meta.Load() == 0 {
				fresh[j].st = s.st
				fresh[j].meta.Store(m)
				break
			}
		}
	}
	t.slots.Store(&fresh[0])
	t.mask.Store(mask) // after slots: rule 3
	t.hand = 0
}

// removeAt empties slot i, which the caller holds locked under the shard
// lock, with backward-shift deletion: later members of the probe run move
// back so that lookups never stop early at a hole, and no tombstones
// accumulate. Each moved entry is published at its new place before its old
// slot is unlocked with other contents (rule 1).
func (t *table) removeAt(i uint64) {
	t.n--
	mask, base := t.mask.Load(), t.slots.Load()
	hole := at(base, i)
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := at(base, j)
		m := s.meta.Load()
		if m == 0 {
			break
		}
		home := m & hashMask & mask
		// Move j back into the hole at i unless its home lies cyclically
		// in (i, j], where it would become unreachable.
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			m = s.lock()
			hole.st = s.st
			hole.meta.Store(m)
			hole, i = s, j
		}
	}
	hole.meta.Store(0)
}

// evict removes one bucket to make room and reports whether it did, the
// 62-bit hash it held, and whether the bucket was full. It prefers, in
// order: a full bucket not used since the hand last passed it; a full bucket
// used since; and, only when notFull is allowed, the not-yet-full bucket
// closest to full, preferring unused ones. Evicting a full bucket changes no
// decision: a new bucket starts full too. The shard lock must be held.
//
// The scan locks each slot to read its state and keeps the current
// candidate locked until it is evicted or replaced, so no take can drain a
// bucket between the check that it is full and its eviction.
func (t *table) evict(now int64, notFull bool) (ok bool, hash uint64, full bool) {
	if t.n == 0 {
		return false, 0, false
	}
	const none = ^uint64(0)
	var (
		mask, base = t.mask.Load(), t.slots.Load()
		fullRef    = none
		fullMeta   uint64
		best       = none
		bestMeta   uint64
		bestAt     = int64(never)
		bestIdle   = false
		i          = t.hand & mask
		remaining  = scanSlots
	)
	if remaining > int(mask+1) {
		remaining = int(mask + 1)
	}
	for ; remaining > 0; remaining, i = remaining-1, (i+1)&mask {
		s := at(base, i)
		if s.meta.Load() == 0 {
			continue
		}
		m := s.lock()
		idle := m&refBit == 0
		m &^= refBit // unlocked below with the reference cleared
		switch {
		case s.st.full(now) && idle:
			if best != none {
				at(base, best).meta.Store(bestMeta)
			}
			if fullRef != none {
				at(base, fullRef).meta.Store(fullMeta)
			}
			t.hand = i + 1
			t.removeAt(i)
			return true, m & hashMask, true
		case s.st.full(now) && fullRef == none:
			if best != none {
				at(base, best).meta.Store(bestMeta)
				best = none
			}
			fullRef, fullMeta = i, m
			continue // keep it locked
		case notFull && fullRef == none && !s.st.full(now) &&
			(idle && !bestIdle || idle == bestIdle && s.st.fullAt < bestAt):
			if best != none {
				at(base, best).meta.Store(bestMeta)
			}
			best, bestMeta, bestAt, bestIdle = i, m, s.st.fullAt, idle
			continue // keep it locked
		}
		s.meta.Store(m)
	}
	t.hand = i
	switch {
	case fullRef != none:
		t.removeAt(fullRef)
		return true, fullMeta & hashMask, true
	case best != none:
		t.removeAt(best)
		return true, bestMeta & hashMask, false
	}
	return false, 0, false
}
