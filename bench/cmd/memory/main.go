// Command memory reports the heap bytes each library keeps per tracked key:
// it fills one store per library with -keys distinct keys and measures the
// live heap before and after.
//
// The figure is all-in: the store's tables, its per-key state and, for stores
// that keep the key string, the key's bytes. Keys are built as new strings in
// the fill loop, as a server would build them from requests, so a store that
// does not keep them leaves them to the collector.
//
// Usage:
//
//	go run ./cmd/memory [-keys 1000000]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "memory:", err)
		os.Exit(1)
	}
}

func run(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("memory", flag.ContinueOnError)
	keys := fs.Int("keys", 1_000_000, "distinct keys per store")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keys <= 0 {
		return fmt.Errorf("-keys %d: want > 0", *keys)
	}
	rows, err := measureAll(*keys)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "heap bytes per tracked key, %d keys, %s %s/%s\n\n",
		*keys, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "store\theap bytes\tbytes/key\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t\n", r.name, r.bytes, r.perKey())
	}
	return tw.Flush()
}

// A row is one store's measurement.
type row struct {
	name  string
	keys  int
	bytes int64 // live heap growth with the store filled
}

func (r row) perKey() float64 { return float64(r.bytes) / float64(r.keys) }

// A filler builds a store holding n keys, checks it holds them all, and
// returns it with a function that releases it.
type filler struct {
	name string
	fill func(n int) (store any, release func(), err error)
}

// The limit is irrelevant to memory; it only has to admit each key's first
// take.
const (
	limRate  = 100
	limBurst = 10
)

var fillers = []filler{
	{"floodgate keyed", fillFloodgate},
	{"map[string]*rate.Limiter", fillXrateMap},
	{"go-limiter memorystore", fillGolimiter},
}

func measureAll(n int) ([]row, error) {
	rows := make([]row, 0, len(fillers))
	for _, f := range fillers {
		r, err := measure(f, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func measure(f filler, n int) (row, error) {
	before := liveHeap()
	store, release, err := f.fill(n)
	if err != nil {
		return row{}, err
	}
	after := liveHeap()
	runtime.KeepAlive(store)
	release()
	return row{name: f.name, keys: n, bytes: int64(after) - int64(before)}, nil
}

// liveHeap returns the bytes of live heap objects, collected twice so that
// nothing unreachable is left over from the previous store.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func key(i int) string { return "client-" + strconv.Itoa(i) }

func fillFloodgate(n int) (any, func(), error) {
	m, err := keyed.New(keyed.WithCapacity(n))
	if err != nil {
		return nil, nil, err
	}
	ctx, lim := context.Background(), floodgate.PerSecond(limRate, limBurst)
	for i := range n {
		res, err := m.TakeN(ctx, key(i), lim, 1)
		if err != nil {
			return nil, nil, err
		}
		if !res.Allowed {
			return nil, nil, fmt.Errorf("first take of %q rejected", key(i))
		}
	}
	if got := m.Len(); got != n {
		return nil, nil, fmt.Errorf("Len() = %d, want %d", got, n)
	}
	return m, func() {}, nil
}

// xrateMap is the common hand-rolled keyed limiter: a limiter per key,
// created on first use, in a map under one mutex.
type xrateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (x *xrateMap) allow(key string) bool {
	x.mu.Lock()
	lim, ok := x.m[key]
	if !ok {
		lim = rate.NewLimiter(limRate, limBurst)
		x.m[key] = lim
	}
	x.mu.Unlock()
	return lim.Allow()
}

func fillXrateMap(n int) (any, func(), error) {
	x := &xrateMap{m: make(map[string]*rate.Limiter)}
	for i := range n {
		if !x.allow(key(i)) {
			return nil, nil, fmt.Errorf("first take of %q rejected", key(i))
		}
	}
	if got := len(x.m); got != n {
		return nil, nil, fmt.Errorf("len(map) = %d, want %d", got, n)
	}
	return x, func() {}, nil
}

func fillGolimiter(n int) (any, func(), error) {
	ctx := context.Background()
	s, err := memorystore.New(&memorystore.Config{
		Tokens:        limBurst,
		Interval:      time.Second,
		SweepInterval: 24 * time.Hour, // no sweep while filling and measuring
		SweepMinTTL:   24 * time.Hour,
	})
	if err != nil {
		return nil, nil, err
	}
	release := func() { s.Close(ctx) }
	for i := range n {
		_, _, _, ok, err := s.Take(ctx, key(i))
		if err == nil && !ok {
			err = fmt.Errorf("first take of %q rejected", key(i))
		}
		if err != nil {
			release()
			return nil, nil, err
		}
	}
	// Get reports a zero limit for a key the store does not hold.
	for i := range n {
		tokens, _, err := s.Get(ctx, key(i))
		if err == nil && tokens != limBurst {
			err = errors.New("key " + strconv.Quote(key(i)) + " not held")
		}
		if err != nil {
			release()
			return nil, nil, err
		}
	}
	return s, release, nil
}
