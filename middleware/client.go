package middleware

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
)

// Errors of the client interceptors. They are gRPC status errors, so the
// code reaches whoever handles the call's error, and errors.Is matches them.
var (
	// ErrUpstreamLimited: the upstream's bucket is empty and the call fails
	// fast (WithFailFast), or the wait would outlast the call's deadline.
	ErrUpstreamLimited = status.Error(codes.ResourceExhausted, "middleware: upstream rate limit exceeded")
	// ErrUpstreamCost: the call costs more than the upstream limit's burst;
	// it can never be sent.
	ErrUpstreamCost = status.Error(codes.ResourceExhausted, "middleware: call costs more than the upstream burst")
	// ErrUpstreamStore: the store could not decide.
	ErrUpstreamStore = status.Error(codes.Unavailable, "middleware: upstream rate limiter unavailable")
)

// A ClientOption configures the client interceptors.
// UnaryClientInterceptor and StreamClientInterceptor apply the options in
// order to a copy of the defaults, skipping nil ones, then validate the
// result (the convention of floodgate.ErrInvalidOption).
type ClientOption func(*clientOptions)

type clientOptions struct {
	key      func(ctx context.Context, method string) string
	cost     int
	failFast bool
}

// WithUpstreamKey makes every call share the bucket key, such as
// "fcm:project-42": the usual case, one quota for the whole upstream.
// The default key is the call's full method name: one bucket per method.
// A repeated call, or WithUpstreamKeyFunc, replaces it.
func WithUpstreamKey(key string) ClientOption {
	return func(o *clientOptions) { o.key = func(context.Context, string) string { return key } }
}

// WithUpstreamKeyFunc derives the bucket key from the call, for upstreams
// with per-account or per-route quotas; nil restores the default. A
// repeated call, or WithUpstreamKey, replaces it.
func WithUpstreamKeyFunc(f func(ctx context.Context, method string) string) ClientOption {
	return func(o *clientOptions) { o.key = f }
}

// WithUpstreamCost sets the tokens each call takes, ≥ 1; the default is 1.
// A repeated call replaces it.
func WithUpstreamCost(n int) ClientOption {
	return func(o *clientOptions) { o.cost = n }
}

// WithFailFast sets whether a call that finds the bucket empty fails at
// once with ErrUpstreamLimited instead of waiting for tokens. The default
// is to wait, bounded by the call's context. A repeated call replaces it.
func WithFailFast(on bool) ClientOption { return func(o *clientOptions) { o.failFast = on } }

type upstream struct {
	store floodgate.Store
	lim   floodgate.Limit
	o     clientOptions
}

func newUpstream(store floodgate.Store, lim floodgate.Limit, opts []ClientOption) (*upstream, error) {
	o := clientOptions{cost: 1}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if store == nil {
		return nil, fmt.Errorf("%w: middleware: nil upstream store", floodgate.ErrInvalidOption)
	}
	if err := lim.Validate(); err != nil {
		return nil, fmt.Errorf("%w: middleware: upstream limit: %v", floodgate.ErrInvalidOption, err)
	}
	if o.cost < 1 {
		return nil, fmt.Errorf("%w: middleware: WithUpstreamCost(%d): want at least 1", floodgate.ErrInvalidOption, o.cost)
	}
	return &upstream{store: store, lim: lim, o: o}, nil
}

// reserver is implemented by stores that can reserve tokens for waiters,
// such as keyed.Map: they serve waiters in order.
type reserver interface {
	WaitN(ctx context.Context, key string, lim floodgate.Limit, n int) error
}

func (u *upstream) acquire(ctx context.Context, method string) error {
	key := method
	if u.o.key != nil {
		key = u.o.key(ctx, method)
	}
	if u.o.failFast {
		// A call gRPC will not send must not spend a token.
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		res, err := u.store.TakeN(ctx, key, u.lim, u.o.cost)
		switch {
		case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return status.FromContextError(err).Err()
		case errors.Is(err, floodgate.ErrExceedsBurst):
			return ErrUpstreamCost
		case err != nil:
			return ErrUpstreamStore
		case res.Allowed:
			return nil
		case !u.lim.IsInf() && u.o.cost > u.lim.Burst:
			return ErrUpstreamCost
		}
		// Short, or never refilled (rate 0): limited either way, as the
		// waiting mode says.
		return ErrUpstreamLimited
	}
	var err error
	if r, ok := u.store.(reserver); ok {
		err = r.WaitN(ctx, key, u.lim, u.o.cost)
	} else {
		err = floodgate.Wait(ctx, u.store, key, u.lim, u.o.cost)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, floodgate.ErrWouldExceedDeadline):
		return ErrUpstreamLimited
	case errors.Is(err, floodgate.ErrExceedsBurst):
		return ErrUpstreamCost
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return status.FromContextError(err).Err()
	}
	return ErrUpstreamStore
}

// UnaryClientInterceptor returns a client interceptor that takes tokens
// from store under lim before each call to a rate-limited upstream: it waits
// for them, bounded by the call's context, or with WithFailFast fails at
// once. A call that cannot get its tokens is not sent. It returns an error
// wrapping floodgate.ErrInvalidOption for a nil store, an invalid limit or
// an invalid option.
//
// With a store shared by many processes (redisstore), all of them together
// stay within lim.
func UnaryClientInterceptor(store floodgate.Store, lim floodgate.Limit, opts ...ClientOption) (grpc.UnaryClientInterceptor, error) {
	u, err := newUpstream(store, lim, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := u.acquire(ctx, method); err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil
}

// StreamClientInterceptor is UnaryClientInterceptor for streams: each
// stream takes its tokens once, before it is opened.
func StreamClientInterceptor(store floodgate.Store, lim floodgate.Limit, opts ...ClientOption) (grpc.StreamClientInterceptor, error) {
	u, err := newUpstream(store, lim, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := u.acquire(ctx, method); err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}, nil
}
