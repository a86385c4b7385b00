package main

import (
	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
)

// newLimiter builds the server's admission control: the tenant table in
// force and the bucket store, joined by floodgate's middleware, with protect
// (middleware.WithOverload or WithGate; nil for quotas alone) against
// overload. Health checks and reflection are exempt by the middleware's
// defaults, so an overloaded server still answers its load balancer and its
// operators.
//
// extra options come last (the metrics observer).
func newLimiter(store floodgate.Store, tables middleware.Tables, protect middleware.Option, extra ...middleware.Option) (*middleware.Limiter, error) {
	return middleware.New(store, tables, append([]middleware.Option{
		protect,
		middleware.WithAPIKeyHeaders(apiKeyHeader),
		middleware.WithDomain(rejectionDomain),
	}, extra...)...)
}

// rejectionDomain is the ErrorInfo domain of the server's rejections.
const rejectionDomain = "inventory.v1.floodgate.dev"

// admission returns the server options that put l in front of every call:
// the tap handle first, then the interceptors, first in their chains so that
// a rejection leaves before anything sets header metadata and grpc-go
// clients honour its retry pushback. The offenders summary hears of
// rejections from l itself (WithRejectedSubjects), the tap handle's too.
func admission(l *middleware.Limiter) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(l.TapHandle),
		grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(l.StreamServerInterceptor()),
	}
}
