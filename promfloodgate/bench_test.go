package promfloodgate

import (
	"testing"

	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate/internal/pairbench"
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
	c, err := New(WithMethods(methodGet, methodSecret))
	if err != nil {
		b.Fatal(err)
	}
	without, with := pairbench.Interceptor(b, middleware.Static(testTable(b))), pairbench.Interceptor(b, middleware.Static(testTable(b)), middleware.WithObserver(c.Observer()))
	ctx := callCtx(proKey)
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	pairbench.Overhead(b, without, with, ctx, info, noop)
}

// BenchmarkObserver is the observer alone on an accepted event.
func BenchmarkObserver(b *testing.B) {
	c, err := New(WithMethods(methodGet, methodSecret))
	if err != nil {
		b.Fatal(err)
	}
	obs := c.Observer()
	e := middleware.Event{Decision: middleware.Decision{Tier: "pro", Allowed: true}, Method: methodGet}
	b.ReportAllocs()
	for b.Loop() {
		obs(e)
	}
}
