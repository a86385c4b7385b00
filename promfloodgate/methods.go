package promfloodgate

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// methodTable maps the registered full method names to their indexes by
// open addressing over a hash of the name's length and its first and last
// eight bytes, verified by comparing the whole name: cheaper than a Go map
// for the short names of gRPC methods. It is built once and only read.
type methodTable struct {
	names []string // index → name
	slots []int32  // −1 empty, else an index into names
	mask  uint64
}

func newMethodTable(names []string) methodTable {
	n := 16
	for n < 4*len(names) {
		n *= 2
	}
	t := methodTable{slots: make([]int32, n), mask: uint64(n - 1)}
	for i := range t.slots {
		t.slots[i] = -1
	}
	for _, name := range names {
		if _, ok := t.lookup(name); ok {
			continue
		}
		for h := methodHash(name); ; h++ {
			if s := &t.slots[h&t.mask]; *s < 0 {
				*s = int32(len(t.names))
				t.names = append(t.names, name)
				break
			}
		}
	}
	return t
}

// lookup returns name's index and whether it is registered.
func (t *methodTable) lookup(name string) (int, bool) {
	for h := methodHash(name); ; h++ {
		i := t.slots[h&t.mask]
		if i < 0 {
			return 0, false
		}
		if t.names[i] == name {
			return int(i), true
		}
	}
}

// methodHash mixes name's length with its first and last eight bytes.
func methodHash(name string) uint64 {
	var a, b uint64
	if len(name) >= 8 {
		a = binary.LittleEndian.Uint64([]byte(name[:8]))
		b = binary.LittleEndian.Uint64([]byte(name[len(name)-8:]))
	} else {
		for i := 0; i < len(name); i++ {
			a = a<<8 | uint64(name[i])
		}
	}
	hi, lo := bits.Mul64(a^uint64(len(name))*0x9e3779b97f4a7c15, b^0xc2b2ae3d27d4eb4f)
	return hi ^ lo
}

// methodMemo remembers, by the address of a method name's bytes, the label
// index found for it, so that an event whose Method is the same string as
// an earlier one (the middleware passes the string its route cached) costs
// a few loads instead of a hash and a full comparison. Slots are seqlocks
// of atomic words, so readers take no lock and writers allocate nothing: a
// method string new on every event (the tap handle's) only misses.
//
// A slot holds its string's address as a pointer, which keeps the string
// alive while it is remembered: another string cannot take its address, so
// equal address and length mean an equal name.
type methodMemo struct {
	slots [memoSlots]memoSlot
}

type memoSlot struct {
	seq  atomic.Uint32 // odd while a writer fills the slot
	ptr  atomic.Pointer[byte]
	meta atomic.Uint64 // len<<32 | index
	_    [40]byte
}

const (
	memoBits  = 8
	memoSlots = 1 << memoBits
)

func (m *methodMemo) slot(p *byte) *memoSlot {
	return &m.slots[(uint64(uintptr(unsafe.Pointer(p)))*0x9e3779b97f4a7c15)>>(64-memoBits)]
}

// get returns the index remembered for name.
func (m *methodMemo) get(name string) (int, bool) {
	p := unsafe.StringData(name)
	if p == nil {
		return 0, false
	}
	s := m.slot(p)
	seq := s.seq.Load()
	if seq&1 != 0 || s.ptr.Load() != p {
		return 0, false
	}
	meta := s.meta.Load()
	if s.seq.Load() != seq || int(meta>>32) != len(name) {
		return 0, false
	}
	return int(uint32(meta)), true
}

// put remembers name's index, unless another writer holds the slot.
func (m *methodMemo) put(name string, i int) {
	p := unsafe.StringData(name)
	if p == nil || uint64(len(name)) > math.MaxUint32 {
		return
	}
	s := m.slot(p)
	seq := s.seq.Load()
	if seq&1 != 0 || !s.seq.CompareAndSwap(seq, seq+1) {
		return
	}
	s.ptr.Store(p)
	s.meta.Store(uint64(len(name))<<32 | uint64(uint32(i)))
	s.seq.Store(seq + 2)
}
