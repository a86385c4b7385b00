package middleware

import (
	"context"
	"net/netip"
	"sync/atomic"

	"google.golang.org/grpc"
)

// Subject returns the bucket subject the interceptor would use for a call
// with context ctx: "t:<tenant>" or "a:<address>".
func Subject(l *Limiter, ctx context.Context) string {
	method, _ := grpc.Method(ctx)
	c := serverCall(ctx, method)
	var v verdict
	l.resolve(ctx, &c, l.tables.Table(), false, &v)
	return v.r.subject
}

// CountResolves counts the resolutions of calls (identity, tenant, route
// and priority) into n until the test ends.
func CountResolves(t interface{ Cleanup(func()) }, n *atomic.Int64) {
	onResolve = func() { n.Add(1) }
	t.Cleanup(func() { onResolve = nil })
}

// Exempt reports whether l exempts fullMethod.
func Exempt(l *Limiter, fullMethod string) bool { return l.exempt(fullMethod) }

var (
	DefaultExemptions = defaultExemptions
	WalkForwarded     = func(peer netip.Addr, values []string, trusted func(netip.Addr) bool) netip.Addr {
		return walkForwarded(peer, values, trusted, parseHop)
	}
	ParseForwarded = parseForwarded
	ParseHop       = parseHop
	Bearer         = bearer
	GridCeil       = gridCeil
)
