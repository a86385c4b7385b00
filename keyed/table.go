package keyed

// table is a shard's compact storage: an open-addressing hash table with
// linear probing and the bucket state inline in each 32-byte slot, so a take
// on an existing key touches one cache line of the table. Recency is kept
// CLOCK-style: a hit sets a reference bit, and the eviction scan clears it
// once before it may evict that slot (a second chance).
//
// The table stores 62 bits of each key's hash, never the key. It is not safe
// for concurrent use: the shard's mutex guards it.
type table struct {
	slots []slot
	mask  uint64
	n     int    // occupied slots
	hand  uint64 // CLOCK hand: the next slot the eviction scan looks at
}

type slot struct {
	meta uint64 // occupied bit, reference bit, 62 bits of hash; 0 = empty
	st   state
}

const (
	occupied = 1 << 63
	refBit   = 1 << 62
	hashMask = refBit - 1

	minSlots = 16
	// scanSlots bounds one eviction scan: at a load of at most one half it
	// looks at about 32 buckets in 2 KiB of contiguous memory.
	scanSlots = 64
)

func (t *table) init() {
	*t = table{slots: make([]slot, minSlots), mask: minSlots - 1}
}

// find returns the state for hash h, or nil. ref marks the slot recently used.
func (t *table) find(h uint64, ref bool) *state {
	k := h&hashMask | occupied
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.meta&^refBit == k {
			if ref {
				s.meta |= refBit
			}
			return &s.st
		}
		if s.meta == 0 {
			return nil
		}
	}
}

// insert adds h, which must be absent, with st and returns its state. The
// table grows to keep its load at most one half, which keeps probe
// sequences short.
func (t *table) insert(h uint64, st state) *state {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	t.n++
	return t.place(h&hashMask|occupied|refBit, st)
}

func (t *table) place(meta uint64, st state) *state {
	for i := meta & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.meta == 0 {
			s.meta, s.st = meta, st
			return &s.st
		}
	}
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, 2*len(old))
	t.mask = uint64(len(t.slots) - 1)
	t.hand = 0
	for i := range old {
		if old[i].meta != 0 {
			t.place(old[i].meta, old[i].st)
		}
	}
}

// remove deletes h and reports whether it was present.
func (t *table) remove(h uint64) bool {
	k := h&hashMask | occupied
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		m := t.slots[i].meta
		if m&^refBit == k {
			t.removeAt(i)
			return true
		}
		if m == 0 {
			return false
		}
	}
}

// removeAt empties slot i with backward-shift deletion: later members of the
// probe run move back so that lookups never stop early at a hole, and no
// tombstones accumulate.
func (t *table) removeAt(i uint64) {
	t.n--
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		m := t.slots[j].meta
		if m == 0 {
			break
		}
		home := m & t.mask
		// Move j back into the hole at i unless its home lies cyclically
		// in (i, j], where it would become unreachable.
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
}

// evict removes one bucket to make room and reports whether it did, the
// 62-bit hash it held, and whether the bucket was full. It prefers, in order: a full bucket not used
// since the hand last passed it; a full bucket used since; and, only when
// notFull is allowed, the not-yet-full bucket closest to full, preferring
// unused ones. Evicting a full bucket changes no decision: a new bucket
// starts full too.
func (t *table) evict(now int64, notFull bool) (ok bool, hash uint64, full bool) {
	if t.n == 0 {
		return false, 0, false
	}
	var (
		fullRef   = ^uint64(0)
		best      = ^uint64(0)
		bestAt    = int64(never)
		bestIdle  = false
		i         = t.hand & t.mask
		remaining = scanSlots
	)
	if remaining > len(t.slots) {
		remaining = len(t.slots)
	}
	for ; remaining > 0; remaining, i = remaining-1, (i+1)&t.mask {
		s := &t.slots[i]
		if s.meta == 0 {
			continue
		}
		idle := s.meta&refBit == 0
		s.meta &^= refBit
		if s.st.full(now) {
			if idle {
				t.hand = i + 1
				hash = s.meta & hashMask
				t.removeAt(i)
				return true, hash, true
			}
			if fullRef == ^uint64(0) {
				fullRef = i
			}
			continue
		}
		if notFull && (idle && !bestIdle || idle == bestIdle && s.st.fullAt < bestAt) {
			best, bestAt, bestIdle = i, s.st.fullAt, idle
		}
	}
	t.hand = i
	switch {
	case fullRef != ^uint64(0):
		hash = t.slots[fullRef].meta & hashMask
		t.removeAt(fullRef)
		return true, hash, true
	case best != ^uint64(0):
		hash = t.slots[best].meta & hashMask
		t.removeAt(best)
		return true, hash, false
	}
	return false, 0, false
}
