package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// A store shared by every instance of a service: 100 requests per second per
// tenant across all of them.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		ContextTimeoutEnabled: true, // the store's deadline bounds each call
		MaxRetries:            -1,   // a failed call falls back at once
	})
	defer client.Close()

	store, err := redisstore.New(client,
		redisstore.WithPrefix("api"),
		redisstore.WithLocalDivisor(8), // at least 8 instances share the limit when Redis is away
	)
	if err != nil {
		log.Fatal(err)
	}
	res, err := store.TakeN(context.Background(), "tenant-42", floodgate.PerSecond(100, 20), 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Source)
}

// Workers that must delay, not drop, wait for their turn on the shared
// bucket.
func ExampleStore_TakeN_wait() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.WithPrefix("push"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := floodgate.Wait(ctx, store, "provider:fcm", floodgate.PerSecond(500, 50), 1); err != nil {
		log.Fatal(err)
	}
	// send the notification
}

// High-volume decisions: batching for throughput, a deny cache for clients
// that keep knocking, leases for hot keys, and fail-closed when Redis is
// away.
func ExampleWithBatching() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	store, err := redisstore.New(client,
		redisstore.WithBatching(256),
		redisstore.WithDenyCache(10_000),
		redisstore.WithLeases(20*time.Millisecond, 1_000),
		redisstore.WithFailurePolicy(redisstore.Closed),
		redisstore.WithDeadline(20*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err)
	}
	_ = store
}

// Key shows where a subject's bucket lives.
func ExampleStore_Key() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, _ := redisstore.New(client, redisstore.WithPrefix("rl"), redisstore.WithName("push"))
	fmt.Println(store.Key("user:42"))
	fmt.Println(store.Key("{evil}"))
	// Output:
	// rl:{user:42}:push
	// rl:{%7Bevil%7D}:push
}

// A quota of model tokens shared by every instance: each call reserves its
// estimate, and settles the reply's actual cost once it is written.
func ExampleStore_ReserveN() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.WithPrefix("llm"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lim := floodgate.Every(time.Minute/100_000, 100_000) // 100k tokens a minute
	r, err := store.ReserveN(ctx, "tenant-42", lim, 500) // the estimate
	if err != nil || !r.Result.Allowed {
		return // refused: r.Result.RetryAfter says when to come back
	}
	used := 1800 // counted once the reply is written
	// The call's own context may have ended with it: settle regardless.
	if _, err := r.Settle(context.WithoutCancel(ctx), used); err != nil {
		log.Print(err) // floodgate.ErrDebtLimit, or Redis unavailable
	}
}
