package middleware

import (
	"context"
	"net/netip"

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
	WalkForwarded = func(peer netip.Addr, values []string, trusted func(netip.Addr) bool) netip.Addr {
		return walkForwarded(peer, values, trusted, parseHop)
	}
	ParseForwarded = parseForwarded
	ParseHop       = parseHop
	Bearer         = bearer
	GridCeil       = gridCeil
)

// DirectMetadata reports whether the middleware reads grpc-go's incoming
// metadata without copying it.
func DirectMetadata() bool { return incomingKey != nil }
