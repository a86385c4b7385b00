package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/internal/burn"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

const (
	// defaultWatchInterval is WatchStock's least time between updates when
	// the caller asks for none; minWatchInterval is the least it grants.
	defaultWatchInterval = time.Second
	minWatchInterval     = 100 * time.Millisecond
)

// inventory implements inventoryv1.InventoryServer in memory, over a fixed
// catalogue of SKUs. Allocate spends a configurable amount of CPU, the
// service's cost that overload control protects; GetStock and WatchStock are
// cheap. It is safe for concurrent use; each SKU has its own lock.
type inventory struct {
	inventoryv1.UnimplementedInventoryServer
	burner *burn.Burner
	cost   time.Duration
	skus   map[string]*stock
	quit   chan struct{} // closed when the server shuts down
	once   sync.Once
}

// stock is one SKU's level. changed is closed and replaced at every change,
// which wakes every watcher at once without a list of them.
type stock struct {
	mu                   sync.Mutex
	sku                  string
	available, allocated int64
	version              uint64
	changed              chan struct{}
}

// skuNames returns the catalogue's SKU names: sku-00000, sku-00001, …
func skuNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("sku-%05d", i)
	}
	return names
}

// newInventory returns an inventory of the given SKUs, each with units in
// stock, whose allocations each burn cost of CPU time with b (package burn,
// shared with the overload experiment); a nil b is calibrated here.
// burner is the calibrated CPU loop an Allocate spends its cost in.
type burner = burn.Burner

func newInventory(skus []string, units int64, cost time.Duration, b *burner) *inventory {
	if b == nil {
		b = burn.Calibrate()
	}
	inv := &inventory{burner: b, cost: cost, skus: make(map[string]*stock, len(skus)), quit: make(chan struct{})}
	for _, s := range skus {
		inv.skus[s] = &stock{sku: s, available: units, changed: make(chan struct{})}
	}
	return inv
}

// register registers inv on srv, with health checks (SERVING until the
// returned server's Shutdown) and reflection.
func register(srv *grpc.Server, inv *inventory) *health.Server {
	inventoryv1.RegisterInventoryServer(srv, inv)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(inventoryv1.Inventory_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	return h
}

// stop ends every WatchStock stream, so a graceful stop need not wait for
// watchers that would never leave on their own. It is idempotent.
func (inv *inventory) stop() { inv.once.Do(func() { close(inv.quit) }) }

func (inv *inventory) lookup(sku string) (*stock, error) {
	if sku == "" {
		return nil, status.Error(codes.InvalidArgument, "sku is empty")
	}
	st, ok := inv.skus[sku]
	if !ok {
		return nil, status.Error(codes.NotFound, "unknown sku")
	}
	return st, nil
}

func (inv *inventory) Allocate(ctx context.Context, req *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	if req.GetQuantity() < 1 {
		return nil, status.Error(codes.InvalidArgument, "quantity must be at least 1")
	}
	st, err := inv.lookup(req.GetSku())
	if err != nil {
		return nil, err
	}
	// The work happens outside the lock, as a real service would price and
	// validate an order before touching shared state. It stops when the
	// caller has gone: a call admitted, then delayed past its deadline by a
	// queue, must not spend the CPU that calls still in time need.
	if err := inv.burner.Burn(ctx, inv.cost); err != nil {
		return nil, status.FromContextError(err).Err()
	}

	st.mu.Lock()
	defer st.mu.Unlock()
	if st.available < req.GetQuantity() {
		return nil, status.Error(codes.FailedPrecondition, "insufficient stock")
	}
	st.available -= req.GetQuantity()
	st.allocated += req.GetQuantity()
	st.version++
	close(st.changed)
	st.changed = make(chan struct{})
	return &inventoryv1.AllocateResponse{
		AllocationId: st.sku + "-" + strconv.FormatUint(st.version, 10),
		Level:        st.levelLocked(),
	}, nil
}

func (inv *inventory) GetStock(_ context.Context, req *inventoryv1.GetStockRequest) (*inventoryv1.GetStockResponse, error) {
	st, err := inv.lookup(req.GetSku())
	if err != nil {
		return nil, err
	}
	level, _ := st.snapshot()
	return &inventoryv1.GetStockResponse{Level: level}, nil
}

func (inv *inventory) WatchStock(req *inventoryv1.WatchStockRequest, stream inventoryv1.Inventory_WatchStockServer) error {
	st, err := inv.lookup(req.GetSku())
	if err != nil {
		return err
	}
	interval := defaultWatchInterval
	if ms := req.GetMinIntervalMs(); ms > 0 {
		interval = max(time.Duration(ms)*time.Millisecond, minWatchInterval)
	}
	ctx := stream.Context()
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		level, changed := st.snapshot()
		if err := stream.Send(level); err != nil {
			return err
		}
		sent := time.Now()
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-inv.quit:
			return status.Error(codes.Unavailable, "server shutting down")
		case <-changed:
		}
		// Changes during the wait are coalesced into the next update.
		if wait := interval - time.Since(sent); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			case <-inv.quit:
				return status.Error(codes.Unavailable, "server shutting down")
			case <-timer.C:
			}
		}
	}
}

// snapshot returns the level and the channel that closes at its next change.
func (st *stock) snapshot() (*inventoryv1.StockLevel, <-chan struct{}) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.levelLocked(), st.changed
}

func (st *stock) levelLocked() *inventoryv1.StockLevel {
	return &inventoryv1.StockLevel{Sku: st.sku, Available: st.available, Allocated: st.allocated, Version: st.version}
}
