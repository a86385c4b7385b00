package throttle_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/throttle"
)

const getStock = inventoryv1.Inventory_GetStock_FullMethodName

// ctxStore behaves like redisstore on a done context: it returns ctx.Err().
type ctxStore struct{ inner floodgate.Store }

func (s ctxStore) TakeN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	if err := ctx.Err(); err != nil {
		return floodgate.Result{}, err
	}
	return s.inner.TakeN(ctx, key, lim, n)
}

// failingStore fails every take, like a remote store that is down.
type failingStore struct{}

func (failingStore) TakeN(context.Context, string, floodgate.Limit, int) (floodgate.Result, error) {
	return floodgate.Result{}, errors.New("store down")
}

// neverInvoked is an invoker for calls that must not be sent.
func neverInvoked(t *testing.T) grpc.UnaryInvoker {
	return func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		t.Error("call sent")
		return nil
	}
}

func okInvoker(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
	return status.FromContextError(ctx.Err()).Err()
}

func newQuota(t *testing.T, store floodgate.Store, lim floodgate.Limit, opts ...throttle.Option) *throttle.Quota {
	t.Helper()
	q, err := throttle.NewQuota(store, lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestNewQuotaInvalid(t *testing.T) {
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	lim := floodgate.PerSecond(1, 1)
	for _, tc := range []struct {
		name  string
		store floodgate.Store
		lim   floodgate.Limit
		opts  []throttle.Option
	}{
		{"nil store", nil, lim, nil},
		{"invalid limit", store, floodgate.Limit{Rate: -1}, nil},
		{"cost 0", store, lim, []throttle.Option{throttle.WithQuotaCost(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := throttle.NewQuota(tc.store, tc.lim, tc.opts...); !errors.Is(err, floodgate.ErrInvalidOption) {
				t.Errorf("NewQuota() = %v, want an error wrapping ErrInvalidOption", err)
			}
		})
	}
}

// TestQuotaSpentZeroRateBucket: a spent bucket that never refills (rate 0)
// limits the call in both modes; only a cost above the burst is
// ErrQuotaCost.
func TestQuotaSpentZeroRateBucket(t *testing.T) {
	lim := floodgate.PerSecond(0, 2) // valid: 2 calls in all
	for _, failFast := range []bool{false, true} {
		store, _ := keyed.New()
		icpt := newQuota(t, store, lim, throttle.WithQuotaFailFast(failFast), throttle.WithQuotaKey("k")).UnaryClientInterceptor()
		for range 2 {
			if err := icpt(context.Background(), getStock, nil, nil, nil, okInvoker); err != nil {
				t.Fatal(err)
			}
		}
		if err := icpt(context.Background(), getStock, nil, nil, nil, neverInvoked(t)); err != throttle.ErrQuotaExceeded {
			t.Errorf("failFast=%v, cost 1 ≤ burst 2, spent bucket: %v, want ErrQuotaExceeded", failFast, err)
		}
	}
}

// TestQuotaCostOverBurst: a call costing more than the burst can never be
// sent, in both modes.
func TestQuotaCostOverBurst(t *testing.T) {
	for _, failFast := range []bool{false, true} {
		store, _ := keyed.New()
		icpt := newQuota(t, store, floodgate.PerSecond(1, 2), throttle.WithQuotaCost(3), throttle.WithQuotaFailFast(failFast)).UnaryClientInterceptor()
		if err := icpt(context.Background(), getStock, nil, nil, nil, neverInvoked(t)); err != throttle.ErrQuotaCost {
			t.Errorf("failFast=%v, cost 3 > burst 2: %v, want ErrQuotaCost", failFast, err)
		}
	}
}

// TestQuotaStoreDown: a store that cannot decide sends nothing and fails
// the call with ErrQuotaStore (UNAVAILABLE), in both modes.
func TestQuotaStoreDown(t *testing.T) {
	for _, failFast := range []bool{false, true} {
		icpt := newQuota(t, failingStore{}, floodgate.PerSecond(1, 1), throttle.WithQuotaFailFast(failFast)).UnaryClientInterceptor()
		err := icpt(context.Background(), getStock, nil, nil, nil, neverInvoked(t))
		if err != throttle.ErrQuotaStore || status.Code(err) != codes.Unavailable {
			t.Errorf("failFast=%v, store down: %v, want ErrQuotaStore (UNAVAILABLE)", failFast, err)
		}
	}
}

// TestQuotaCanceledCall: a canceled call is CANCELED in both modes, with a
// store that reports the done context as redisstore does, not UNAVAILABLE.
func TestQuotaCanceledCall(t *testing.T) {
	inner, _ := keyed.New()
	for _, failFast := range []bool{false, true} {
		icpt := newQuota(t, ctxStore{inner}, floodgate.PerSecond(1, 1), throttle.WithQuotaFailFast(failFast)).UnaryClientInterceptor()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := icpt(ctx, getStock, nil, nil, nil, neverInvoked(t)); status.Code(err) != codes.Canceled {
			t.Errorf("failFast=%v, canceled ctx: %v, want CANCELED", failFast, err)
		}
	}
}

// TestQuotaFailFastCanceledSpendsNothing: a canceled call, which gRPC will
// not send, takes no token.
func TestQuotaFailFastCanceledSpendsNothing(t *testing.T) {
	store, _ := keyed.New()
	icpt := newQuota(t, store, floodgate.PerSecond(0.001, 1), throttle.WithQuotaFailFast(true), throttle.WithQuotaKey("k")).UnaryClientInterceptor()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = icpt(ctx, getStock, nil, nil, nil, okInvoker) // the invoker fails: ctx canceled
	if err := icpt(context.Background(), getStock, nil, nil, nil, okInvoker); err != nil {
		t.Errorf("after a canceled, unsent call the next call fails: %v (the canceled call spent the token)", err)
	}
}

// TestQuotaKeys: the default key is the method; WithQuotaKeyFunc derives
// it from the call, and nil restores the default.
func TestQuotaKeys(t *testing.T) {
	lim := floodgate.PerSecond(0, 1)
	type account struct{}
	perAccount := func(ctx context.Context, method string) string { return ctx.Value(account{}).(string) }
	for _, tc := range []struct {
		name string
		opts []throttle.Option
		want []error // calls: method a for alice, b for alice, a for bob
	}{
		{"method", nil, []error{nil, nil, throttle.ErrQuotaExceeded}},
		{"key", []throttle.Option{throttle.WithQuotaKey("all")}, []error{nil, throttle.ErrQuotaExceeded, throttle.ErrQuotaExceeded}},
		{"key func", []throttle.Option{throttle.WithQuotaKeyFunc(perAccount)}, []error{nil, throttle.ErrQuotaExceeded, nil}},
		{"key func, then nil", []throttle.Option{throttle.WithQuotaKeyFunc(perAccount), throttle.WithQuotaKeyFunc(nil)}, []error{nil, nil, throttle.ErrQuotaExceeded}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := keyed.New()
			icpt := newQuota(t, store, lim, append(tc.opts, throttle.WithQuotaFailFast(true))...).UnaryClientInterceptor()
			var got []error
			for _, c := range []struct{ method, account string }{{"/a.S/A", "alice"}, {"/a.S/B", "alice"}, {"/a.S/A", "bob"}} {
				ctx := context.WithValue(context.Background(), account{}, c.account)
				got = append(got, icpt(ctx, c.method, nil, nil, nil, okInvoker))
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("calls = %v, want %v", got, tc.want)
					break
				}
			}
		})
	}
}

// TestQuotaOverTCP: outbound calls wait for, or fail fast without, tokens
// of the upstream's bucket; calls without tokens are never sent.
func TestQuotaOverTCP(t *testing.T) {
	call := func(ctx context.Context, client inventoryv1.InventoryClient) error {
		_, err := client.GetStock(ctx, &inventoryv1.GetStockRequest{})
		return err
	}

	// Failing fast on a fake clock: 1/s, burst 2, and the clock stands.
	fake, err := keyed.New(keyed.WithClock(newClock()))
	if err != nil {
		t.Fatal(err)
	}
	fast := newQuota(t, fake, floodgate.PerSecond(1, 2), throttle.WithQuotaFailFast(true), throttle.WithQuotaKey("upstream"))
	b := &backend{script: []error{nil}}
	client, _ := connect(t, b, grpc.WithChainUnaryInterceptor(fast.UnaryClientInterceptor()))
	var got []error
	for range 3 {
		got = append(got, call(context.Background(), client))
	}
	if got[0] != nil || got[1] != nil || got[2] != throttle.ErrQuotaExceeded {
		t.Errorf("fail fast: %v, want nil, nil, ErrQuotaExceeded", got)
	}
	if got, want := b.calls.Load(), int64(2); got != want {
		t.Errorf("upstream saw %d calls, want %d", got, want)
	}

	// Waiting on the real clock: 50/s, burst 1. Streams share the unary
	// method's bucket.
	real, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	wait := newQuota(t, real, floodgate.PerSecond(50, 1), throttle.WithQuotaKey(getStock))
	b = &backend{script: []error{nil}}
	client, _ = connect(t, b, grpc.WithChainUnaryInterceptor(wait.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(wait.StreamClientInterceptor()))
	for i := range 3 {
		if err := call(context.Background(), client); err != nil {
			t.Fatalf("waiting call %d: %v", i, err)
		}
	}
	s, err := client.WatchStock(context.Background(), &inventoryv1.WatchStockRequest{})
	if err != nil {
		t.Fatalf("WatchStock() = %v", err)
	}
	for {
		if _, err := s.Recv(); err != nil {
			if err != io.EOF {
				t.Fatalf("Recv() = %v", err)
			}
			break
		}
	}
	if got, want := b.calls.Load(), int64(4); got != want {
		t.Errorf("upstream saw %d calls, want %d", got, want)
	}

	// A deadline shorter than the wait fails at once, unsent. One token
	// every 10 s: however late this goroutine runs, the second call cannot
	// find a token within its deadline.
	slow := newQuota(t, real, floodgate.PerSecond(0.1, 1), throttle.WithQuotaKey("slow"))
	b = &backend{script: []error{nil}}
	client, _ = connect(t, b, grpc.WithChainUnaryInterceptor(slow.UnaryClientInterceptor()))
	if err := call(context.Background(), client); err != nil {
		t.Fatalf("first slow call: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := call(ctx, client); err != throttle.ErrQuotaExceeded && status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("short deadline: %v, want ErrQuotaExceeded or DEADLINE_EXCEEDED", err)
	}
	if got, want := b.calls.Load(), int64(1); got != want {
		t.Errorf("upstream saw %d slow calls, want %d", got, want)
	}
}
