package promfloodgate

import (
	"testing"

	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
)

var sink any

// BenchmarkUnaryAccepted is the middleware's accepted path, an API-key
// tenant admitted, without and with the collector's observer.
func BenchmarkUnaryAccepted(b *testing.B) {
	for _, bc := range []struct {
		name     string
		observer bool
	}{{"without-observer", false}, {"with-observer", true}} {
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
