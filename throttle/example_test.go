package throttle_test

import (
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/throttle"
)

func ExampleAdaptive() {
	a, err := throttle.NewAdaptive(throttle.DefaultK)
	if err != nil {
		log.Fatal(err)
	}
	// The application made 100 calls; the backend accepted 20 of them and
	// turned the rest away.
	for i := range 100 {
		a.Allow()
		if i%5 == 0 {
			a.Accept()
		}
	}
	// The next call is dropped on the client with probability
	// (100 − 2·20)/(100 + 1).
	fmt.Printf("drop probability %.2f\n", a.DropProbability())
	// Output: drop probability 0.59
}

func ExampleThrottle() {
	th, err := throttle.New(throttle.WithRetries(3))
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:8080",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(th.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(th.StreamClientInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Calls on conn now fail fast with throttle.ErrThrottled while the
	// server rejects most of them, and rejected unary calls are retried at
	// most twice, after the delay the server asked for, within a budget of
	// a tenth of the calls.
}

// Calls to an upstream that allows 100 requests a second in bursts of 10
// wait for a token, bounded by each call's deadline. With a redisstore
// Store, a whole fleet of workers shares the quota.
func ExampleQuota() {
	store, err := keyed.New()
	if err != nil {
		log.Fatal(err)
	}
	q, err := throttle.NewQuota(store, floodgate.PerSecond(100, 10), throttle.WithQuotaKey("fcm:project-42"))
	if err != nil {
		log.Fatal(err)
	}
	cc, err := grpc.NewClient("dns:///fcm.googleapis.com:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()), // use TLS credentials in production
		grpc.WithChainUnaryInterceptor(q.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(q.StreamClientInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	fmt.Println("ready")
	// Output: ready
}
