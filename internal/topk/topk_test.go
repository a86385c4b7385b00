package topk

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNewRejectsZero(t *testing.T) {
	if _, err := New(0); err != ErrInvalidCapacity {
		t.Fatalf("New(0) error = %v, want ErrInvalidCapacity", err)
	}
}

func TestExactBelowCapacity(t *testing.T) {
	s, _ := New(4)
	for _, k := range []string{"a", "b", "a", "c", "a", "b"} {
		s.Add(k, 1)
	}
	s.Add("x", 0)
	want := []Item{{"a", 3, 0}, {"b", 2, 0}, {"c", 1, 0}}
	if diff := cmp.Diff(want, s.Top(0)); diff != "" {
		t.Errorf("Top(0) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[:2], s.Top(2)); diff != "" {
		t.Errorf("Top(2) (-want +got):\n%s", diff)
	}
	if got := s.Total(); got != 6 {
		t.Errorf("Total() = %d, want 6", got)
	}
	s.Reset()
	if got := s.Top(0); len(got) != 0 || s.Total() != 0 {
		t.Errorf("after Reset: Top = %v, Total = %d", got, s.Total())
	}
}

func TestReplacesMinimum(t *testing.T) {
	s, _ := New(2)
	s.Add("a", 5)
	s.Add("b", 2)
	s.Add("c", 1) // replaces b: count 3, error 2
	want := []Item{{"a", 5, 0}, {"c", 3, 2}}
	if diff := cmp.Diff(want, s.Top(0)); diff != "" {
		t.Errorf("Top (-want +got):\n%s", diff)
	}
}

// TestGuarantees checks the Space-Saving bounds on skewed random streams:
// every key over N/k is tracked, Count is an upper bound, Count − Err a lower
// bound, and Err ≤ N/k.
func TestGuarantees(t *testing.T) {
	for _, k := range []int{1, 5, 20, 100} {
		for seed := uint64(1); seed <= 5; seed++ {
			t.Run(fmt.Sprintf("k%d/seed%d", k, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, seed))
				zipf := rand.NewZipf(r, 1.2, 1, 5000)
				s, _ := New(k)
				truth := map[string]uint64{}
				var n uint64
				for range 20000 {
					key := fmt.Sprint(zipf.Uint64())
					w := 1 + r.Uint64N(3)
					truth[key] += w
					n += w
					s.Add(key, w)
				}
				if s.Total() != n {
					t.Fatalf("Total() = %d, want %d", s.Total(), n)
				}
				top := s.Top(0)
				if len(top) > k {
					t.Fatalf("%d items tracked, capacity %d", len(top), k)
				}
				tracked := map[string]Item{}
				for _, it := range top {
					tracked[it.Key] = it
					tc := truth[it.Key]
					if it.Count < tc || it.Count-it.Err > tc {
						t.Errorf("%s: count %d err %d, true %d: not within bounds", it.Key, it.Count, it.Err, tc)
					}
					if it.Err > n/uint64(k) {
						t.Errorf("%s: err %d > N/k = %d", it.Key, it.Err, n/uint64(k))
					}
				}
				for key, c := range truth {
					if c > n/uint64(k) {
						if _, ok := tracked[key]; !ok {
							t.Errorf("heavy hitter %s (count %d > N/k = %d) not tracked", key, c, n/uint64(k))
						}
					}
				}
			})
		}
	}
}

func TestConcurrent(t *testing.T) {
	s, _ := New(8)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				s.Add(fmt.Sprint((i*7+g)%13), 1)
				_ = s.Top(3)
			}
		})
	}
	wg.Wait()
	if s.Total() != 4000 {
		t.Errorf("Total() = %d, want 4000", s.Total())
	}
}

func TestAddPrefixed(t *testing.T) {
	s, _ := New(2)
	s.AddPrefixed("t:", "acme", 5)
	s.Add("t:acme", 1)
	s.AddPrefixed("t:", "bigco", 2)
	s.AddPrefixed("t:", "", 0)
	s.AddPrefixed("", "c", 3) // replaces t:bigco: count 5, error 2
	want := []Item{{"t:acme", 6, 0}, {"c", 5, 2}}
	if diff := cmp.Diff(want, s.Top(0)); diff != "" {
		t.Errorf("Top (-want +got):\n%s", diff)
	}
	if got := s.Total(); got != 11 {
		t.Errorf("Total() = %d, want 11", got)
	}
}

// TestAddPrefixedAllocs: adding to a tracked key builds no string.
func TestAddPrefixedAllocs(t *testing.T) {
	s, _ := New(4)
	s.AddPrefixed("t:", "acme", 1)
	if n := testing.AllocsPerRun(200, func() { s.AddPrefixed("t:", "acme", 3) }); n != 0 {
		t.Errorf("AddPrefixed allocates %v times, want 0", n)
	}
}

func TestAddBytes(t *testing.T) {
	s, _ := New(2)
	buf := []byte("a:x")
	s.AddBytes(buf, 2)
	buf[2] = 'y' // the summary keeps a copy
	s.AddBytes(buf, 1)
	s.Add("a:x", 1)
	s.AddBytes(buf, 0)
	want := []Item{{"a:x", 3, 0}, {"a:y", 1, 0}}
	if diff := cmp.Diff(want, s.Top(0)); diff != "" {
		t.Errorf("Top (-want +got):\n%s", diff)
	}
}

// TestAddBytesAllocs: adding to a tracked key builds no string.
func TestAddBytesAllocs(t *testing.T) {
	s, _ := New(4)
	key := []byte("a:0123456789ab")
	s.AddBytes(key, 1)
	if n := testing.AllocsPerRun(200, func() { s.AddBytes(key, 3) }); n != 0 {
		t.Errorf("AddBytes allocates %v times, want 0", n)
	}
}
