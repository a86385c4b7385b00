package promfloodgate

import (
	"encoding/binary"
	"math/bits"
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
