package middleware

import "context"

// Subject returns the bucket subject the interceptor would use for a call
// with context ctx: "t:<tenant>" or "a:<address>".
func Subject(l *Limiter, ctx context.Context) string {
	var buf [keyBufLen]byte
	p, h := peerOf(ctx), incoming(ctx)
	ten, found, _ := l.identify(ctx, p, h, l.tables.Table())
	return string(l.appendSubject(buf[:0], ten, found, p, h))
}

var (
	WalkForwarded = walkForwarded
	ParseHop      = parseHop
	Bearer        = bearer
	GridIndex     = gridIndex
	GridSize      = gridSize
)

// DirectMetadata reports whether the middleware reads grpc-go's incoming
// metadata without copying it.
func DirectMetadata() bool { return incomingKey != nil }
