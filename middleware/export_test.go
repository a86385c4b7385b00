package middleware

import "context"

// Subject returns the bucket subject the interceptor would use for a call
// with context ctx: "t:<tenant>" or "a:<address>".
func Subject(l *Limiter, ctx context.Context) string {
	p, h := peerOf(ctx), incoming(ctx)
	ten, found, _ := l.identify(ctx, p, h, l.tables.Table())
	return l.route(ten, found, p, h, methodOf(ctx)).subject
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
