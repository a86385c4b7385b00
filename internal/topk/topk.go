// Package topk keeps a bounded summary of the most frequent keys of a stream,
// by the Space-Saving algorithm (Metwally, Agrawal and El Abbadi, 2005).
//
// A Summary of capacity k tracks at most k keys, whatever the number of
// distinct keys it is given. After a stream of total weight N:
//
//   - every key whose true count exceeds N/k is tracked;
//   - a tracked key's Count is an upper bound of its true count, and
//     Count − Err a lower bound, with Err ≤ N/k.
//
// A Summary is safe for concurrent use.
package topk

import (
	"container/heap"
	"errors"
	"slices"
	"strings"
	"sync"
)

// ErrInvalidCapacity is returned by New for a capacity below 1.
var ErrInvalidCapacity = errors.New("topk: capacity must be ≥ 1")

// An Item is a tracked key with its estimated count.
type Item struct {
	Key string
	// Count is an upper bound of the key's true count.
	Count uint64
	// Err bounds the overestimate: the true count is at least Count − Err.
	Err uint64
}

// A Summary is a Space-Saving summary of at most k keys.
type Summary struct {
	mu    sync.Mutex
	k     int
	total uint64
	h     minHeap
	index map[string]int // key → position in h
	buf   []byte         // AddPrefixed's key, under mu
}

// New returns an empty Summary tracking at most k keys.
func New(k int) (*Summary, error) {
	if k < 1 {
		return nil, ErrInvalidCapacity
	}
	s := &Summary{k: k, h: minHeap{items: make([]Item, 0, k)}, index: make(map[string]int, k)}
	s.h.index = s.index
	return s, nil
}

// Cap returns the number of keys the Summary tracks at most.
func (s *Summary) Cap() int { return s.k }

// Add counts n occurrences of key. n of 0 does nothing. A new key arriving
// when k keys are tracked replaces the key with the smallest count, inheriting
// that count as its error.
func (s *Summary) Add(key string, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[key]; ok {
		s.bump(i, n)
		return
	}
	s.insert(strings.Clone(key), n)
}

// AddPrefixed is Add(prefix+key, n) without building the key unless it
// is new: a tracked key costs no allocation.
func (s *Summary) AddPrefixed(prefix, key string, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(append(s.buf[:0], prefix...), key...)
	if i, ok := s.index[string(s.buf)]; ok {
		s.bump(i, n)
		return
	}
	s.insert(string(s.buf), n)
	if cap(s.buf) > 1024 {
		s.buf = nil // keep no long key
	}
}

// AddBytes is Add(string(key), n) without building the string unless the
// key is new: a tracked key costs no allocation.
func (s *Summary) AddBytes(key []byte, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[string(key)]; ok {
		s.bump(i, n)
		return
	}
	s.insert(string(key), n)
}

// bump counts n more of the item at i. It is called with mu held.
func (s *Summary) bump(i int, n uint64) {
	s.total += n
	s.h.items[i].Count += n
	heap.Fix(&s.h, i)
}

// insert counts n of key, not tracked, which the Summary may keep. It is
// called with mu held.
func (s *Summary) insert(key string, n uint64) {
	s.total += n
	if len(s.h.items) < s.k {
		heap.Push(&s.h, Item{Key: key, Count: n})
		return
	}
	min := s.h.items[0]
	delete(s.index, min.Key)
	s.h.items[0] = Item{Key: key, Count: min.Count + n, Err: min.Count}
	s.index[key] = 0
	heap.Fix(&s.h, 0)
}

// Total returns the weight of the stream so far, N.
func (s *Summary) Total() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Top returns up to n tracked items, by decreasing Count (then by key), and
// all of them for n ≤ 0. The slice is the caller's.
func (s *Summary) Top(n int) []Item {
	s.mu.Lock()
	items := slices.Clone(s.h.items)
	s.mu.Unlock()
	slices.SortFunc(items, func(a, b Item) int {
		if a.Count != b.Count {
			if a.Count > b.Count {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	if n > 0 && n < len(items) {
		items = items[:n]
	}
	return items
}

// Reset forgets every key and the total.
func (s *Summary) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total = 0
	s.h.items = s.h.items[:0]
	clear(s.index)
}

// minHeap orders items by Count, keeping index up to date.
type minHeap struct {
	items []Item
	index map[string]int
}

func (h *minHeap) Len() int           { return len(h.items) }
func (h *minHeap) Less(i, j int) bool { return h.items[i].Count < h.items[j].Count }
func (h *minHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.index[h.items[i].Key] = i
	h.index[h.items[j].Key] = j
}
func (h *minHeap) Push(x any) {
	it := x.(Item)
	h.index[it.Key] = len(h.items)
	h.items = append(h.items, it)
}
func (h *minHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	delete(h.index, it.Key)
	return it
}
