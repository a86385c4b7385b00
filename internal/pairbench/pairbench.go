// Package pairbench measures what an addition to a gRPC interceptor
// costs, for the metric exporters' benchmarks: by pairs of blocks of calls
// without and with it, so that both see the same machine.
package pairbench

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
)

// Interceptor returns the unary interceptor of a Limiter over a new
// in-memory store, the tables and opts.
func Interceptor(b testing.TB, tables middleware.Tables, opts ...middleware.Option) grpc.UnaryServerInterceptor {
	b.Helper()
	store, err := keyed.New()
	if err != nil {
		b.Fatal(err)
	}
	lim, err := middleware.New(store, tables, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return lim.UnaryServerInterceptor()
}

// block is the number of calls timed at once.
const block = 256

// Overhead runs b's loop through without and with, alternating blocks of
// calls (which goes first alternates too), and reports the median over the
// pairs of the difference per call as overhead-ns/op: a median is not moved
// by the few blocks a busy machine interrupts. ns/op is a pair of calls.
func Overhead(b *testing.B, without, with grpc.UnaryServerInterceptor, ctx context.Context, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) {
	icpt := [2]grpc.UnaryServerInterceptor{without, with}
	for _, i := range icpt {
		if _, err := i(ctx, nil, info, h); err != nil {
			b.Fatalf("the call to measure is rejected: %v", err)
		}
	}
	var total [2]time.Duration
	var diffs []float64
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	calls := 0
	b.ReportAllocs()
	for b.Loop() {
		if calls%block == 0 {
			var took [2]time.Duration
			first := len(diffs) % 2
			for _, i := range [2]int{first, 1 - first} {
				start := time.Now()
				for range block {
					sink, _ = icpt[i](ctx, nil, info, h)
				}
				took[i] = time.Since(start)
				total[i] += took[i]
			}
			diffs = append(diffs, float64(took[1]-took[0])/block)
		}
		calls++
	}
	slices.Sort(diffs)
	n := float64(len(diffs) * block)
	b.ReportMetric(diffs[len(diffs)/2], "overhead-ns/op")
	b.ReportMetric(float64(total[0])/n, "without-ns/op")
	b.ReportMetric(float64(total[1])/n, "with-ns/op")
}

// sink keeps the calls' results alive.
var sink any
