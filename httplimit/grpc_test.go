package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/httplimit"
	"github.com/floodgate-go/floodgate/middleware"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

type stock struct {
	inventoryv1.UnimplementedInventoryServer
	tenants chan string
}

func (s stock) GetStock(ctx context.Context, _ *inventoryv1.GetStockRequest) (*inventoryv1.GetStockResponse, error) {
	d, _ := middleware.FromContext(ctx)
	s.tenants <- d.Tenant
	return &inventoryv1.GetStockResponse{}, nil
}

// A grpc.Server served through its ServeHTTP behind the middleware, on an
// HTTP/2 listener without TLS: a real grpc-go client reads the rejection
// as it reads the interceptors', and the handler sees the decision.
func TestGRPCServeHTTPBehindTheMiddleware(t *testing.T) {
	gs := grpc.NewServer()
	svc := stock{tenants: make(chan string, 4)}
	inventoryv1.RegisterInventoryServer(gs, svc)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	defer gs.Stop()
	m, err := httplimit.New(newLimiter(t))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(m.Handle(gs))
	ts.Config.Protocols = new(http.Protocols)
	ts.Config.Protocols.SetUnencryptedHTTP2(true)
	ts.Start()
	defer ts.Close()

	cc, err := grpc.NewClient(ts.Listener.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := inventoryv1.NewInventoryClient(cc)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", acmeKey)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	if _, err := client.GetStock(ctx, &inventoryv1.GetStockRequest{Sku: "sku-1"}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if got := <-svc.tenants; got != "acme" {
		t.Errorf("handler saw tenant %q, want acme", got)
	}
	// GetStock's burst is 1.
	_, err = client.GetStock(ctx, &inventoryv1.GetStockRequest{Sku: "sku-1"})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded" {
		t.Fatalf("second call: %v, want RESOURCE_EXHAUSTED", err)
	}
	var reason string
	var retry time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	if reason != middleware.ReasonQuota.ErrorReason() || retry != time.Second {
		t.Errorf("details: reason %q, retry %v; want %s, 1s", reason, retry, middleware.ReasonQuota.ErrorReason())
	}
	// Health checks stay exempt.
	hc := healthpb.NewHealthClient(cc)
	for range 3 {
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health check: %v", err)
		}
	}
}
