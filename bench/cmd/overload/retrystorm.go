package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/throttle"
)

// The retry storm ("retry-storm") offers stormLoad × capacity of calls, as
// the other scenarios count them (one per arrival, the application's
// logical calls), from clients that retry what the server rejects for
// overload, in three segments against one server:
//
//  1. no retries: each call is sent once, as in every other scenario: the
//     shedding controller's level, for reference;
//  2. naive: the application retries every UNAVAILABLE and
//     RESOURCE_EXHAUSTED after a short jittered backoff, up to
//     naiveAttempts in all, within the call's deadline, and ignores the
//     rejection's RetryInfo: what most clients do;
//  3. throttled: no application retries; each tenant's calls go through a
//     connection of their own with package throttle's interceptors,
//     throttle.New(throttle.WithRetries(naiveAttempts)): an adaptive
//     throttle per target and retries within a retry budget, after the
//     server's RetryInfo delay.
//
// Every attempt that goes on the network is counted by wireInterceptor,
// chained after the throttle's interceptor, so the calls the throttle drops
// on the client are not: the wire load is what the server sees.
const retryStorm = "retry-storm"

// stormLoad is the retry storm's offered load of logical calls, × capacity.
const stormLoad = 3.0

// stormBaseline names the retry storm's segment without retries.
const stormBaseline = "no-retries"

// How a segment's clients treat rejections (Segment.Client).
const (
	clientOnce      = ""          // one attempt per call: every other scenario
	clientNaive     = "naive"     // application retries, see callNaive
	clientThrottled = "throttled" // package throttle's interceptors
)

// The naive clients' retries: up to naiveAttempts attempts in all, each
// retry after a backoff drawn uniformly from [naiveBackoffMin,
// naiveBackoffMax]. The throttled clients get the same number of attempts.
const (
	naiveAttempts   = 3
	naiveBackoffMin = 20 * time.Millisecond
	naiveBackoffMax = 50 * time.Millisecond
)

// attemptRec is one attempt that went on the network: when it started
// (from the scenario's start), how long it took and how the server
// answered it.
type attemptRec struct {
	At  time.Duration
	Lat time.Duration
	Out outcome
}

// wireKey is the context key of a call's *wireTrace.
type wireKey struct{}

// A wireTrace follows one logical call's attempts on the network. The
// attempts of one call are sequential, so tries needs no lock.
type wireTrace struct {
	tries  int
	record func(t0 time.Time, err error)
}

// wireInterceptor counts the attempts of calls that carry a *wireTrace. It
// must be the innermost client interceptor: chained after the throttle's,
// it sees only the attempts the throttle sent.
func wireInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	tr, _ := ctx.Value(wireKey{}).(*wireTrace)
	if tr == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	tr.tries++
	t0 := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	tr.record(t0, err)
	return err
}

// overloaded reports whether err is a rejection a client would retry:
// what admission control answers (see classify).
func overloaded(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted:
		return true
	}
	return false
}

// callNaive makes a call as most applications retry: once more after a
// short jittered backoff whenever the server rejects it for overload, up
// to naiveAttempts in all, while the deadline leaves room for the backoff.
// It returns the last attempt's error.
func callNaive(ctx context.Context, call func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := call(ctx)
		if attempt >= naiveAttempts || !overloaded(err) {
			return err
		}
		d := naiveBackoffMin + rand.N(naiveBackoffMax-naiveBackoffMin+1)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
			return err
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// dialThrottled adds to c a throttled connection per tenant, each with a
// throttle of its own, as ten separate clients would have, and the wire
// counter after it. The connections are warmed up like dial's.
func (c *client) dialThrottled(addr string, k float64) error {
	opts := []throttle.Option{throttle.WithRetries(naiveAttempts)}
	if k > 0 {
		opts = append(opts, throttle.WithK(k))
	}
	for i := range c.throttled {
		th, err := throttle.New(opts...)
		if err != nil {
			return err
		}
		c.throttled[i], err = grpc.NewClient(addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(th.UnaryClientInterceptor(), wireInterceptor),
			grpc.WithChainStreamInterceptor(th.StreamClientInterceptor()))
		if err != nil {
			return err
		}
	}
	return warmUp(c.throttled[:]...)
}

// retries reports whether any of the scenario's segments has clients that
// retry: then every attempt of its calls is counted on the wire.
func (sc Scenario) retries() bool {
	for _, s := range sc.Segments {
		if s.Client != clientOnce {
			return true
		}
	}
	return false
}

// clientLabel names a client mode in the report; k is the throttled
// clients' K, 0 for the default.
func clientLabel(mode string, k float64) string {
	switch mode {
	case clientOnce:
		return "no retries"
	case clientNaive:
		return fmt.Sprintf("naive: %d attempts, %v–%v backoff", naiveAttempts, naiveBackoffMin, naiveBackoffMax)
	case clientThrottled:
		if k > 0 {
			return fmt.Sprintf("throttled: `throttle.New(throttle.WithRetries(%d), throttle.WithK(%g))`", naiveAttempts, k)
		}
		return fmt.Sprintf("throttled: `throttle.New(throttle.WithRetries(%d))`", naiveAttempts)
	}
	return mode
}
