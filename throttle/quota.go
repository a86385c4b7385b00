package throttle

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
)

// Errors of a [Quota]'s interceptors. They are gRPC status errors, so the
// code reaches whoever handles the call's error, and errors.Is matches
// them.
var (
	// ErrQuotaExceeded: the upstream's bucket is empty and the call fails
	// fast (WithQuotaFailFast), or the wait would outlast the call's
	// deadline.
	ErrQuotaExceeded = status.Error(codes.ResourceExhausted, "throttle: upstream rate limit exceeded")
	// ErrQuotaCost: the call costs more than the upstream limit's burst;
	// it can never be sent.
	ErrQuotaCost = status.Error(codes.ResourceExhausted, "throttle: call costs more than the upstream burst")
	// ErrQuotaStore: the store could not decide.
	ErrQuotaStore = status.Error(codes.Unavailable, "throttle: upstream rate limiter unavailable")
)

// WithQuotaKey makes every call share the bucket key, such as
// "fcm:project-42": the usual case, one quota for the whole upstream.
// The default key is the call's full method name: one bucket per method.
// [NewQuota] uses it. A repeated call, or WithQuotaKeyFunc, replaces it.
func WithQuotaKey(key string) Option {
	return func(o *options) { o.quotaKey = func(context.Context, string) string { return key } }
}

// WithQuotaKeyFunc derives the bucket key from the call, for upstreams
// with per-account or per-route quotas; nil restores the default. [NewQuota]
// uses it. A repeated call, or WithQuotaKey, replaces it.
func WithQuotaKeyFunc(f func(ctx context.Context, method string) string) Option {
	return func(o *options) { o.quotaKey = f }
}

// WithQuotaCost sets the tokens each call takes, ≥ 1; the default is 1.
// [NewQuota] uses it. A repeated call replaces it.
func WithQuotaCost(n int) Option { return func(o *options) { o.cost = n } }

// WithQuotaFailFast sets whether a call that finds the bucket empty fails
// at once with [ErrQuotaExceeded] instead of waiting for tokens. The
// default is to wait, bounded by the call's context. [NewQuota] uses it. A
// repeated call replaces it.
func WithQuotaFailFast(on bool) Option { return func(o *options) { o.failFast = on } }

// A Quota keeps a client's calls to an upstream that limits its callers
// within the upstream's published limit: before each call its interceptors
// take tokens from a [floodgate.Store] under one [floodgate.Limit],
// waiting for them, bounded by the call's context, or failing fast. A call
// that cannot get its tokens is not sent. With a store shared by many
// processes (redisstore), all of them together stay within the limit.
//
// A Quota is safe for concurrent use.
type Quota struct {
	store    floodgate.Store
	lim      floodgate.Limit
	key      func(ctx context.Context, method string) string
	cost     int
	failFast bool
}

// NewQuota returns a Quota taking from store under lim. Of the options it
// uses WithQuotaKey, WithQuotaKeyFunc, WithQuotaCost and
// WithQuotaFailFast. It returns an error wrapping
// [floodgate.ErrInvalidOption] for a nil store, an invalid limit or an
// invalid option.
func NewQuota(store floodgate.Store, lim floodgate.Limit, opts ...Option) (*Quota, error) {
	o, err := build(opts)
	if err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("%w: throttle: nil quota store", floodgate.ErrInvalidOption)
	}
	if err := lim.Validate(); err != nil {
		return nil, fmt.Errorf("%w: throttle: quota limit: %v", floodgate.ErrInvalidOption, err)
	}
	if o.cost < 1 {
		return nil, invalid("WithQuotaCost", o.cost, "at least 1")
	}
	return &Quota{store: store, lim: lim, key: o.quotaKey, cost: o.cost, failFast: o.failFast}, nil
}

// reserver is implemented by stores that can reserve tokens for waiters,
// such as keyed.Map: they serve waiters in order.
type reserver interface {
	WaitN(ctx context.Context, key string, lim floodgate.Limit, n int) error
}

func (q *Quota) acquire(ctx context.Context, method string) error {
	key := method
	if q.key != nil {
		key = q.key(ctx, method)
	}
	if q.failFast {
		// A call gRPC will not send must not spend a token.
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		res, err := q.store.TakeN(ctx, key, q.lim, q.cost)
		switch {
		case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return status.FromContextError(err).Err()
		case errors.Is(err, floodgate.ErrExceedsBurst):
			return ErrQuotaCost
		case err != nil:
			return ErrQuotaStore
		case res.Allowed:
			return nil
		case !q.lim.IsInf() && q.cost > q.lim.Burst:
			return ErrQuotaCost
		}
		// Short, or never refilled (rate 0): limited either way, as the
		// waiting mode says.
		return ErrQuotaExceeded
	}
	var err error
	if r, ok := q.store.(reserver); ok {
		err = r.WaitN(ctx, key, q.lim, q.cost)
	} else {
		err = floodgate.Wait(ctx, q.store, key, q.lim, q.cost)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, floodgate.ErrWouldExceedDeadline):
		return ErrQuotaExceeded
	case errors.Is(err, floodgate.ErrExceedsBurst):
		return ErrQuotaCost
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return status.FromContextError(err).Err()
	}
	return ErrQuotaStore
}

// UnaryClientInterceptor returns the unary client interceptor.
func (q *Quota) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := q.acquire(ctx, method); err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor returns the stream client interceptor: each
// stream takes its tokens once, before it is opened.
func (q *Quota) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := q.acquire(ctx, method); err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}
