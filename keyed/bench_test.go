package keyed

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/floodgate-go/floodgate"
)

// The side-by-side comparison with other libraries lives in the bench
// module; these track the Map alone.
func BenchmarkTakeN(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			m, err := New(WithCapacity(n))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			lim := floodgate.PerSecond(1e9, 1_000_000)
			keys := make([]string, n)
			for i := range keys {
				keys[i] = "client-" + strconv.Itoa(i)
				m.TakeN(ctx, keys[i], lim, 1)
			}
			if m.Len() != n {
				b.Fatalf("Len() = %d, want %d", m.Len(), n)
			}
			order := make([]uint32, 1<<20)
			x := uint64(88172645463325252)
			for i := range order {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				order[i] = uint32(x % uint64(n))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m.TakeN(ctx, keys[order[i&(len(order)-1)]], lim, 1)
			}
		})
	}
}

// BenchmarkTakeNParallel: run with -cpu 1,2 to see how takes scale across
// cores when each goroutine has keys of its own (no bucket is shared; the
// shard locks are).
func BenchmarkTakeNParallel(b *testing.B) {
	const n = 1 << 16
	m, err := New(WithCapacity(n))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	lim := floodgate.PerSecond(1e9, 1_000_000)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
		m.TakeN(ctx, keys[i], lim, 1)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Goroutine g walks its own residue class modulo 64 in a
		// scrambled order.
		g := int(next.Add(1) - 1)
		i := uint32(g)
		for pb.Next() {
			i = i*1664525 + 1013904223
			m.TakeN(ctx, keys[int(i>>16)&^63|g&63], lim, 1)
		}
	})
}
