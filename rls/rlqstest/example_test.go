package rlqstest_test

import (
	"context"
	"fmt"
	"net"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/floodgate-go/floodgate/rls/rlqstest"
)

// burstOfThree answers every reported bucket with a token bucket of 3 tokens
// refilled at 1 per second, valid for a minute.
type burstOfThree struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
}

func (burstOfThree) StreamRateLimitQuotas(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	for {
		r, err := st.Recv()
		if err != nil {
			return nil
		}
		resp := &rlqspb.RateLimitQuotaResponse{}
		for _, u := range r.GetBucketQuotaUsages() {
			resp.BucketAction = append(resp.BucketAction, assign(u.GetBucketId().GetBucket(), tb(3, 1, 1), secs(60)))
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

func ExampleEnvoy() {
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, burstOfThree{})
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()

	// A clock that stands still: only the burst is available.
	start := time.Unix(1_800_000_000, 0)
	env, err := rlqstest.NewEnvoy(cc, "edge", rlqstest.Settings{Now: func() time.Time { return start }})
	if err != nil {
		panic(err)
	}
	defer env.Close()

	bucket := map[string]string{"tenant": "a"}
	fmt.Println("first request:", env.Request(bucket)) // subscribes; ALLOW_ALL until assigned
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := env.WaitReceived(ctx, 1); err != nil { // the server's assignment
		panic(err)
	}
	allowed := 0
	for range 10 {
		if env.Request(bucket) {
			allowed++
		}
	}
	fmt.Println("allowed of 10:", allowed)
	st := env.Stats()[rlqstest.Key(bucket)]
	fmt.Println(st.Source, "burst", st.Burst, "rate", st.Rate, "expires in", st.Expires.Sub(start))
	// Output:
	// first request: true
	// allowed of 10: 3
	// Assigned burst 3 rate 1 expires in 1m0s
}
