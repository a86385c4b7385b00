package bench

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-go/floodgate/bench/internal/peers"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/tenant"
)

// A whole unary gRPC call, grpc-go client to grpc-go server over loopback
// TCP, with and without admission control in front of a handler that does
// nothing: what a user pays per call for the interceptors, measured where
// it is felt. Every call is admitted (the limits are never reached).

type stockServer struct {
	inventoryv1.UnimplementedInventoryServer
}

func (stockServer) GetStock(context.Context, *inventoryv1.GetStockRequest) (*inventoryv1.GetStockResponse, error) {
	return &inventoryv1.GetStockResponse{}, nil
}

// callVariants are the server setups of BenchmarkUnaryCall.
var callVariants = []struct {
	name string
	opts func(b *testing.B) []grpc.ServerOption
}{
	{"none", func(*testing.B) []grpc.ServerOption { return nil }},
	{"floodgate", func(b *testing.B) []grpc.ServerOption {
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(floodgateInterceptor(b, 1e9, 1e6))}
	}},
	{"floodgate+overload", func(b *testing.B) []grpc.ServerOption {
		c, err := overload.New()
		if err != nil {
			b.Fatal(err)
		}
		tbl, err := tenant.Compile(&tenant.Config{Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e6}}})
		if err != nil {
			b.Fatal(err)
		}
		store, err := keyed.New()
		if err != nil {
			b.Fatal(err)
		}
		l, err := middleware.New(store, middleware.Static(tbl), middleware.WithOverload(c))
		if err != nil {
			b.Fatal(err)
		}
		return []grpc.ServerOption{grpc.InTapHandle(l.TapHandle), grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor())}
	}},
	{"ratelimit", func(*testing.B) []grpc.ServerOption {
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(peers.RatelimitInterceptor(1e9, 1e6))}
	}},
}

// startInventory serves stockServer with opts on a loopback port and
// returns a client connected to it; both stop when the benchmark ends.
func startInventory(b *testing.B, opts []grpc.ServerOption) inventoryv1.InventoryClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	inventoryv1.RegisterInventoryServer(srv, stockServer{})
	go srv.Serve(lis)
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return inventoryv1.NewInventoryClient(conn)
}

// BenchmarkUnaryCall times one GetStock call end to end. Serial: one caller,
// the call's latency. Parallel: 8×GOMAXPROCS callers on one connection, the
// server's throughput (ns/op is wall time per call).
func BenchmarkUnaryCall(b *testing.B) {
	for _, v := range callVariants {
		b.Run("mode=serial/impl="+v.name, func(b *testing.B) {
			client := startInventory(b, v.opts(b))
			ctx := context.Background()
			req := &inventoryv1.GetStockRequest{Sku: "sku-1"}
			for b.Loop() {
				if _, err := client.GetStock(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("mode=parallel/impl="+v.name, func(b *testing.B) {
			client := startInventory(b, v.opts(b))
			req := &inventoryv1.GetStockRequest{Sku: "sku-1"}
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := client.GetStock(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
