package rls_test

import (
	"context"
	"fmt"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/rls"
)

// A service in memory under envoyproxy/ratelimit's config format: two
// requests a minute per client address. In a server, register it on a
// grpc.Server with svc.Register (rls/cmd/floodgate-rls does, with health,
// reflection and /metrics).
func Example() {
	cfg, err := rls.ParseConfig("ratelimit.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
`))
	if err != nil {
		panic(err)
	}
	store, err := keyed.New()
	if err != nil {
		panic(err)
	}
	svc, err := rls.New(store, cfg)
	if err != nil {
		panic(err)
	}
	req := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlpb.RateLimitDescriptor{{
		Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}},
	}}}
	for range 3 {
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil {
			panic(err)
		}
		st := resp.GetStatuses()[0]
		fmt.Println(resp.GetOverallCode(), st.GetCurrentLimit().GetRequestsPerUnit(), st.GetLimitRemaining())
	}
	// Output:
	// OK 2 1
	// OK 2 0
	// OVER_LIMIT 2 0
}
