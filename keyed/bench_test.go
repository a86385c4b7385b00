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

// benchLimit never runs dry, so every take runs the whole accept path.
var benchLimit = floodgate.PerSecond(1e9, 1_000_000)

// filled returns a Map holding n keys, each taken once, and the keys.
func filled(b *testing.B, n int) (*Map, []string) {
	b.Helper()
	m, err := New(WithCapacity(n))
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
		m.TakeN(context.Background(), keys[i], benchLimit, 1)
	}
	if m.Len() != n {
		b.Fatalf("Len() = %d, want %d", m.Len(), n)
	}
	return m, keys
}

// scrambled returns 2^20 indexes below n in a fixed pseudo-random order
// (xorshift), so that takes do not walk the table in order.
func scrambled(n int) []uint32 {
	order := make([]uint32, 1<<20)
	x := uint64(88172645463325252)
	for i := range order {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		order[i] = uint32(x % uint64(n))
	}
	return order
}

var benchKeys = []int{1_000, 100_000, 1_000_000}

func BenchmarkTakeN(b *testing.B) {
	for _, n := range benchKeys {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			m, keys := filled(b, n)
			ctx := context.Background()
			order := scrambled(n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m.TakeN(ctx, keys[order[i&(len(order)-1)]], benchLimit, 1)
			}
		})
	}
}

// BenchmarkReserveSettle is a reservation of 5 tokens settled at 3 (a
// refund), on the keys of BenchmarkTakeN: run both in one go to compare a
// take of a known cost with one whose cost is known after the call.
func BenchmarkReserveSettle(b *testing.B) {
	for _, n := range benchKeys {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			m, keys := filled(b, n)
			ctx := context.Background()
			order := scrambled(n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key := keys[order[i&(len(order)-1)]]
				r, _ := m.ReserveN(ctx, key, benchLimit, 5)
				if !r.Result.Allowed {
					b.Fatal("reservation refused: the benchmark measures the accept path")
				}
				r.Settle(ctx, 3)
			}
		})
	}
}

// BenchmarkTakeNParallel: run with -cpu 1,2 to see how takes scale across
// cores when each goroutine has keys of its own (no bucket is shared, but
// two slots share a cache line, so neighbouring keys of two goroutines can).
func BenchmarkTakeNParallel(b *testing.B) {
	const n = 1 << 16
	m, keys := filled(b, n)
	ctx := context.Background()
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
			m.TakeN(ctx, keys[int(i>>16)&^63|g&63], benchLimit, 1)
		}
	})
}
