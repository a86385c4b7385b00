package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// tcp is the loopback network of e2e_test.go's networks.
func tcp(t *testing.T) network {
	for _, nw := range networks {
		if nw.name == "tcp" {
			return nw
		}
	}
	t.Fatal("no tcp network")
	return network{}
}

// A per-address limit in one call: the third call of a burst of two is
// rejected, health checks are exempt, and the tap handle is installed.
func TestNewPerAddress(t *testing.T) {
	l, err := middleware.NewPerAddress(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if l.Overload() != nil {
		t.Error("a per-address Limiter reports an overload controller")
	}
	cc, e := serve(t, tcp(t), l.ServerOptions())
	for i := range 2 {
		if err := invoke(t.Context(), cc); err != nil {
			t.Fatalf("call %d within the burst: %v", i+1, err)
		}
	}
	if err := invoke(t.Context(), cc); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call: %v, want RESOURCE_EXHAUSTED", err)
	}
	if got := e.calls.Load(); got != 2 {
		t.Errorf("handler ran %d times, want 2", got)
	}
	for range 3 {
		if _, err := healthpb.NewHealthClient(cc).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health check: %v, want it exempt", err)
		}
	}
	for _, bad := range []struct {
		rate  float64
		burst int
	}{{0, 1}, {-1, 1}, {1, 0}, {math.NaN(), 1}} {
		if _, err := middleware.NewPerAddress(bad.rate, bad.burst); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("NewPerAddress(%v, %d) = %v, want ErrInvalidOption", bad.rate, bad.burst, err)
		}
	}
}

// Overload protection in one call: every call enters through the tap
// handle (none untapped), the controller admits it, and its place comes
// back when it ends. A server wired without the tap handle is told so.
func TestNewOverload(t *testing.T) {
	ctrl, err := overload.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := middleware.NewOverload(middleware.WithOverload(ctrl))
	if err != nil {
		t.Fatal(err)
	}
	cc, _ := serve(t, tcp(t), l.ServerOptions())
	for range 5 {
		if err := invoke(t.Context(), cc); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return ctrl.Snapshot().Inside == 0 }, "every place to come back")
	if s := ctrl.Snapshot(); s.Admitted != 5 || s.Untapped != 0 {
		t.Errorf("admitted %d, untapped %d; want 5 and 0", s.Admitted, s.Untapped)
	}
	if l.Overload() != ctrl {
		t.Error("Overload() is not the controller WithOverload gave")
	}

	// The interceptors alone: the controller counts the calls it could
	// not see enter.
	ctrl2, err := overload.New()
	if err != nil {
		t.Fatal(err)
	}
	l2, err := middleware.NewOverload(middleware.WithOverload(ctrl2))
	if err != nil {
		t.Fatal(err)
	}
	cc2, _ := serve(t, tcp(t), limiterServer(l2))
	if err := invoke(t.Context(), cc2); err != nil {
		t.Fatal(err)
	}
	if s := ctrl2.Snapshot(); s.Untapped != 1 {
		t.Errorf("untapped = %d without the tap handle, want 1", s.Untapped)
	}

	// Its own controller when none is given.
	l3, err := middleware.NewOverload()
	if err != nil {
		t.Fatal(err)
	}
	cc3, _ := serve(t, tcp(t), l3.ServerOptions())
	if err := invoke(t.Context(), cc3); err != nil {
		t.Fatal(err)
	}
	if c := l3.Overload(); c == nil || c.Snapshot().Admitted != 1 {
		t.Errorf("Overload() of NewOverload's own controller = %v, want the one that admitted the call", c)
	}
}

// Quotas from a file in one call: loaded at once, reloaded when the file
// changes, and a first load that fails is an error.
func TestNewFromFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tenants.yaml")
	write := func(burst int) {
		t.Helper()
		cfg := `tenants:
  acme:
    keys: ["` + hashKey(t, acmeKey) + `"]
    default: {rate: 1, burst: ` + string(rune('0'+burst)) + `}
anonymous:
  default: {rate: 1, burst: 1}
`
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l, err := middleware.NewFromFile(ctx, path, middleware.WithAPIKeyHeaders("x-api-key"))
	if err != nil {
		t.Fatal(err)
	}
	cc, _ := serve(t, tcp(t), l.ServerOptions())
	acme := metadata.AppendToOutgoingContext(t.Context(), "x-api-key", acmeKey)
	if err := invoke(acme, cc); err != nil {
		t.Fatal(err)
	}
	if err := invoke(acme, cc); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call with a burst of 1: %v, want RESOURCE_EXHAUSTED", err)
	}
	// A bigger burst, and a modification time the poll cannot miss.
	write(5)
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for invoke(acme, cc) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the reloaded burst never applied")
		}
		time.Sleep(100 * time.Millisecond)
	}

	if _, err := middleware.NewFromFile(ctx, filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("NewFromFile of a missing file: nil error")
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("tenants: [1, 2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := middleware.NewFromFile(ctx, filepath.Join(dir, "bad.yaml")); err == nil {
		t.Error("NewFromFile of a malformed file: nil error")
	}
}

// records is a slog.Handler that keeps the records it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *records) WithGroup(string) slog.Handler            { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}

// find returns the level and the "err" attribute of the first record
// with message msg, and whether there is one.
func (h *records) find(msg string) (slog.Level, string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.Message != msg {
			continue
		}
		var err string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				err = a.Value.String()
			}
			return true
		})
		return r.Level, err, true
	}
	return 0, "", false
}

// NewFromFile's watch logs to slog.Default: a version of the file that
// fails to load, at Error, and the watch's end when its context is
// canceled, at Info.
func TestNewFromFileLogsTheWatch(t *testing.T) {
	h := &records{}
	prev := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(prev) })
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tenants.yaml")
		if err := os.WriteFile(path, []byte("anonymous:\n  default: {rate: 1, burst: 1}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		if _, err := middleware.NewFromFile(ctx, path); err != nil {
			t.Fatal(err)
		}
		// The watch reads the file as it starts: let it, then replace the
		// file whole, as editors and config managers do, so that no poll
		// reads it half-written.
		synctest.Wait()
		next := path + ".new"
		if err := os.WriteFile(next, []byte("anonymous:\n  default: {rate: -1, burst: 1}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(next, path); err != nil {
			t.Fatal(err)
		}
		// Past the watch's next poll (tenant.DefaultPollInterval).
		time.Sleep(tenant.DefaultPollInterval + time.Second)
		lvl, err, ok := h.find("tenant: config rejected; the previous table stays in force")
		if !ok || lvl != slog.LevelError || !strings.Contains(err, "rate") {
			t.Errorf("the invalid version's record: %v, %v, %q; want one at ERROR naming the rate", ok, lvl, err)
		}
		cancel()
		synctest.Wait()
		lvl, err, ok = h.find("middleware: tenant config watch ended; the table in force stays")
		if !ok || lvl != slog.LevelInfo || err != context.Canceled.Error() {
			t.Errorf("the watch's end: %v, %v, %q; want a record at INFO with %v", ok, lvl, err, context.Canceled)
		}
	})
}

// ServerOptions chain: an interceptor of the caller's own, before or
// after, still runs.
func TestServerOptionsCompose(t *testing.T) {
	l, err := middleware.NewPerAddress(100, 100)
	if err != nil {
		t.Fatal(err)
	}
	var before, after int
	opts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		before++
		return h(ctx, req)
	})}, l.ServerOptions()...)
	opts = append(opts, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if _, ok := middleware.FromContext(ctx); !ok {
			t.Error("an interceptor after the Limiter's finds no decision")
		}
		after++
		return h(ctx, req)
	}))
	cc, _ := serve(t, tcp(t), opts)
	if err := invoke(t.Context(), cc); err != nil {
		t.Fatal(err)
	}
	if before != 1 || after != 1 {
		t.Errorf("interceptors ran %d and %d times, want 1 and 1", before, after)
	}
}
