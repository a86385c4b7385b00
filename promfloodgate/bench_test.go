package promfloodgate

import (
	"runtime"
	"slices"
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
// with the observer (which goes first alternates too), so that both see the
// same machine. It reports the median over the pairs of the difference per
// call as overhead-ns/op; a median is not moved by the few blocks a busy
// machine interrupts, which a mean is. ns/op is a pair of calls.
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
	icpt := [2]grpc.UnaryServerInterceptor{build(), build(middleware.WithObserver(c.Observer()))}
	ctx := callCtx(proKey)
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	const block = 256
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
					sink, _ = icpt[i](ctx, nil, info, noop)
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
