package promfloodgate

import (
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
)

var sink any

// BenchmarkUnaryAccepted is the middleware's accepted path, an API-key
// tenant admitted, without and with the collector's observer, and without it
// again: the two baselines show how far the machine drifted during the run.
func BenchmarkUnaryAccepted(b *testing.B) {
	for _, bc := range []struct {
		name     string
		observer bool
	}{{"without-observer", false}, {"with-observer", true}, {"without-observer-again", false}} {
		b.Run(bc.name, func(b *testing.B) {
			store, err := keyed.New()
			if err != nil {
				b.Fatal(err)
			}
			var opts []middleware.Option
			if bc.observer {
				c, err := New(WithMethods(methodGet, methodSecret))
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, middleware.WithObserver(c.Observer()))
			}
			lim, err := middleware.New(store, middleware.Static(testTable(b)), opts...)
			if err != nil {
				b.Fatal(err)
			}
			icpt := lim.UnaryServerInterceptor()
			ctx := callCtx(proKey)
			info := &grpc.UnaryServerInfo{FullMethod: methodGet}
			if _, err := icpt(ctx, nil, info, noop); err != nil {
				b.Fatalf("fixture rejects: %v", err)
			}
			b.ReportAllocs()
			for b.Loop() {
				sink, _ = icpt(ctx, nil, info, noop)
			}
		})
	}
}

// BenchmarkObserverOverhead measures the observer's cost on the accepted path
// by pairs: it alternates blocks of calls through the interceptor without and
// with the observer, so that both see the same machine, and reports the
// difference of the two means as overhead-ns/op (ns/op is a pair of calls).
// On Linux it also reports the difference in the thread's CPU time as
// overhead-cpu-ns/op, which a busy machine disturbs less: the thread is
// locked, and the time it waits for a core is not counted.
func BenchmarkObserverOverhead(b *testing.B) {
	build := func(opts ...middleware.Option) grpc.UnaryServerInterceptor {
		store, err := keyed.New()
		if err != nil {
			b.Fatal(err)
		}
		lim, err := middleware.New(store, middleware.Static(testTable(b)), opts...)
		if err != nil {
			b.Fatal(err)
		}
		return lim.UnaryServerInterceptor()
	}
	c, err := New(WithMethods(methodGet, methodSecret))
	if err != nil {
		b.Fatal(err)
	}
	without, with := build(), build(middleware.WithObserver(c.Observer()))
	ctx := callCtx(proKey)
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	const block = 256
	var tWithout, tWith, cWithout, cWith time.Duration
	_, cpuOK := threadCPU()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	calls := 0
	b.ReportAllocs()
	for b.Loop() {
		if calls%block == 0 {
			c0, _ := threadCPU()
			start := time.Now()
			for range block {
				sink, _ = without(ctx, nil, info, noop)
			}
			mid := time.Now()
			c1, _ := threadCPU()
			for range block {
				sink, _ = with(ctx, nil, info, noop)
			}
			tWithout += mid.Sub(start)
			tWith += time.Since(mid)
			c2, _ := threadCPU()
			cWithout += c1 - c0
			cWith += c2 - c1
		}
		calls++
	}
	blocks := (calls + block - 1) / block
	n := float64(blocks * block)
	b.ReportMetric(float64(tWith-tWithout)/n, "overhead-ns/op")
	b.ReportMetric(float64(tWithout)/n, "without-ns/op")
	b.ReportMetric(float64(tWith)/n, "with-ns/op")
	if cpuOK {
		b.ReportMetric(float64(cWith-cWithout)/n, "overhead-cpu-ns/op")
	}
}

// BenchmarkObserver is the observer alone on an accepted event.
func BenchmarkObserver(b *testing.B) {
	c, err := New(WithMethods(methodGet, methodSecret))
	if err != nil {
		b.Fatal(err)
	}
	obs := c.Observer()
	e := middleware.Event{Method: methodGet, Tier: "pro", Allowed: true}
	b.ReportAllocs()
	for b.Loop() {
		obs(e)
	}
}
