package promfloodgate

import (
	"maps"
	"strings"
	"sync"
	"sync/atomic"
)

// A cowMap is read without a lock and copied on every write: the
// observer's tables take a bounded number of entries, each once, and are
// read on every call.
type cowMap[K comparable, V any] struct {
	mu sync.Mutex // serializes writers
	m  atomic.Pointer[map[K]V]
}

func (c *cowMap[K, V]) load() map[K]V {
	if m := c.m.Load(); m != nil {
		return *m
	}
	return nil
}

func (c *cowMap[K, V]) get(k K) (V, bool) {
	v, ok := c.load()[k]
	return v, ok
}

// add stores newV(entries) under k unless k is present or the map holds
// max entries, and returns what k holds then.
func (c *cowMap[K, V]) add(k K, max int, newV func(n int) V) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.load()
	if v, ok := old[k]; ok || len(old) >= max {
		return v, ok
	}
	v := newV(len(old))
	next := make(map[K]V, len(old)+1)
	maps.Copy(next, old)
	next[k] = v
	c.m.Store(&next)
	return v, true
}

// A label is a label value and a number that stands for it in a series'
// key, cheaper to hash than the value.
type label struct {
	value string
	id    int
}

// capped labels the first max values it is given as themselves and later
// ones "other"; the empty value is "none".
type capped struct {
	max  int
	seen cowMap[string, label]
}

var (
	labelNone  = label{LabelNone, 0}
	labelOther = label{LabelOther, 1}
)

func (c *capped) label(v string) label {
	if v == "" {
		return labelNone
	}
	if l, ok := c.seen.get(v); ok {
		return l
	}
	// Values past the cap are common to every later event of theirs: they
	// must not take the lock each time.
	if len(c.seen.load()) >= c.max {
		return labelOther
	}
	// A copy, so the label does not pin a reloaded-away table's strings.
	v = strings.Clone(v)
	if l, ok := c.seen.add(v, c.max, func(n int) label { return label{validLabel(v), n + 2} }); ok {
		return l
	}
	return labelOther
}
