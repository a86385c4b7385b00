package rls_test

import (
	"context"
	"strconv"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/rls"
)

// BenchmarkShouldRateLimit decides in process, without gRPC, on buckets
// in memory: one descriptor, or two nested, over 1000 client values.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg, err := rls.ParseConfig("bench.yaml", []byte(`
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1000000}
`))
	if err != nil {
		b.Fatal(err)
	}
	const values = 1000
	for _, bc := range []struct {
		name string
		reqs func(i int) *pb.RateLimitRequest
	}{
		{"one", func(i int) *pb.RateLimitRequest {
			return request("bench", 0, desc("remote_address", "10.0.0."+strconv.Itoa(i)))
		}},
		{"two", func(i int) *pb.RateLimitRequest {
			return request("bench", 0, desc("remote_address", "10.0.0."+strconv.Itoa(i)), desc("tenant", "acme", "path", "/p"+strconv.Itoa(i)))
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m, err := keyed.New()
			if err != nil {
				b.Fatal(err)
			}
			svc, err := rls.New(m, cfg)
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]*pb.RateLimitRequest, values)
			for i := range reqs {
				reqs[i] = bc.reqs(i)
			}
			if len(reqs) == 0 || len(reqs[0].GetDescriptors()) == 0 {
				b.Fatal("no requests")
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					resp, err := svc.ShouldRateLimit(context.Background(), reqs[i%values])
					if err != nil || resp.GetOverallCode() != 1 {
						b.Errorf("ShouldRateLimit: %v, %v", resp.GetOverallCode(), err)
						return
					}
					i++
				}
			})
		})
	}
}
