package middleware

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-go/floodgate"
)

// PriorityHeader is the metadata key that carries a call's priority from
// one service to the next: "floodgate-priority", with the value
// "sheddable", "default" or "critical" (floodgate.Priority's names). A
// server honours it only from the callers WithPriorityFromPeers or
// WithPriorityFromTenants trust; PropagatePriority sets it.
const PriorityHeader = "floodgate-priority"

// priority returns the priority c is admitted at on route r: the one its
// PriorityHeader names when its caller is trusted to name one, else the
// tenant's (or its method's) configured priority.
func (l *Limiter) priority(c *Call, r *route) floodgate.Priority {
	if len(l.o.prioPeers) == 0 && l.o.prioTenants == nil {
		return r.flow.Priority
	}
	vals := c.values(PriorityHeader)
	if len(vals) != 1 {
		return r.flow.Priority // none, or a repeated header: not guessed at
	}
	p, err := floodgate.ParsePriority(vals[0])
	if err != nil || !l.trustsPriority(c, r) {
		return r.flow.Priority
	}
	return p
}

// trustsPriority reports whether c's caller may name its own priority.
func (l *Limiter) trustsPriority(c *Call, r *route) bool {
	if r.found && l.o.prioTenants[r.ten.ID()] {
		return true
	}
	if a := l.forwarded(c); a.IsValid() {
		for _, p := range l.o.prioPeers {
			if p.Contains(a) {
				return true
			}
		}
	}
	return false
}

// PropagatePriority returns the dial options of a client that carries the
// priority of the call being served to the calls it makes for it: a
// handler that passes its context on to a downstream call sends, in
// PriorityHeader, the priority at which this server admitted its own call
// (Decision.Priority), so that every service in a chain sheds the same
// low-priority work first. A call whose context carries no decision, or
// that sets PriorityHeader itself, is sent as it is.
func PropagatePriority() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(withPriority(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(withPriority(ctx), desc, cc, method, opts...)
		}),
	}
}

// withPriority returns ctx with the served call's priority in its
// outgoing metadata, unless it has none or the metadata names one.
func withPriority(ctx context.Context) context.Context {
	d, ok := FromContext(ctx)
	if !ok {
		return ctx
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(PriorityHeader)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, PriorityHeader, d.Priority.String())
}
