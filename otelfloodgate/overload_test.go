package otelfloodgate

import (
	"context"
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate/internal/calltest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
)

// TestOverloadUntapped: a call that reaches the controller without the tap
// handle counting it in moves floodgate.overload.untapped; one the tap
// handle counted does not.
func TestOverloadUntapped(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ctrl, err := overload.New(overload.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(mp, WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	untapped := func(want int64) {
		t.Helper()
		if diff := cmp.Diff(map[string]int64{"": want}, points(t, collect(t, reader)["floodgate.overload.untapped"])); diff != "" {
			t.Errorf("floodgate.overload.untapped (-want +got):\n%s", diff)
		}
	}
	untapped(0)
	icpt := lim.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	ok := func(context.Context, any) (any, error) { return nil, nil }
	// Through the tap handle first, as a server built with
	// Limiter.ServerOptions calls it.
	ctx := calltest.KeyContext(methodGet, goldKey)
	md, _ := metadata.FromIncomingContext(ctx)
	ctx, err = lim.TapHandle(ctx, &tap.Info{FullMethodName: methodGet, Header: md})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := icpt(ctx, nil, info, ok); err != nil {
		t.Fatal(err)
	}
	untapped(0)
	// The interceptor alone: a server without the tap handle.
	if _, err := icpt(calltest.KeyContext(methodGet, goldKey), nil, info, ok); err != nil {
		t.Fatal(err)
	}
	untapped(1)
}
