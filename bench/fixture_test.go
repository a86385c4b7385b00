package bench

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// A size is one key-set size of the side-by-side benchmarks.
type size struct {
	name string
	keys int
}

var sizes = []size{
	{"1k", 1_000},
	{"100k", 100_000},
	{"1M", 1_000_000},
}

// A fixture is one key set shared by every library at a given size, built once
// per process.
type fixture struct {
	// keys are the distinct keys "client-0", "client-1", …, each its own
	// allocation, as a server would hold them after parsing requests.
	keys []string
	// stream is a uniform pseudo-random sequence over keys, a power of two
	// long, precomputed so the timed loop draws no random numbers. Its strings
	// are copies laid out back to back in access order: the loop reads them
	// sequentially, so the only random memory accesses are the store's own.
	stream []string
}

// maxStream bounds the stream's length (about 30 MB at this length).
const maxStream = 1 << 20

var fixtures sync.Map // keys int → func() *fixture

// fixtureFor returns the shared fixture with n keys, building it on first use.
func fixtureFor(tb testing.TB, n int) *fixture {
	tb.Helper()
	get, _ := fixtures.LoadOrStore(n, sync.OnceValue(func() *fixture { return newFixture(n) }))
	f := get.(func() *fixture)()
	if err := f.check(n); err != nil {
		tb.Fatal(err)
	}
	return f
}

func newFixture(n int) *fixture {
	f := &fixture{keys: make([]string, n)}
	for i := range f.keys {
		f.keys[i] = "client-" + strconv.Itoa(i)
	}
	// At least 16 draws per key, so every key recurs, within maxStream.
	length := min(1<<bits.Len(uint(16*n-1)), maxStream)
	rng := rand.New(rand.NewPCG(uint64(n), 0x666c6f6f64676174))
	order := make([]int32, length)
	var arenaLen int
	for i := range order {
		order[i] = int32(rng.IntN(n))
		arenaLen += len(f.keys[order[i]])
	}
	buf := make([]byte, 0, arenaLen)
	for _, k := range order {
		buf = append(buf, f.keys[k]...)
	}
	arena := string(buf)
	f.stream = make([]string, length)
	off := 0
	for i, k := range order {
		l := len(f.keys[k])
		f.stream[i] = arena[off : off+l]
		off += l
	}
	return f
}

// check reports an error unless f holds n distinct keys and a non-empty
// power-of-two stream over them.
func (f *fixture) check(n int) error {
	switch {
	case n <= 0 || len(f.keys) != n:
		return fmt.Errorf("fixture: %d keys, want %d > 0", len(f.keys), n)
	case len(f.stream) == 0 || len(f.stream)&(len(f.stream)-1) != 0:
		return fmt.Errorf("fixture: stream length %d, want a power of two > 0", len(f.stream))
	case f.keys[0] == f.keys[n-1] && n > 1:
		return fmt.Errorf("fixture: keys not distinct: %q", f.keys[0])
	}
	return nil
}

// A store is one library's bucket store under benchmark, filled with a
// fixture's keys.
type store interface {
	// take takes one token for key and reports whether it was granted.
	take(key string) bool
	// verify reports an error unless the store tracks every key of f.
	verify(f *fixture) error
	close()
}

// An impl names a library and builds its store over a fixture. build takes
// every key once (the pre-warm), so the timed loop measures the existing-key
// path only.
type impl[S store] struct {
	name  string
	build func(f *fixture) (S, error)
}

// newStore builds and verifies impl's store over f.
func newStore[S store](tb testing.TB, im impl[S], f *fixture) S {
	tb.Helper()
	s, err := im.build(f)
	if err != nil {
		tb.Fatalf("%s: build: %v", im.name, err)
	}
	if err := s.verify(f); err != nil {
		s.close()
		tb.Fatalf("%s: %v", im.name, err)
	}
	return s
}

// runImpl runs the sub-benchmark "impl=name" for one library at one size,
// serial or under RunParallel. The store is built once for every call the
// testing package makes of the sub-benchmark and closed after it.
func runImpl[S store](b *testing.B, im impl[S], sz size, parallel bool) {
	var (
		s     S
		built bool
	)
	b.Run("impl="+im.name, func(b *testing.B) {
		f := fixtureFor(b, sz.keys)
		if !built {
			s = newStore(b, im, f)
			built = true
			runtime.GC() // the build's garbage is not the loop's cost
		}
		b.ReportAllocs()
		if parallel {
			loopParallel(b, s, f.stream)
		} else {
			loopSerial(b, s, f.stream)
		}
		if err := s.verify(f); err != nil { // nothing evicted meanwhile
			b.Fatalf("%s after the loop: %v", im.name, err)
		}
	})
	if built {
		s.close()
	}
}

// loopSerial also reports cpu-ns/op, the loop thread's CPU time per take:
// unlike ns/op, it leaves out the time other processes hold the CPU, so it
// stays comparable on a shared machine.
func loopSerial[S store](b *testing.B, s S, stream []string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	mask := len(stream) - 1
	i, rejected := 0, 0
	cpu0, ok := threadCPU()
	for b.Loop() {
		if !s.take(stream[i&mask]) {
			rejected++
		}
		i++
	}
	if cpu1, ok1 := threadCPU(); ok && ok1 {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
	if rejected > 0 {
		b.Fatalf("%d of %d takes rejected: the limit ran dry", rejected, b.N)
	}
}

// loopParallel gives each goroutine its own offset into the stream, so they
// take from different keys at any moment. It also reports cpu-ns/op, the
// process's CPU time per take (lock spinning included).
func loopParallel[S store](b *testing.B, s S, stream []string) {
	mask := len(stream) - 1
	procs := runtime.GOMAXPROCS(0)
	var next, rejected atomic.Int64
	b.ResetTimer()
	cpu0, ok := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		g := int(next.Add(1) - 1)
		i, n := g*len(stream)/procs, int64(0)
		for pb.Next() {
			if !s.take(stream[i&mask]) {
				n++
			}
			i++
		}
		rejected.Add(n)
	})
	b.StopTimer()
	if cpu1, ok1 := processCPU(); ok && ok1 {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
	if n := rejected.Load(); n > 0 {
		b.Fatalf("%d of %d takes rejected: the limit ran dry", n, b.N)
	}
}
