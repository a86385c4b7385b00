package throttle

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultBackoff is the first retry's delay, before jitter, when the
// server's rejection carries no RetryInfo; each further retry doubles it.
const DefaultBackoff = 100 * time.Millisecond

// ErrThrottled is the error of a call the adaptive throttle dropped on the
// client: the backend has been rejecting most calls, and this one was not
// sent. It is a gRPC status error with code Unavailable, so code that
// handles the backend's own overload handles it too; errors.Is matches it.
var ErrThrottled = status.Error(codes.Unavailable, "throttle: dropped on the client: the backend is rejecting calls")

// WithK sets the adaptive throttle's multiplier (see [Adaptive]), ≥ 1; the
// default is [DefaultK]. [New] uses it. A repeated call replaces it.
func WithK(k float64) Option { return func(o *options) { o.k = k } }

// WithRetries makes the interceptors retry a unary call the backend
// rejected for overload (Unavailable, ResourceExhausted) until attempts
// calls in all have been made, within the retry budget and the call's
// deadline. attempts must be from 1 to 10; the default, 1, never retries.
// Each retry waits for the delay the rejection's RetryInfo gives (a
// floodgate server sends one) or else for an exponential, jittered backoff
// (WithBackoff); a retry that would end past the deadline is not made, and
// the call returns the rejection. [New] uses it. A repeated call replaces it.
func WithRetries(attempts int) Option { return func(o *options) { o.attempts = attempts } }

// WithRetryBudget sets the retry budget (see [Budget]) of [New]'s
// interceptors: retries may add ratio (in [0, 1]) of the requests plus
// minPerSecond retries a second. The defaults are [DefaultRetryRatio] and
// [DefaultMinRetriesPerSecond]. A repeated call replaces both.
func WithRetryBudget(ratio, minPerSecond float64) Option {
	return func(o *options) { o.ratio, o.minRetry = ratio, minPerSecond }
}

// WithBackoff sets the first retry's delay when the rejection carries no
// RetryInfo, > 0; the default is [DefaultBackoff]. A repeated call
// replaces it.
func WithBackoff(d time.Duration) Option { return func(o *options) { o.backoff = d } }

// A Throttle protects a gRPC client's backends from the client itself:
// its interceptors keep one [Adaptive] throttle per target (the
// ClientConn's target), so calls to a backend that rejects most of them
// fail fast on the client with [ErrThrottled], and, with WithRetries, they
// retry rejected unary calls within one [Budget].
//
// A call counts as accepted unless it fails with Unavailable,
// ResourceExhausted or DeadlineExceeded: any other answer, error or not,
// means the backend did the work. Streams are throttled when they are
// opened and their first message or error decides whether they count as
// accepted; they are never retried.
//
// A Throttle is safe for concurrent use; share one across the client's
// connections.
type Throttle struct {
	o       options
	budget  *Budget
	mu      sync.Mutex
	targets map[string]*Adaptive
}

// New returns a Throttle. It uses every option but the quota's
// (WithQuota…); it returns an error wrapping [floodgate.ErrInvalidOption]
// naming the option when one is invalid.
func New(opts ...Option) (*Throttle, error) {
	o, err := build(opts)
	if err != nil {
		return nil, err
	}
	switch {
	case o.attempts < 1 || o.attempts > 10:
		return nil, invalid("WithRetries", o.attempts, "1 to 10")
	case o.backoff <= 0:
		return nil, invalid("WithBackoff", o.backoff, "> 0")
	}
	if err := checkK("WithK", o.k); err != nil {
		return nil, err
	}
	if err := checkBudget("WithRetryBudget", o.ratio, o.minRetry); err != nil {
		return nil, err
	}
	return &Throttle{o: o, budget: newBudget(o.ratio, o.minRetry, o), targets: make(map[string]*Adaptive)}, nil
}

// Adaptive returns the throttle of target, creating it on first use: for
// metrics, or to share the decision with calls made by other means.
func (t *Throttle) Adaptive(target string) *Adaptive {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.targets[target]
	if !ok {
		a = newAdaptive(t.o.k, t.o)
		t.targets[target] = a
	}
	return a
}

// rejected reports whether err says the backend turned the call away.
func rejected(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// UnaryClientInterceptor returns the unary client interceptor.
func (t *Throttle) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		a := t.Adaptive(cc.Target())
		if t.o.attempts > 1 {
			t.budget.Request()
		}
		for attempt := 1; ; attempt++ {
			if !a.Allow() {
				return ErrThrottled
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			if !rejected(err) {
				a.Accept()
				return err
			}
			code := status.Code(err)
			if attempt >= t.o.attempts || (code != codes.Unavailable && code != codes.ResourceExhausted) {
				return err
			}
			delay := t.delay(err, attempt)
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= delay {
				return err
			}
			if !t.budget.Retry() {
				return err
			}
			timer := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				timer.Stop()
				return err
			case <-timer.C:
			}
		}
	}
}

// delay returns how long to wait before retrying after err, the attempt-th
// attempt's error: the server's RetryInfo delay, else the backoff doubled
// per attempt, less a random part of up to half, so that callers rejected
// together do not come back together.
func (t *Throttle) delay(err error, attempt int) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	ceil := t.o.backoff << min(attempt-1, 16)
	return ceil/2 + rand.N(ceil/2+1)
}

// StreamClientInterceptor returns the stream client interceptor.
func (t *Throttle) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		a := t.Adaptive(cc.Target())
		if !a.Allow() {
			return nil, ErrThrottled
		}
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			if !rejected(err) {
				a.Accept()
			}
			return nil, err
		}
		return &stream{ClientStream: s, a: a}, nil
	}
}

// stream records, at its first received message or error, whether the
// backend accepted the stream.
type stream struct {
	grpc.ClientStream
	a    *Adaptive
	once sync.Once
}

func (s *stream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	s.once.Do(func() {
		if !rejected(err) {
			s.a.Accept()
		}
	})
	return err
}
