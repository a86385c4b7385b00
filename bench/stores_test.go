package bench

import (
	"sync"
	"testing"
)

// The benchmarks' fixtures and stores, checked without timing anything.

func TestFixture(t *testing.T) {
	const n = 1_000
	f := fixtureFor(t, n)
	seen := make(map[string]bool, n)
	for _, k := range f.keys {
		if seen[k] {
			t.Fatalf("key %q appears twice", k)
		}
		seen[k] = true
	}
	if got, want := len(f.stream), 16384; got != want {
		t.Errorf("len(stream) = %d, want %d", got, want)
	}
	drawn := make(map[string]bool, n)
	for _, k := range f.stream {
		if !seen[k] {
			t.Fatalf("stream key %q is not a fixture key", k)
		}
		drawn[k] = true
	}
	if got, want := len(drawn), n; got != want {
		t.Errorf("stream draws %d distinct keys, want %d", got, want)
	}
	if fixtureFor(t, n) != f {
		t.Error("fixtureFor built a second fixture of the same size")
	}
}

func TestStores(t *testing.T) {
	t.Run("floodgate", func(t *testing.T) { testStore(t, floodgateImpl) })
	t.Run("xrate-single", func(t *testing.T) { testStore(t, xrateSingleImpl) })
	t.Run("xrate-map", func(t *testing.T) { testStore(t, xrateMapImpl) })
	t.Run("golimiter", func(t *testing.T) { testStore(t, golimiterImpl) })
}

// testStore runs the benchmark's paths briefly, serially and from several
// goroutines at once (for the race detector), and checks that every take is
// granted and every key stays tracked.
func testStore[S store](t *testing.T, im impl[S]) {
	f := fixtureFor(t, 1_000)
	s := newStore(t, im, f)
	t.Cleanup(s.close)
	for i, k := range f.stream {
		if !s.take(k) {
			t.Fatalf("take #%d (%q) rejected", i, k)
		}
	}
	const goroutines = 4
	var wg sync.WaitGroup
	errs := make(chan string, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range 2_000 {
				k := f.stream[(g*len(f.stream)/goroutines+i)%len(f.stream)]
				if !s.take(k) {
					errs <- k
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for k := range errs {
		t.Errorf("concurrent take of %q rejected", k)
	}
	if err := s.verify(f); err != nil {
		t.Error(err)
	}
}
