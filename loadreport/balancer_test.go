package loadreport_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/floodgate-go/floodgate/loadreport"
	"github.com/floodgate-go/floodgate/middleware"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// pooled is an inventory service whose Allocate holds one of a few
// connections of a pool for hold: its capacity is the pool over the hold,
// whatever the CPU does.
type pooled struct {
	inventoryv1.UnimplementedInventoryServer
	pool chan struct{}
	hold time.Duration
}

func (s *pooled) Allocate(ctx context.Context, _ *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	select {
	case s.pool <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	time.Sleep(s.hold)
	<-s.pool
	return &inventoryv1.AllocateResponse{}, nil
}

// replica starts a server of a pool of n behind the overload controller and
// its load reports, and returns its address.
func replica(t *testing.T, n int) string {
	t.Helper()
	lim, err := middleware.NewOverload()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := loadreport.New(lim.Overload())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(lim.ServerOptions(), rep.ServerOptions()...)...)
	inventoryv1.RegisterInventoryServer(srv, &pooled{pool: make(chan struct{}, n), hold: 2 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// TestBalancerFollowsReports runs grpc-go's weighted_round_robin, with
// ServiceConfig, over two replicas, one with an eighth of the other's
// capacity, under more calls than the weak one completes. Round robin
// would send it half of them; fed by the reports, the balancer sends it
// about its share of the capacity.
func TestBalancerFollowsReports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 12 s")
	}
	strong, weak := replica(t, 8), replica(t, 1)
	r := manual.NewBuilderWithScheme("fleet")
	r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{
		{Addresses: []resolver.Address{{Addr: strong}}},
		{Addresses: []resolver.Address{{Addr: weak}}},
	}})
	cc, err := grpc.NewClient("fleet:///inventory",
		grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(loadreport.ServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := inventoryv1.NewInventoryClient(cc)

	// 12 callers back to back: more than the weak replica's one
	// connection, less than both replicas' nine. The calls are counted in
	// windows of 2 s from 4 s on (past the balancer's blackout), and the
	// test passes if in any window the weak replica's share is near its
	// share of the capacity, not round robin's: on a loaded machine the
	// weights take a window or two longer to settle.
	const measureFrom, window, end = 4 * time.Second, 2 * time.Second, 12 * time.Second
	start := time.Now()
	var mu sync.Mutex
	picks := make([]map[string]int, int((end-measureFrom)/window))
	for i := range picks {
		picks[i] = map[string]int{}
	}
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < end {
				var p peer.Peer
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				client.Allocate(ctx, &inventoryv1.AllocateRequest{}, grpc.Peer(&p))
				cancel()
				if at := time.Since(start); p.Addr != nil && at >= measureFrom && at < end {
					mu.Lock()
					picks[int((at-measureFrom)/window)][p.Addr.String()]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	// Its capacity is a ninth of the fleet's: round robin's half would be
	// more than four times that.
	const most = 0.25
	share := 1.0
	for i, w := range picks {
		total := w[strong] + w[weak]
		if total < 100 {
			t.Fatalf("only %d calls in window %d: %v", total, i, w)
		}
		share = float64(w[weak]) / float64(total)
		t.Logf("window %d: weak replica's share of calls: %.3f (%v)", i, share, w)
		if share <= most {
			break
		}
	}
	if share > most {
		t.Errorf("the weak replica got %.0f%% of the calls in every window, want its share of the capacity (11%%), well under round robin's 50%%", 100*share)
	}
}
