package middleware

import (
	"context"

	"google.golang.org/grpc"
)

// Subject returns the bucket subject the interceptor would use for a call
// with context ctx: "t:<tenant>" or "a:<address>".
func Subject(l *Limiter, ctx context.Context) string {
	method, _ := grpc.Method(ctx)
	c := serverCall(ctx, method, incoming(ctx))
	ten, found, _ := l.identify(ctx, &c, l.tables.Table())
	return l.route(ten, found, &c).subject
}

var (
	WalkForwarded = walkForwarded
	ParseHop      = parseHop
	Bearer        = bearer
	GridCeil      = gridCeil
)

// DirectMetadata reports whether the middleware reads grpc-go's incoming
// metadata without copying it.
func DirectMetadata() bool { return incomingKey != nil }
