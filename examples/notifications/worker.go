package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// retryAfter reads a Retry-After header in seconds, as push providers send
// it; 1 s when it is missing or not a number of seconds.
func retryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return time.Second
}

// report is what a worker prints (as JSON) when it is done.
type report struct {
	Sent      int64 `json:"sent"`
	Delayed   int64 `json:"delayed"`   // notifications that waited for a token
	Retries   int64 `json:"retries"`   // denied takes while waiting
	Throttled int64 `json:"throttled"` // 429s from the provider
	Failed    int64 `json:"failed"`
	Fallback  int64 `json:"fallback"` // decisions not made by Redis
}

// senderStore is one sender's view of the shared store: it notes whether
// the current notification had to wait, and counts decisions that Redis
// did not make (the fallback decided).
type senderStore struct {
	s        *redisstore.Store
	waited   bool
	retries  int64
	fallback *atomic.Int64
}

func (c *senderStore) TakeN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	res, err := c.s.TakeN(ctx, key, lim, n)
	if err == nil && !res.Allowed {
		c.waited = true
		c.retries++
	}
	if err == nil && res.Source != floodgate.SourceRedis {
		c.fallback.Add(1)
	}
	return res, err
}

// workerMain is one worker process: senders goroutines push notifications
// to the provider until the duration is over, each first waiting for a token
// from the bucket they all share on Redis.
func workerMain(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	addr := fs.String("redis", "", "Redis address")
	url := fs.String("provider", "", "provider URL")
	rate := fs.Float64("rate", 100, "shared limit in notifications per second")
	burst := fs.Int("burst", 5, "shared burst")
	senders := fs.Int("senders", 8, "concurrent senders in this worker")
	duration := fs.Duration("duration", 5*time.Second, "how long to send")
	limit := fs.Bool("limit", true, "wait for the shared bucket before each send")
	instances := fs.Int("instances", 4, "workers sharing the limit (the fallback divisor)")
	if err := fs.Parse(args); err != nil {
		return err
	}

	client := redis.NewClient(&redis.Options{
		Addr:                  *addr,
		ContextTimeoutEnabled: true, // let the store's deadline bound each call
		MaxRetries:            -1,   // a failed call falls back at once
	})
	defer client.Close()
	store, err := redisstore.New(client,
		redisstore.WithPrefix("notifications"),
		// A worker delays rather than drops, so it can afford to wait for
		// Redis far longer than a request path could: a local decision
		// cannot see what the other workers took, and every one risks a 429.
		redisstore.WithDeadline(500*time.Millisecond),
		redisstore.WithLocalDivisor(float64(*instances)),
	)
	if err != nil {
		return err
	}
	var fallback, delayed, retries atomic.Int64
	lim := floodgate.PerSecond(*rate, *burst)
	httpc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *senders}}

	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	var rep report
	var sent, throttled, failed atomic.Int64
	// One sender per worker waits on the shared bucket at a time, the
	// others queue here. Every sender polling Redis on its own would wake
	// them all each time a token comes (a dozen round trips per
	// notification sent), and that load on a small machine delays the
	// sends themselves past what the provider tolerates.
	var waiting sync.Mutex
	var wg sync.WaitGroup
	for i := range *senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := []byte(fmt.Sprintf(`{"to":"device-%d","title":"hello"}`, i))
			ss := &senderStore{s: store, fallback: &fallback}
			defer func() { retries.Add(ss.retries) }()
			// One notification per turn, sent until the provider takes it:
			// a 429 is waited out as its Retry-After says, and retried.
			for ctx.Err() == nil {
				waited := false // counted once per notification, not per send
				for ctx.Err() == nil {
					if *limit {
						ss.waited = false
						waiting.Lock()
						err := floodgate.Wait(ctx, ss, "provider:fcm", lim, 1)
						waiting.Unlock()
						if ss.waited && err == nil && !waited {
							waited = true
							delayed.Add(1)
						}
						// The run is over: no time left to wait, or the
						// context's deadline passed (the store may say so
						// a moment before ctx.Err does).
						if errors.Is(err, floodgate.ErrWouldExceedDeadline) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
							return
						}
						if err != nil {
							failed.Add(1)
							break
						}
					}
					resp, err := httpc.Post(*url, "application/json", bytes.NewReader(body))
					if err != nil {
						// The provider is unreachable: pause before the
						// next notification rather than spin on failures.
						failed.Add(1)
						select {
						case <-ctx.Done():
						case <-time.After(100 * time.Millisecond):
						}
						break
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusTooManyRequests {
						throttled.Add(1)
						select {
						case <-ctx.Done():
							return
						case <-time.After(retryAfter(resp.Header.Get("Retry-After"))):
						}
						continue
					}
					if resp.StatusCode == http.StatusOK {
						sent.Add(1)
					} else {
						failed.Add(1)
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	rep.Sent, rep.Throttled, rep.Failed = sent.Load(), throttled.Load(), failed.Load()
	rep.Delayed, rep.Retries, rep.Fallback = delayed.Load(), retries.Load(), fallback.Load()
	return json.NewEncoder(os.Stdout).Encode(rep)
}
