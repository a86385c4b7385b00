package promfloodgate

import (
	"sync"
	"sync/atomic"
)

// seriesTable maps a decision series, packed into a uint64 by the
// collector, to its counter. The dimensions multiply (reason and flags,
// source, tier, method and, opt-in, tenant) to far more series than ever
// occur, so counters are made on first use rather than laid out in advance.
//
// Lookups take no lock: the table is open addressing over atomic slots,
// behind an atomic pointer. Inserts are serialized by a mutex; one that
// would fill the table past half builds a table twice the size and
// publishes it. Counters live outside the slots, so a table being replaced
// shares them with its successor and no count made meanwhile is lost.
type seriesTable struct {
	mu  sync.Mutex // serializes inserts
	cur atomic.Pointer[seriesSlots]
}

type seriesSlots struct {
	slots []seriesSlot
	mask  uint64
	n     int // keys stored, under seriesTable.mu
}

// A seriesSlot is empty while key is 0. Its counter is stored before its
// key, so a reader that sees the key sees the counter.
type seriesSlot struct {
	key atomic.Uint64
	ctr atomic.Pointer[counter]
}

// counter fills a cache line: series counted from different cores do not
// share one.
type counter struct {
	n atomic.Uint64
	_ [56]byte
}

func newSeriesTable() *seriesTable {
	t := &seriesTable{}
	t.cur.Store(&seriesSlots{slots: make([]seriesSlot, 64), mask: 63})
	return t
}

func slotOf(key uint64) uint64 { return (key * 0x9e3779b97f4a7c15) >> 32 }

// counter returns the counter of key (≠ 0), making it on first use.
func (t *seriesTable) counter(key uint64) *counter {
	s := t.cur.Load()
	for i := slotOf(key); ; i++ {
		sl := &s.slots[i&s.mask]
		switch sl.key.Load() {
		case key:
			return sl.ctr.Load()
		case 0:
			return t.insert(key)
		}
	}
}

func (t *seriesTable) insert(key uint64) *counter {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.cur.Load()
	if c := s.find(key); c != nil {
		return c
	}
	if 2*(s.n+1) > len(s.slots) {
		next := &seriesSlots{slots: make([]seriesSlot, 2*len(s.slots)), mask: uint64(2*len(s.slots) - 1)}
		for i := range s.slots {
			if k := s.slots[i].key.Load(); k != 0 {
				next.put(k, s.slots[i].ctr.Load())
			}
		}
		s = next
		t.cur.Store(s)
	}
	c := &counter{}
	s.put(key, c)
	return c
}

func (s *seriesSlots) find(key uint64) *counter {
	for i := slotOf(key); ; i++ {
		sl := &s.slots[i&s.mask]
		switch sl.key.Load() {
		case key:
			return sl.ctr.Load()
		case 0:
			return nil
		}
	}
}

// put stores a key known to be absent; the caller holds the mutex or owns s.
func (s *seriesSlots) put(key uint64, c *counter) {
	for i := slotOf(key); ; i++ {
		sl := &s.slots[i&s.mask]
		if sl.key.Load() == 0 {
			sl.ctr.Store(c)
			sl.key.Store(key)
			s.n++
			return
		}
	}
}

// each calls f with every series and its count.
func (t *seriesTable) each(f func(key, n uint64)) {
	s := t.cur.Load()
	for i := range s.slots {
		if k := s.slots[i].key.Load(); k != 0 {
			f(k, s.slots[i].ctr.Load().n.Load())
		}
	}
}
