package middleware_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// TestResolvedOnce counts the resolutions of a call (identity, tenant,
// route, priority) through a server with ServerOptions: one per admitted
// call, and one per stream, with and without an overload controller, so
// that the interceptor never resolves again what the tap handle resolved.
func TestResolvedOnce(t *testing.T) {
	var n atomic.Int64
	middleware.CountResolves(t, &n)
	for _, tc := range []struct {
		name string
		ctl  bool
	}{{"quota", false}, {"quota and overload controller", true}} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := keyed.New()
			if err != nil {
				t.Fatal(err)
			}
			var opts []middleware.Option
			if tc.ctl {
				ctrl, err := overload.New()
				if err != nil {
					t.Fatal(err)
				}
				opts = append(opts, middleware.WithOverload(ctrl))
			}
			tbl, err := tenant.Compile(&tenant.Config{
				Tenants:   map[string]tenant.TenantSpec{"acme": {Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, Keys: []string{hashKey(t, acmeKey)}}},
				Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}},
			})
			if err != nil {
				t.Fatal(err)
			}
			l, err := middleware.New(store, middleware.Static(tbl), opts...)
			if err != nil {
				t.Fatal(err)
			}
			cc, _ := serve(t, networks[0], l.ServerOptions())
			for _, caller := range []struct {
				name string
				ctx  context.Context
			}{
				{"anonymous", context.Background()},
				{"api key", metadata.AppendToOutgoingContext(context.Background(), "x-api-key", acmeKey)},
			} {
				// The first call of a key hashes it in the interceptor: the
				// tap handle resolves only keys it has seen.
				if err := invoke(caller.ctx, cc); err != nil {
					t.Fatal(err)
				}
				const calls = 5
				n.Store(0)
				for range calls {
					if err := invoke(caller.ctx, cc); err != nil {
						t.Fatal(err)
					}
				}
				if got := n.Load(); got != calls {
					t.Errorf("%s: %d resolutions for %d unary calls, want %d", caller.name, got, calls, calls)
				}
				n.Store(0)
				for range calls {
					chat(t, caller.ctx, cc, 3)
				}
				if got := n.Load(); got != calls {
					t.Errorf("%s: %d resolutions for %d streams of 3 messages, want %d", caller.name, got, calls, calls)
				}
			}
		})
	}
}

// chat runs one echo stream of msgs messages to its end.
func chat(t *testing.T, ctx context.Context, cc *grpc.ClientConn, msgs int) {
	t.Helper()
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, echoChat)
	if err != nil {
		t.Fatal(err)
	}
	for range msgs {
		if err := cs.SendMsg(&emptypb.Empty{}); err != nil {
			t.Fatal(err)
		}
		if err := cs.RecvMsg(new(emptypb.Empty)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(emptypb.Empty)); err != io.EOF {
		t.Fatalf("stream end: %v, want EOF", err)
	}
}
