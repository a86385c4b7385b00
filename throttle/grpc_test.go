package throttle_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/throttle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend is an inventory server over loopback TCP that answers each call
// with the next error of its script (nil: success), repeating the last.
type backend struct {
	inventoryv1.UnimplementedInventoryServer
	calls  atomic.Int64
	script []error
}

func (b *backend) next() error {
	n := int(b.calls.Add(1)) - 1
	return b.script[min(n, len(b.script)-1)]
}

func (b *backend) GetStock(context.Context, *inventoryv1.GetStockRequest) (*inventoryv1.GetStockResponse, error) {
	if err := b.next(); err != nil {
		return nil, err
	}
	return &inventoryv1.GetStockResponse{}, nil
}

func (b *backend) WatchStock(_ *inventoryv1.WatchStockRequest, s grpc.ServerStreamingServer[inventoryv1.StockLevel]) error {
	if err := b.next(); err != nil {
		return err
	}
	return s.Send(&inventoryv1.StockLevel{})
}

func overloaded(retryAfter time.Duration) error {
	st, err := status.New(codes.Unavailable, "overloaded").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// dial serves b on a loopback port and returns a client whose calls go
// through th's interceptors, and the client's target.
func dial(t *testing.T, b *backend, th *throttle.Throttle) (inventoryv1.InventoryClient, string) {
	t.Helper()
	return connect(t, b, grpc.WithChainUnaryInterceptor(th.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(th.StreamClientInterceptor()))
}

// connect serves b on a loopback port and returns a client dialled with
// opts, and the client's target.
func connect(t *testing.T, b *backend, opts ...grpc.DialOption) (inventoryv1.InventoryClient, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	inventoryv1.RegisterInventoryServer(srv, b)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return inventoryv1.NewInventoryClient(conn), lis.Addr().String()
}

func TestUnaryThrottlesRejectingBackend(t *testing.T) {
	b := &backend{script: []error{overloaded(time.Millisecond)}}
	th, err := throttle.New(throttle.WithRand(fixed(0.5)))
	if err != nil {
		t.Fatal(err)
	}
	client, _ := dial(t, b, th)
	var throttled, rejected int
	for range 100 {
		_, err := client.GetStock(context.Background(), &inventoryv1.GetStockRequest{})
		switch {
		case errors.Is(err, throttle.ErrThrottled):
			throttled++
		case status.Code(err) == codes.Unavailable:
			rejected++
		default:
			t.Fatalf("GetStock() = %v, want Unavailable", err)
		}
	}
	// With nothing accepted and every draw 0.5, the throttle drops a call
	// once (requests − 0)/(requests + 1) > 0.5: from the third call on.
	if got, want := b.calls.Load(), int64(2); got != want {
		t.Errorf("backend saw %d calls, want %d", got, want)
	}
	if throttled != 98 || rejected != 2 {
		t.Errorf("throttled %d, rejected by the backend %d; want 98 and 2", throttled, rejected)
	}
}

func TestUnaryHealthyBackendNeverThrottled(t *testing.T) {
	notFound := status.Error(codes.NotFound, "no such sku")
	// A backend that answers half the calls with an application error: it
	// accepted them all.
	b := &backend{script: []error{nil, notFound, nil, notFound, nil, notFound, nil, notFound, nil, notFound}}
	th, err := throttle.New(throttle.WithRand(fixed(0)))
	if err != nil {
		t.Fatal(err)
	}
	client, target := dial(t, b, th)
	for i := range 10 {
		_, err := client.GetStock(context.Background(), &inventoryv1.GetStockRequest{})
		if errors.Is(err, throttle.ErrThrottled) {
			t.Fatalf("call %d throttled by a backend that accepted every call", i)
		}
	}
	if got := th.Adaptive(target).DropProbability(); got != 0 {
		t.Errorf("DropProbability() = %v, want 0", got)
	}
}

func TestUnaryRetriesAfterRetryInfo(t *testing.T) {
	b := &backend{script: []error{overloaded(5 * time.Millisecond), overloaded(5 * time.Millisecond), nil}}
	th, err := throttle.New(throttle.WithRetries(3), throttle.WithRand(fixed(1)))
	if err != nil {
		t.Fatal(err)
	}
	client, _ := dial(t, b, th)
	if _, err := client.GetStock(context.Background(), &inventoryv1.GetStockRequest{}); err != nil {
		t.Fatalf("GetStock() = %v, want success on the third attempt", err)
	}
	if got, want := b.calls.Load(), int64(3); got != want {
		t.Errorf("backend saw %d calls, want %d", got, want)
	}
}

func TestUnaryRetryLimits(t *testing.T) {
	t.Run("budget", func(t *testing.T) {
		b := &backend{script: []error{overloaded(time.Millisecond)}}
		th, err := throttle.New(throttle.WithRetries(5), throttle.WithRetryBudget(0, 0), throttle.WithRand(fixed(1)))
		if err != nil {
			t.Fatal(err)
		}
		client, _ := dial(t, b, th)
		if _, err := client.GetStock(context.Background(), &inventoryv1.GetStockRequest{}); status.Code(err) != codes.Unavailable {
			t.Fatalf("GetStock() = %v, want Unavailable", err)
		}
		if got, want := b.calls.Load(), int64(1); got != want {
			t.Errorf("backend saw %d calls with an empty retry budget, want %d", got, want)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		b := &backend{script: []error{overloaded(time.Hour)}}
		th, err := throttle.New(throttle.WithRetries(5), throttle.WithRand(fixed(1)))
		if err != nil {
			t.Fatal(err)
		}
		client, _ := dial(t, b, th)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := client.GetStock(ctx, &inventoryv1.GetStockRequest{}); status.Code(err) != codes.Unavailable {
			t.Fatalf("GetStock() = %v, want the backend's Unavailable at once", err)
		}
		if got, want := b.calls.Load(), int64(1); got != want {
			t.Errorf("backend saw %d calls when the retry delay passes the deadline, want %d", got, want)
		}
	})
	t.Run("not retryable", func(t *testing.T) {
		b := &backend{script: []error{status.Error(codes.DeadlineExceeded, "slow")}}
		th, err := throttle.New(throttle.WithRetries(5), throttle.WithRand(fixed(1)))
		if err != nil {
			t.Fatal(err)
		}
		client, _ := dial(t, b, th)
		if _, err := client.GetStock(context.Background(), &inventoryv1.GetStockRequest{}); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("GetStock() = %v, want DeadlineExceeded", err)
		}
		if got, want := b.calls.Load(), int64(1); got != want {
			t.Errorf("backend saw %d calls, want %d: DeadlineExceeded is not retried", got, want)
		}
	})
}

func TestStreamThrottlesRejectingBackend(t *testing.T) {
	b := &backend{script: []error{nil, status.Error(codes.ResourceExhausted, "quota")}}
	th, err := throttle.New(throttle.WithRand(fixed(0.5)))
	if err != nil {
		t.Fatal(err)
	}
	client, _ := dial(t, b, th)
	var throttled int
	for range 20 {
		s, err := client.WatchStock(context.Background(), &inventoryv1.WatchStockRequest{})
		if errors.Is(err, throttle.ErrThrottled) {
			throttled++
			continue
		}
		if err != nil {
			t.Fatalf("WatchStock() = %v", err)
		}
		for {
			if _, err := s.Recv(); err != nil {
				if err != io.EOF && status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("Recv() = %v", err)
				}
				break
			}
		}
	}
	// One accepted stream, then rejections: with n streams counted before
	// it, a stream is dropped once (n − 2)/(n + 1) > 0.5, from the seventh
	// on.
	if got, want := b.calls.Load(), int64(6); got != want {
		t.Errorf("backend saw %d streams, want %d", got, want)
	}
	if throttled != 14 {
		t.Errorf("throttled %d streams, want 14", throttled)
	}
}
