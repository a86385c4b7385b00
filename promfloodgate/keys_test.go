package promfloodgate

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-go/floodgate/internal/calltest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
)

// TestIgnoredKeys counts the calls whose API key header the Limiter
// ignored, by reason, from the Limiter's events.
func TestIgnoredKeys(t *testing.T) {
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	lim, err := middleware.New(store, middleware.Static(testTable(t)), middleware.WithObserver(c.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	icpt := lim.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: methodGet}
	for _, md := range []metadata.MD{
		metadata.Pairs("x-api-key", proKey, "x-api-key", proKey),
		metadata.Pairs("x-api-key", proKey, "x-api-key", freeKey),
		metadata.Pairs("x-api-key", strings.Repeat("k", 4096)),
		metadata.Pairs("x-api-key", proKey),
	} {
		_, _ = icpt(calltest.Context(methodGet, md), nil, info, noop)
	}
	want := `
# HELP floodgate_api_keys_ignored_total Decisions of calls whose API key header the limiter ignored, judging the caller anonymous, by reason: repeated (more than one value) or too_long.
# TYPE floodgate_api_keys_ignored_total counter
floodgate_api_keys_ignored_total{reason="repeated"} 2
floodgate_api_keys_ignored_total{reason="too_long"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "floodgate_api_keys_ignored_total"); err != nil {
		t.Error(err)
	}
}
