package middleware

import (
	"context"
	"errors"
	"strconv"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

var _ ratelimit.Limiter = (*Limiter)(nil)

// ErrNotServerCall is Limit's error for a context that is not a server
// call's.
var ErrNotServerCall = errors.New("middleware: Limit needs a server call's context")

// UnaryServerInterceptor returns an interceptor that admits each unary call
// or rejects it before the handler runs. An admitted call's context carries
// its Decision (FromContext). Install it after recovery, logging and
// promfloodgate's Offenders interceptor, and before anything that sets
// header metadata, so that a rejection is a Trailers-Only response whose
// pushback grpc-go's retry honours.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if l.Exempt(info.FullMethod) {
			l.c.exempt.Add(1)
			return handler(ctx, req)
		}
		c := l.o.overload
		if l.o.dryRun {
			c = nil
		}
		dc, err := l.admit(ctx, info.FullMethod, c != nil)
		if err != nil {
			return nil, err
		}
		if c != nil {
			p, err := l.acquire(ctx, c, dc)
			if err != nil {
				return nil, err
			}
			defer p.Done()
		}
		if l.o.rateHeaders {
			_ = grpc.SetHeader(ctx, rateHeaders(dc.v.res))
		}
		return handler(dc, req)
	}
}

// acquire takes a slot of the overload controller for an admitted call,
// or returns its rejection: the overload status with the controller's
// retry delay, or the status of the caller's context when it ended while
// the call waited.
func (l *Limiter) acquire(ctx context.Context, c *overload.Controller, dc *decisionCtx) (overload.Permit, error) {
	r := dc.v.r
	p, err := c.Acquire(ctx, r.flow)
	var shed *overload.ShedError
	if err != nil && !errors.As(err, &shed) {
		// The caller's context ended while the call waited: neither
		// admitted nor shed.
		return p, status.FromContextError(err).Err()
	}
	if shed != nil {
		// The call was counted as admitted by its quota; it is an
		// overload rejection instead.
		l.c.overload.Add(1)
		l.c.admitted.Add(^uint64(0))
	}
	if obs := l.o.observer; obs != nil {
		e := Event{Method: dc.v.method, Tier: r.ten.Tier(), Reason: ReasonAdmitted, Source: dc.v.res.Source, Allowed: true}
		if shed != nil {
			e.Reason, e.Allowed = ReasonOverload, false
		}
		if r.found {
			e.Tenant = r.ten.ID()
		}
		obs(e)
	}
	if shed != nil {
		if f := l.o.rejected; f != nil {
			f(r.subject)
		}
		return p, l.rej.reject(ctx, ReasonOverload, shed.RetryAfter, dc.v.note)
	}
	return p, nil
}

// StreamServerInterceptor returns an interceptor that admits each stream at
// its start, taking the method's cost once, or rejects it before the
// handler runs. With WithPerMessage, every message the client sends takes
// the cost again and a message over quota ends the stream. The stream's
// context carries the Decision of its start.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if l.Exempt(info.FullMethod) {
			l.c.exempt.Add(1)
			return handler(srv, ss)
		}
		// The table is read before the decision: if a reload comes between
		// the two, the first message resolves the route again, needlessly
		// but harmlessly.
		table := l.tables.Table()
		dc, err := l.admit(ss.Context(), info.FullMethod, false)
		if err != nil {
			return err
		}
		if l.o.rateHeaders {
			_ = ss.SetHeader(rateHeaders(dc.v.res))
		}
		if !l.o.perMessage {
			return handler(srv, &stream{ServerStream: ss, dc: dc})
		}
		return handler(srv, &stream{ServerStream: ss, l: l, dc: dc, table: table, r: dc.v.r})
	}
}

// stream is an admitted server stream: its context carries the decision,
// and with WithPerMessage (l set) each received message is limited, by the
// route of the tenant table in force: a reload that lowers the caller's
// limit or revokes its key applies to the streams already open. gRPC does
// not call RecvMsg from two goroutines at once, so the fields need no lock.
type stream struct {
	grpc.ServerStream
	l     *Limiter
	dc    *decisionCtx
	table *tenant.Table // the table r was resolved in
	r     *route
}

func (s *stream) Context() context.Context { return s.dc }

func (s *stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil || s.l == nil {
		return err
	}
	if t := s.l.tables.Table(); t != s.table {
		ctx := s.dc.Context
		h, p := incoming(ctx), peerOf(ctx)
		ten, found, _ := s.l.identify(ctx, p, h, t)
		s.r, s.table = s.l.route(ten, found, p, h, s.dc.v.method), t
	}
	// The decision in the context stays the stream's start; a message's
	// decision is reported to the observer and counted.
	v := s.dc.v
	v.r = s.r
	return s.l.take(s.dc.Context, &v)
}

func rateHeaders(r floodgate.Result) metadata.MD {
	reset := (r.ResetAfter + 999_999_999) / 1_000_000_000
	return metadata.MD{
		"ratelimit-limit":     {strconv.Itoa(r.Limit.Burst)},
		"ratelimit-remaining": {strconv.Itoa(r.Remaining)},
		"ratelimit-reset":     {strconv.FormatInt(int64(reset), 10)},
	}
}

// TapHandle is a tap.ServerInHandle, installed with grpc.InTapHandle, that
// rejects the cheapest way gRPC offers: when a stream's headers arrive,
// before a goroutine is started for it or its request is read.
//
// It runs on the connection's reader under the transport's lock, so it does
// constant work and no I/O, and rejects only callers the interceptor would
// reject too: the CPU gate is shedding (at or below WithTapFloor's scale,
// by default at any scale) and the caller is over its share. A caller is
// over its share while a retry delay the interceptor gave it under the
// gate has not yet run out: for each overload rejection, the interceptor
// remembers, per bucket subject (a tenant, or an anonymous address), until
// when it told the caller to wait, for the 4096 subjects it penalized last.
// The tap resolves the subject from the connection's address, the
// forwarding headers of trusted proxies, a TLS
// client certificate and API keys: those it has already seen, and, for a
// caller whose address is under a retry delay, any other key, hashed then
// (a key that names no tenant leaves the caller judged by its address).
// With a KeyFunc set every caller passes: the tap cannot tell whose bucket
// they take from, and must not judge them by a neighbour's penalty on the
// same address. Everything else passes to the interceptor, which decides
// exactly.
//
// A rejection carries the overload status with its details; the tap cannot
// send metadata, so it has no pushback trailer and clients back off by
// their retry policy instead. Tap rejections are counted in Stats.Tap and
// reported to the observer, since stats handlers never see them.
func (l *Limiter) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	if c := l.o.overload; c != nil && !l.o.dryRun {
		// The call's arrival, before anything queues it: how long it
		// then waits to reach the interceptor tells the controller how
		// saturated the server is.
		ctx = c.Arrive(ctx)
		if c.Full() {
			return l.tapOverload(ctx, c, info)
		}
		return ctx, nil
	}
	g := l.o.gate
	if g == nil || l.o.dryRun || !g.Shedding() || g.Scale() > l.o.tapFloor {
		return ctx, nil
	}
	if l.Exempt(info.FullMethodName) {
		return ctx, nil
	}
	p, h, table := peerOf(ctx), header{md: info.Header}, l.tables.Table()
	ten, found, ok, note := l.tapIdentify(p, h, table)
	if !ok && l.o.keyFunc != nil {
		return ctx, nil
	}
	now := l.o.clock.Now()
	if !ok {
		// An API key the cache does not hold: a tenant's first call, or a
		// made-up key. Only if its address is under a retry delay is the
		// key worth a SHA-256 here, to tell the tenant, judged by its own
		// bucket, from a caller hiding behind a key that names no one.
		anon := l.route(table.Anonymous(), false, p, h, info.FullMethodName)
		if l.pen.left(anon.subject, now) <= 0 {
			return ctx, nil
		}
		key, _ := l.apiKey(h)
		ten, found = l.keys.resolve(table, key)
	}
	r := l.route(ten, found, p, h, info.FullMethodName)
	left := l.pen.left(r.subject, now)
	if left <= 0 {
		return ctx, nil
	}
	if f := l.o.rejected; f != nil {
		f(r.subject)
	}
	l.c.tap.Add(1)
	if l.o.observer != nil {
		l.o.observer(Event{Method: info.FullMethodName, Reason: ReasonOverload, Tap: true})
	}
	return ctx, l.rej.tapError(left, note)
}

// tapOverload turns a caller away at the tap while the overload
// controller's queue is full and the caller's flow holds more than its
// share: such a call would be shed after its request is read.
func (l *Limiter) tapOverload(ctx context.Context, c *overload.Controller, info *tap.Info) (context.Context, error) {
	if l.Exempt(info.FullMethodName) {
		return ctx, nil
	}
	p, h, table := peerOf(ctx), header{md: info.Header}, l.tables.Table()
	ten, found, ok, note := l.tapIdentify(p, h, table)
	if !ok {
		return ctx, nil // the interceptor will tell
	}
	r := l.route(ten, found, p, h, info.FullMethodName)
	if !c.Overloaded(r.flow) {
		return ctx, nil
	}
	if f := l.o.rejected; f != nil {
		f(r.subject)
	}
	c.Shed()
	l.c.tap.Add(1)
	if l.o.observer != nil {
		l.o.observer(Event{Method: info.FullMethodName, Reason: ReasonOverload, Tap: true})
	}
	return ctx, l.rej.tapError(c.RetryAfter(), note)
}

// Limit implements go-grpc-middleware's ratelimit.Limiter, so the Limiter
// can serve its ratelimit interceptors. It decides the call whose server
// context ctx is, finding the method with grpc.Method, and sets the
// pushback trailer on a rejection. Through that interceptor every rejection
// becomes RESOURCE_EXHAUSTED with the interceptor's own message and without
// details, and the decision is not left in the handler's context: prefer
// UnaryServerInterceptor unless the chain must use the ratelimit package.
//
// A context that is not a server call's (the ratelimit package's client
// interceptors pass one) names no method, peer or caller: Limit returns
// ErrNotServerCall rather than judge every such call as one anonymous
// caller. Use UnaryClientInterceptor to limit outgoing calls.
func (l *Limiter) Limit(ctx context.Context) error {
	method, ok := grpc.Method(ctx)
	if !ok {
		return ErrNotServerCall
	}
	if l.Exempt(method) {
		l.c.exempt.Add(1)
		return nil
	}
	_, err := l.decide(ctx, method, false)
	return err
}

// Selector returns a go-grpc-middleware selector.Matcher that matches the
// methods the Limiter limits and not its exemptions, so that
// selector.UnaryServerInterceptor(i, l.Selector()) runs i only for limited
// calls: use it around the ratelimit package's interceptors, or around other
// interceptors that should skip health checks and reflection too.
func (l *Limiter) Selector() selector.Matcher {
	return selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return !l.Exempt(c.FullMethod())
	})
}
