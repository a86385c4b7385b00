package middleware

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

var _ ratelimit.Limiter = (*Limiter)(nil)

// errNotServerCall is Limit's error for a context that is not a server
// call's.
var errNotServerCall = errors.New("middleware: Limit needs a server call's context")

// UnaryServerInterceptor returns an interceptor that admits each unary call
// or rejects it before the handler runs. An admitted call's context carries
// its Decision (FromContext). Install it after recovery and logging, and
// before anything that sets header metadata, so that a rejection is a
// Trailers-Only response whose pushback grpc-go's retry honours. Headers
// are read as the call sent them (the tap handle keeps them): an earlier
// interceptor that rewrites the incoming metadata does not change who the
// caller is; name such identities with WithKeyFunc.
//
// A call under a metered quota (tenant.Meter) reserves its estimate as it
// is admitted and settles when its handler returns, panics included, at
// what it reported (ReportCost, WithActualCost of its response), or at its
// estimate when it reported nothing.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		c := serverCall(ctx, info.FullMethod)
		c.Request = req
		var a Admission
		if err := l.admit(ctx, &c, l.o.overload, false, &a); err != nil {
			return nil, l.reject(ctx, a.e, err)
		}
		if l.o.overload != nil || a.m != nil {
			defer a.Done()
		}
		if l.o.rateHeaders && a.v.r != nil {
			_ = grpc.SetHeader(ctx, rateHeaders(a.v.res))
		}
		resp, err := handler(a.ctx, req)
		if f := l.o.actualCost; f != nil && a.m != nil && err == nil {
			if n, ok := f(a.ctx, info.FullMethod, resp); ok {
				if n < 0 {
					a.m.invalid.Add(1)
				} else {
					a.m.add(n)
				}
			}
		}
		return resp, err
	}
}

// serverCall describes the gRPC server call to method whose context ctx
// is: its headers are read from ctx's incoming metadata, its peer when the
// call is resolved.
func serverCall(ctx context.Context, method string) Call {
	return Call{Method: method, ctx: ctx, peer: ctx}
}

// withPeer sets c's address and client certificate from ctx's gRPC peer.
func withPeer(ctx context.Context, c *Call) {
	if p, ok := peer.FromContext(ctx); ok {
		c.Addr, c.Cert = addrOf(p.Addr), verifiedCert(p)
	}
}

// reject sets the pushback trailer of the rejection e, if there is one, on
// ctx's call, never header metadata, so that the response stays
// Trailers-Only and grpc-go's retry honours the pushback; it returns err.
func (l *Limiter) reject(ctx context.Context, e *Rejection, err error) error {
	if e != nil {
		if md := l.rej.pushback(ctx, e); md != nil {
			// SetTrailer fails only outside a gRPC call (a direct call in
			// a test); the status is the rejection either way.
			_ = grpc.SetTrailer(ctx, md)
		}
	}
	return err
}

// StreamServerInterceptor returns an interceptor that admits each stream at
// its start, taking the method's cost once, or rejects it before the
// handler runs. With WithPerMessage, every message the client sends takes
// the cost again and a message over quota ends the stream. The stream's
// context carries the Decision of its start.
//
// A stream under a metered quota (tenant.Meter) reserves its estimate as
// it starts, then chunks (tenant.Meter.Chunk) as it runs: before each
// message it sends, what it reported (ReportCost) and what WithActualCost
// says the message costs must fit what it reserved, and before each
// message it receives, what it reported; else it reserves the chunks it
// needs. When a chunk is refused, SendMsg (or RecvMsg) returns the
// rejection, RESOURCE_EXHAUSTED with the time until the chunk is back (or
// IN_DEBT), without sending (or receiving): return it to end the stream,
// which can then have run past its reservations by no more than what its
// handler reported after sending. The stream settles when its handler
// returns, at what it reported, or at its estimate when it reported
// nothing.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		if l.o.overload != nil {
			// A stream is not held to the controller: the tap stops
			// counting its method's calls in.
			l.streams.add(info.FullMethod)
		}
		// The table is read before the decision: if a reload comes between
		// the two, the first message resolves the route again, needlessly
		// but harmlessly.
		table := l.tables.Table()
		c := serverCall(ctx, info.FullMethod)
		var a Admission
		if err := l.admit(ctx, &c, nil, false, &a); err != nil {
			return l.reject(ctx, a.e, err)
		}
		if a.v.r == nil { // exempt
			return handler(srv, ss)
		}
		if l.o.rateHeaders {
			_ = ss.SetHeader(rateHeaders(a.v.res))
		}
		st := &stream{ServerStream: ss, ctx: a.ctx, dc: a.ctx.Value(decisionKey{}).(*decisionCtx), m: a.m}
		if a.m != nil {
			a.m.table = table
			defer a.m.settle()
		}
		if l.o.perMessage {
			st.l, st.table, st.r, st.prio, st.note = l, table, a.v.r, a.v.prio, a.v.note
		}
		return handler(srv, st)
	}
}

// stream is an admitted server stream: its context carries the decision,
// and with WithPerMessage (l set) each received message is limited, by the
// route of the tenant table in force: a reload that lowers the caller's
// limit or revokes its key applies to the streams already open. gRPC does
// not call RecvMsg from two goroutines at once, so the fields need no lock.
// A metered stream (m set) covers each message with its reservations.
type stream struct {
	grpc.ServerStream
	ctx   context.Context // dc, or the metered context around it
	l     *Limiter
	dc    *decisionCtx
	table *tenant.Table // the table r was resolved in
	r     *route
	prio  floodgate.Priority // with r
	note  keyNote            // with r
	m     *meter
}

func (s *stream) Context() context.Context { return s.ctx }

func (s *stream) SendMsg(m any) error {
	if s.m != nil {
		if err := s.m.send(m); err != nil {
			return err
		}
	}
	return s.ServerStream.SendMsg(m)
}

func (s *stream) RecvMsg(m any) error {
	if s.m != nil {
		if err := s.m.cover(0, false); err != nil {
			return err
		}
	}
	if err := s.ServerStream.RecvMsg(m); err != nil || s.l == nil {
		return err
	}
	ctx := s.ctx
	if t := s.l.tables.Table(); t != s.table {
		c := serverCall(ctx, s.dc.v.method)
		var v verdict
		s.l.resolve(ctx, &c, t, false, &v)
		s.r, s.prio, s.note, s.table = v.r, v.prio, v.note, t
	}
	// The decision in the context stays the stream's start; a message's
	// decision is reported to the observer and counted. It takes from the
	// call limit only: the metered quota is the stream's chunks.
	v := s.dc.v
	v.r, v.prio, v.note = s.r, s.prio, s.note
	v.badEst, v.mres, v.reserved, v.byMeter = false, floodgate.Result{}, 0, false
	v.est, v.err, v.invalid = 0, nil, 0
	if e := s.l.take(ctx, &v, nil); e != nil {
		return s.l.reject(ctx, e, e)
	}
	return nil
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
// constant work and no I/O. For every call but the exempt ones it makes
// the context the call runs with, which keeps the call's headers, and the
// resolution it made of the call, for the interceptors: they decide into
// it, and resolve the call only when the tap did not or the tenant table
// changed since. With an overload controller (WithOverload) it counts each
// call into the controller as it enters (but a stream's, once the stream
// interceptor has seen its method: the controller does not hold streams),
// and turns a call away when the server holds all the calls it can run
// and queue and the caller's flow holds at least its share of them, once
// the unary interceptor has seen the call's method. Without a controller,
// and for the streams it knows, it rejects only callers the interceptor
// would reject too: the CPU gate is shedding (at or below WithTapFloor's
// scale, by default at any scale) and the caller is over its share. A
// caller is over its share while a retry delay the interceptor gave it
// under the gate has not yet run out: for each of the gate's rejections
// (ReasonGate), the interceptor remembers, per bucket subject (a tenant,
// or an anonymous address), until when it told the caller to wait, for
// the 4096 subjects it penalized last. The tap
// resolves the subject from the connection's address, the forwarding
// headers of trusted proxies, a TLS client certificate and API keys: those
// it has already seen, and, for a caller whose address is under a retry
// delay, any other key, hashed then (a key that names no tenant leaves the
// caller judged by its address). With a WithKeyFunc hook set every caller
// passes: the tap cannot tell whose bucket they take from, and must not
// judge them by a neighbour's penalty on the same address. Everything else passes to
// the interceptor, which decides exactly.
//
// A rejection carries the overload status with its details; the tap cannot
// send metadata, so it has no pushback trailer and clients back off by
// their retry policy instead. Tap rejections are reported to the observer
// (Event.Tap), since stats handlers never see them.
func (l *Limiter) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	if l.exempt(info.FullMethodName) {
		return ctx, nil
	}
	dc := &decisionCtx{Context: ctx, tap: true, md: info.Header}
	dc.v.method = info.FullMethodName
	ctl := l.o.overload
	if ctl != nil && (l.o.dryRun || l.streams.has(info.FullMethodName)) {
		ctl = nil
	}
	g := l.o.gate
	if ctl == nil && (l.o.dryRun || g == nil || !g.Shedding() || g.Scale() > l.o.tapFloor) {
		// Nothing to decide here: the call's context keeps its headers
		// for the interceptor, which resolves it.
		return dc, nil
	}
	c := Call{Method: info.FullMethodName, md: info.Header, peer: ctx}
	dc.table = l.tables.Table()
	dc.resolved = l.resolve(ctx, &c, dc.table, true, &dc.v)
	if ctl != nil {
		if !l.unary.has(info.FullMethodName) {
			// A method the interceptors have not seen may be a stream's,
			// which the controller does not hold: counted in, not turned
			// away, until the unary interceptor has seen it.
			dc.Context, dc.entered, dc.learn = l.enterAlways(ctx, ctl, &dc.v), true, true
			return dc, nil
		}
		ctx, in := l.enter(ctx, ctl, &dc.v)
		if !in {
			return ctx, l.tapReject(&dc.v, ReasonOverload, ctl.RetryAfter())
		}
		dc.Context, dc.entered = ctx, true
		return dc, nil
	}
	if !dc.resolved {
		if l.o.keyFunc != nil {
			return dc, nil
		}
		// An API key the cache does not hold: a tenant's first call, or a
		// made-up key. Only if its address is under a retry delay is the
		// key worth a SHA-256 here, to tell the tenant, judged by its own
		// bucket, from a caller hiding behind a key that names no one.
		if l.pen.left(dc.v.r.subject, l.o.clock.Now()) <= 0 {
			return dc, nil
		}
		key, _ := l.apiKey(&c)
		ten, found := l.keys.resolve(dc.table, key)
		dc.v.r = l.route(ten, found, &c)
		dc.v.prio = l.priority(&c, dc.v.r)
		dc.resolved = true
	}
	if left := l.pen.left(dc.v.r.subject, l.o.clock.Now()); left > 0 {
		return ctx, l.tapReject(&dc.v, ReasonGate, left)
	}
	return dc, nil
}

// tapReject turns the call resolved into v away at the tap for reason
// (ReasonOverload, ReasonGate), reporting it, and returns the rejection
// with retry.
func (l *Limiter) tapReject(v *verdict, reason Reason, retry time.Duration) *Rejection {
	e := l.rej.lookup(reason, retry, v.note, nil)
	if obs := l.o.observer; obs != nil {
		ev := Event{Method: v.method, Tap: true, Rejection: e}
		ev.Decision = Decision{Reason: reason, Tier: v.r.ten.Tier(), Subject: v.r.subject, KeyIgnored: noteNames[v.note], Priority: v.prio}
		if v.r.found {
			ev.Tenant = v.r.ten.ID()
		}
		obs(ev)
	}
	return e
}

// enter counts the call resolved into v into the overload controller c as
// it enters the server (overload.Controller.Enter), returning the context
// that carries its place and true; or false when the controller turns it
// away.
func (l *Limiter) enter(ctx context.Context, c *overload.Controller, v *verdict) (context.Context, bool) {
	f := v.r.flow
	f.Priority = v.prio
	return c.Enter(ctx, f)
}

// enterAlways is enter for a call the controller must not turn away
// (overload.Controller.EnterAlways).
func (l *Limiter) enterAlways(ctx context.Context, c *overload.Controller, v *verdict) context.Context {
	f := v.r.flow
	f.Priority = v.prio
	return c.EnterAlways(ctx, f)
}

// A methodSet holds methods the interceptors have seen under an overload
// controller, at most maxMethods of them (an unknown-service handler sees
// any name). The tap handle cannot tell a stream from a unary call: it
// does not count in the calls of the stream methods (Limiter.streams), and
// turns away only the calls of the unary ones (Limiter.unary). A method in
// neither is counted in but not turned away.
type methodSet struct {
	m sync.Map // method → struct{}
	n atomic.Int32
}

const maxMethods = 1024

func (s *methodSet) has(method string) bool {
	_, ok := s.m.Load(method)
	return ok
}

func (s *methodSet) add(method string) {
	if s.has(method) || s.n.Load() >= maxMethods {
		return
	}
	if _, loaded := s.m.LoadOrStore(method, struct{}{}); !loaded {
		s.n.Add(1)
	}
}

// Limit implements go-grpc-middleware's ratelimit.Limiter, so the Limiter
// can serve its ratelimit interceptors. It decides the call whose server
// context ctx is, finding the method with grpc.Method, and sets the
// pushback trailer on a rejection. Through that interceptor every rejection
// becomes RESOURCE_EXHAUSTED with the interceptor's own message and without
// details, and the handler's context carries the decision only when the
// tap handle made it: prefer UnaryServerInterceptor unless the chain must
// use the ratelimit package.
//
// A context that is not a server call's (the ratelimit package's client
// interceptors pass one) names no method, peer or caller: Limit returns
// an error rather than judge every such call as one anonymous
// caller. Use throttle.Quota to limit outgoing calls. Limit sees
// no end of the call, so a metered quota (tenant.Meter) charges each call
// its estimate and never settles it. Nor does it hold the call to the
// overload controller (WithOverload): the tap handle, when the server has
// one, counts the call in, and Limit gives its place back at once; the
// tap never turns away the calls of a method only Limit has decided.
func (l *Limiter) Limit(ctx context.Context) error {
	method, ok := grpc.Method(ctx)
	if !ok {
		return errNotServerCall
	}
	c := serverCall(ctx, method)
	// A metered quota's reservation is never settled here: the call is
	// charged its estimate.
	var a Admission
	if err := l.admit(ctx, &c, nil, false, &a); err != nil {
		return l.reject(ctx, a.e, err)
	}
	return nil
}

// Selector returns a go-grpc-middleware selector.Matcher that matches the
// methods the Limiter limits and not its exemptions, so that
// selector.UnaryServerInterceptor(i, l.Selector()) runs i only for limited
// calls: use it around the ratelimit package's interceptors, or around other
// interceptors that should skip health checks and reflection too.
func (l *Limiter) Selector() selector.Matcher {
	return selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return !l.exempt(c.FullMethod())
	})
}
