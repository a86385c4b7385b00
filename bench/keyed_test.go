package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"
)

// The limit every library gets: so generous that no bucket runs dry during a
// benchmark, so every take goes through the library's full accept path. The
// loops fail the benchmark on any rejection.
const (
	benchRate  = 1e9 // tokens per second
	benchBurst = 1_000_000
)

// go-limiter counts Tokens per Interval and refills a whole interval's worth at
// each interval boundary. One long interval never reaches a boundary within a
// benchmark, and benchBurst tokens per key outlast every run, so its buckets
// stay on the accept path as the others' do. Its sweeper runs far less often
// than a benchmark lasts.
const (
	golimiterInterval = time.Hour
	golimiterSweep    = 24 * time.Hour
)

func BenchmarkTake(b *testing.B)         { benchmarkTake(b, false) }
func BenchmarkTakeParallel(b *testing.B) { benchmarkTake(b, true) }

func benchmarkTake(b *testing.B, parallel bool) {
	for _, sz := range sizes {
		b.Run("keys="+sz.name, func(b *testing.B) {
			runImpl(b, floodgateImpl, sz, parallel)
			runImpl(b, xrateSingleImpl, sz, parallel)
			runImpl(b, xrateMapImpl, sz, parallel)
			runImpl(b, golimiterImpl, sz, parallel)
		})
	}
}

// floodgate: keyed.Map.TakeN, capacity equal to the key count so that nothing
// is evicted, the default shard count.
type floodgateStore struct {
	m   *keyed.Map
	lim floodgate.Limit
}

var floodgateImpl = impl[floodgateStore]{
	name: "floodgate",
	build: func(f *fixture) (floodgateStore, error) {
		m, err := keyed.New(keyed.WithCapacity(len(f.keys)))
		if err != nil {
			return floodgateStore{}, err
		}
		s := floodgateStore{m: m, lim: floodgate.PerSecond(benchRate, benchBurst)}
		return s, prewarm(s, f)
	},
}

func (s floodgateStore) take(key string) bool {
	res, err := s.m.TakeN(context.Background(), key, s.lim, 1)
	return err == nil && res.Allowed
}

func (s floodgateStore) verify(f *fixture) error {
	if got, want := s.m.Len(), len(f.keys); got != want {
		return fmt.Errorf("Len() = %d, want %d", got, want)
	}
	return nil
}

func (s floodgateStore) close() {}

// xrate-single: rate.Limiter.Allow on one limiter, no key lookup at all: the
// floor that a keyed store's lookup adds to.
type xrateSingleStore struct{ lim *rate.Limiter }

var xrateSingleImpl = impl[xrateSingleStore]{
	name: "xrate-single",
	build: func(f *fixture) (xrateSingleStore, error) {
		s := xrateSingleStore{rate.NewLimiter(benchRate, benchBurst)}
		if !s.lim.Allow() {
			return s, fmt.Errorf("first Allow rejected")
		}
		return s, nil
	},
}

func (s xrateSingleStore) take(string) bool      { return s.lim.Allow() }
func (s xrateSingleStore) verify(*fixture) error { return nil }
func (s xrateSingleStore) close()                {}

// xrate-map: the common hand-rolled keyed limiter, a map[string]*rate.Limiter
// under one mutex, a limiter created on a key's first use.
type xrateMapStore struct{ *xrateMap }

type xrateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

var xrateMapImpl = impl[xrateMapStore]{
	name: "xrate-map",
	build: func(f *fixture) (xrateMapStore, error) {
		s := xrateMapStore{&xrateMap{m: make(map[string]*rate.Limiter)}}
		return s, prewarm(s, f)
	},
}

func (s xrateMapStore) take(key string) bool {
	s.mu.Lock()
	lim, ok := s.m[key]
	if !ok {
		lim = rate.NewLimiter(benchRate, benchBurst)
		s.m[key] = lim
	}
	s.mu.Unlock()
	return lim.Allow()
}

func (s xrateMapStore) verify(f *fixture) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if got, want := len(s.m), len(f.keys); got != want {
		return fmt.Errorf("len(map) = %d, want %d", got, want)
	}
	return nil
}

func (s xrateMapStore) close() {}

// golimiter: sethvargo/go-limiter's memorystore Take.
type golimiterStore struct{ s limiter.Store }

var golimiterImpl = impl[golimiterStore]{
	name: "golimiter",
	build: func(f *fixture) (golimiterStore, error) {
		st, err := memorystore.New(&memorystore.Config{
			Tokens:        benchBurst,
			Interval:      golimiterInterval,
			SweepInterval: golimiterSweep,
			SweepMinTTL:   golimiterSweep,
		})
		if err != nil {
			return golimiterStore{}, err
		}
		s := golimiterStore{st}
		if err := prewarm(s, f); err != nil {
			s.close()
			return s, err
		}
		return s, nil
	},
}

func (s golimiterStore) take(key string) bool {
	_, _, _, ok, err := s.s.Take(context.Background(), key)
	return err == nil && ok
}

// verify asks for every key with Get, which reports a zero limit for a key the
// store does not hold.
func (s golimiterStore) verify(f *fixture) error {
	ctx := context.Background()
	for _, k := range f.keys {
		tokens, _, err := s.s.Get(ctx, k)
		if err != nil {
			return fmt.Errorf("Get(%q): %v", k, err)
		}
		if tokens != benchBurst {
			return fmt.Errorf("Get(%q) = %d tokens, want %d: key not held", k, tokens, benchBurst)
		}
	}
	return nil
}

func (s golimiterStore) close() { s.s.Close(context.Background()) }

// prewarm takes every key of f once, in key order.
func prewarm[S store](s S, f *fixture) error {
	for _, k := range f.keys {
		if !s.take(k) {
			return fmt.Errorf("pre-warm take of %q rejected", k)
		}
	}
	return nil
}
