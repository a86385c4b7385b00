package redisstore_test

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/redisstore"
)

// BenchmarkTakeN and BenchmarkReserveSettle run in one go compare a take
// of a known cost (one round trip) with a reservation settled after the
// call (two), on Redis, one call at a time and batched under 16 callers.
// benchLimit never runs dry, so every call is an admission.
var benchLimit = floodgate.PerSecond(1e9, 1e9)

// benchStore returns the store of both benchmarks, over 1000 keys that
// each hold a bucket already.
func benchStore(b *testing.B, batched bool) (*redisstore.Store, []string) {
	b.Helper()
	srv := sharedServer(b)
	var opts []redisstore.Option
	if batched {
		opts = append(opts, redisstore.WithBatching(256))
	}
	s := newStore(b, newClient(b, srv.Addr), opts...)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
		if res, err := s.TakeN(bg, keys[i], benchLimit, 1); err != nil || res.Source != floodgate.SourceRedis {
			b.Fatalf("TakeN(%s) = %+v, %v", keys[i], res, err)
		}
	}
	return s, keys
}

func benchDecisions(b *testing.B, decide func(s *redisstore.Store, key string)) {
	for _, batched := range []bool{false, true} {
		name := "single"
		if batched {
			name = "batched"
		}
		b.Run(name, func(b *testing.B) {
			s, keys := benchStore(b, batched)
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			if batched {
				b.SetParallelism(16)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						decide(s, keys[next.Add(1)%int64(len(keys))])
					}
				})
				return
			}
			for i := 0; b.Loop(); i++ {
				decide(s, keys[i%len(keys)])
			}
		})
	}
}

func BenchmarkTakeN(b *testing.B) {
	benchDecisions(b, func(s *redisstore.Store, key string) {
		if res, _ := s.TakeN(bg, key, benchLimit, 1); !res.Allowed {
			b.Error("take refused")
		}
	})
}

// BenchmarkReserveSettle reserves 5 tokens and settles 3 (a refund).
func BenchmarkReserveSettle(b *testing.B) {
	benchDecisions(b, func(s *redisstore.Store, key string) {
		r, _ := s.ReserveN(bg, key, benchLimit, 5)
		if !r.Result.Allowed {
			b.Error("reservation refused")
		}
		r.Settle(bg, 3)
	})
}
