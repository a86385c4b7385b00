// Package peers holds the peer libraries' setups that several benchmarks
// share, so that each compares against the same configuration.
package peers

import (
	"context"
	"errors"
	"net"
	"sync"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// Errors of IPLimiter.Limit.
var (
	ErrNoPeer  = errors.New("no peer")
	ErrLimited = errors.New("rate limited")
)

// IPLimiter is what go-grpc-middleware's ratelimit users typically write:
// one x/time/rate limiter per peer IP, created on first sight, in a map
// behind a mutex. It implements ratelimit.Limiter.
type IPLimiter struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	limit rate.Limit
	burst int
}

// NewIPLimiter returns an IPLimiter whose limiters allow r calls a second
// with bursts of burst.
func NewIPLimiter(r float64, burst int) *IPLimiter {
	return &IPLimiter{m: map[string]*rate.Limiter{}, limit: rate.Limit(r), burst: burst}
}

// Limit takes one token from the calling peer's limiter: ErrLimited when
// it has none, ErrNoPeer when ctx carries no peer.
func (l *IPLimiter) Limit(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ErrNoPeer
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return err
	}
	l.mu.Lock()
	lim, ok := l.m[host]
	if !ok {
		lim = rate.NewLimiter(l.limit, l.burst)
		l.m[host] = lim
	}
	l.mu.Unlock()
	if !lim.Allow() {
		return ErrLimited
	}
	return nil
}

// RatelimitInterceptor returns go-grpc-middleware's ratelimit server
// interceptor over a new IPLimiter(r, burst).
func RatelimitInterceptor(r float64, burst int) grpc.UnaryServerInterceptor {
	return ratelimit.UnaryServerInterceptor(NewIPLimiter(r, burst))
}
