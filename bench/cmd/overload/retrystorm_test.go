package main

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/throttle"
)

func TestCallNaive(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "shed")
	for _, c := range []struct {
		name     string
		err      error
		deadline time.Duration
		want     int
	}{
		{"served", nil, time.Minute, 1},
		{"unavailable", unavailable, time.Minute, naiveAttempts},
		{"resource exhausted", status.Error(codes.ResourceExhausted, "quota"), time.Minute, naiveAttempts},
		{"not an overload", status.Error(codes.InvalidArgument, "bad"), time.Minute, 1},
		// No room left for the shortest backoff: no retry.
		{"deadline too close", unavailable, naiveBackoffMin / 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
			defer cancel()
			n := 0
			err := callNaive(ctx, func(context.Context) error { n++; return c.err })
			if n != c.want || !errors.Is(err, c.err) {
				t.Errorf("callNaive made %d attempts and returned %v, want %d and %v", n, err, c.want, c.err)
			}
		})
	}
}

func TestWireInterceptor(t *testing.T) {
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		return status.Error(codes.Unavailable, "shed")
	}
	var recorded []error
	tr := &wireTrace{record: func(_ time.Time, err error) { recorded = append(recorded, err) }}
	ctx := context.WithValue(context.Background(), wireKey{}, tr)
	for range 2 {
		if err := wireInterceptor(ctx, "/m", nil, nil, nil, invoker); status.Code(err) != codes.Unavailable {
			t.Fatalf("wireInterceptor(…) = %v, want the invoker's Unavailable", err)
		}
	}
	if got, want := tr.tries, 2; got != want || len(recorded) != want {
		t.Errorf("tries = %d, %d recorded, want %d", got, len(recorded), want)
	}
	// A call without a trace passes untouched.
	if err := wireInterceptor(context.Background(), "/m", nil, nil, nil, invoker); status.Code(err) != codes.Unavailable || len(recorded) != 2 {
		t.Errorf("untraced call: %v, %d recorded", err, len(recorded))
	}
}

// shedInventory rejects every Allocate as an overloaded server would.
type shedInventory struct {
	inventoryv1.UnimplementedInventoryServer
}

func (shedInventory) Allocate(context.Context, *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	return nil, status.Error(codes.Unavailable, "shed")
}

// TestClientModesLoopback sends calls over loopback TCP to a server that
// rejects them all, as the retry storm's naive and throttled clients do,
// and counts their attempts on the wire.
func TestClientModesLoopback(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	inventoryv1.RegisterInventoryServer(srv, shedInventory{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	c := &client{}
	t.Cleanup(c.close)
	c.conns[0], err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(wireInterceptor))
	if err != nil {
		t.Fatal(err)
	}
	// dialThrottled warms its connections up with health checks, which
	// this server does not serve: build the throttled one by hand, with a
	// short backoff, since the rejections carry no RetryInfo.
	th, err := throttle.New(throttle.WithRetries(naiveAttempts), throttle.WithBackoff(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	c.throttled[0], err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(th.UnaryClientInterceptor(), wireInterceptor))
	if err != nil {
		t.Fatal(err)
	}
	req := &inventoryv1.AllocateRequest{Sku: "sku-00001", Quantity: 1}
	call := func(conn *grpc.ClientConn, naive bool) (tries, recorded int, err error) {
		tr := &wireTrace{record: func(time.Time, error) { recorded++ }}
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), wireKey{}, tr), 5*time.Second)
		defer cancel()
		inv := inventoryv1.NewInventoryClient(conn)
		if naive {
			err = callNaive(ctx, func(ctx context.Context) error { _, err := inv.Allocate(ctx, req); return err })
		} else {
			_, err = inv.Allocate(ctx, req)
		}
		return tr.tries, recorded, err
	}

	if tries, rec, err := call(c.conns[0], false); tries != 1 || rec != 1 || status.Code(err) != codes.Unavailable {
		t.Errorf("one attempt: %d tries, %d recorded, %v; want 1, 1, Unavailable", tries, rec, err)
	}
	if tries, rec, err := call(c.conns[0], true); tries != naiveAttempts || rec != naiveAttempts || status.Code(err) != codes.Unavailable {
		t.Errorf("naive: %d tries, %d recorded, %v; want %d, %d, Unavailable", tries, rec, err, naiveAttempts, naiveAttempts)
	}
	// Against a server that accepts nothing, the throttle soon drops
	// calls on the client: those never reach the wire interceptor.
	dropped := 0
	for i := range 40 {
		tries, rec, err := call(c.throttled[0], false)
		if tries > naiveAttempts || rec != tries || status.Code(err) != codes.Unavailable {
			t.Fatalf("throttled call %d: %d tries, %d recorded, %v; want at most %d, as many recorded, Unavailable", i, tries, rec, err, naiveAttempts)
		}
		if errors.Is(err, throttle.ErrThrottled) {
			dropped++
		}
	}
	if dropped == 0 {
		t.Error("the throttle dropped none of 40 calls to a server that rejects them all")
	}
}

// TestRetryStormQuick runs the retry storm's quick version against E over
// loopback, unpinned and outside any cgroup. The capacity is given, and
// low, so that E's quotas reject the heavy tenant (it sends twice its
// quota at 3×) however fast the machine is: the naive clients must retry.
// It asserts no timings.
func TestRetryStormQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server for about 5 s")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Config{
		Quick: true, Cost: time.Millisecond, Deadline: 500 * time.Millisecond, SLO: 100 * time.Millisecond,
		Variants: []string{targetVariant}, Scenarios: []string{retryStorm}, Capacity: 60,
		Seed: 1, Exe: []string{exe}, Log: t.Logf,
	}
	res, err := experiment(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 1 || len(res.RejCosts) != 0 {
		t.Fatalf("%d runs and %d rejection costs, want the retry storm alone", len(res.Runs), len(res.RejCosts))
	}
	r := &res.Runs[0]
	if !r.Wire {
		t.Error("the retry storm's run did not count its attempts on the wire")
	}
	for _, name := range []string{stormBaseline, clientNaive, clientThrottled, "all"} {
		w := r.window(name)
		if w == nil {
			t.Fatalf("no window %q", name)
		}
		if w.Sent <= 0 || w.Wire <= 0 || w.WireRejected > w.Wire {
			t.Errorf("%s: sent %.0f/s, on the wire %.0f/s, of which rejected %.0f/s", name, w.Sent, w.Wire, w.WireRejected)
		}
		if name != clientThrottled && name != "all" && w.Dropped != 0 {
			t.Errorf("%s: %.0f/s dropped on the client without a throttle", name, w.Dropped)
		}
	}
	if w := r.window(clientNaive); w.Rejected <= 0 || w.Wire <= w.Sent {
		t.Errorf("naive: %.0f/s rejected, %.0f/s on the wire for %.0f/s sent: no retries", w.Rejected, w.Wire, w.Sent)
	}

	report, _ := renderReport(t, res)
	for _, want := range []string{"## Retry storm", "| E | naive: ", "| retry storm at 3×, throttled clients |"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(report, "NaN") {
		t.Error("the report shows NaN")
	}
}
