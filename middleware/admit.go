package middleware

import (
	"context"
	"crypto/x509"
	"errors"
	"net/netip"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/overload"
)

// A Header reads a call's request headers. Values returns the values of
// the header named key, which the Limiter passes in lower case, and must
// not be modified by the caller. An http.Header is a Header as it is.
type Header interface {
	Values(key string) []string
}

// A Call is one call as the Limiter sees it, whatever its transport: the
// gRPC interceptors build one from grpc-go's server call, the httplimit
// package from an *http.Request.
type Call struct {
	// Method names what is called, as the tenant rules and the exemptions
	// match it: a gRPC full method ("/pkg.Svc/Method"), or for HTTP a path
	// or the gRPC method an HTTP route stands for.
	Method string
	// Addr is the address of the connection's peer (a trusted proxy's
	// forwarding headers may name the client behind it), or the zero Addr
	// when the connection has none.
	Addr netip.Addr
	// Header holds the request's headers; nil means none.
	Header Header
	// Cert is the client certificate the server verified (the leaf of the
	// connection's first verified chain), or nil. An unverified certificate
	// must not be passed: anyone can present one.
	Cert *x509.Certificate
	// Request is what the WithCostEstimate function estimates a metered
	// call's cost from: a unary gRPC call's request message, the
	// *http.Request of package httplimit, or nil.
	Request any

	// A gRPC call's headers, when Header is nil: the tap handle's
	// metadata as grpc-go passes it, or the interceptors' context, read
	// through grpc-go's accessor.
	md  metadata.MD
	ctx context.Context
	// peer, when set, is the gRPC context whose peer gives Addr and Cert:
	// read as the call is resolved, so that a call whose resolution the
	// tap handle made reads it once.
	peer context.Context
}

// values returns the values of the header named key, in lower case.
func (c *Call) values(key string) []string {
	switch {
	case c.Header != nil:
		return c.Header.Values(key)
	case c.md != nil:
		return c.md[key]
	case c.ctx != nil:
		return metadata.ValueFromIncomingContext(c.ctx, key)
	}
	return nil
}

// An Admission is the Limiter's answer to one call (Admit). An admitted
// call runs with Context, and calls Done when it ends. A rejected call
// does not run; Decision and RetryAfter say why and for how long.
type Admission struct {
	ctx    context.Context
	v      verdict // v.r is nil for an exempt call
	permit overload.Permit
	e      *Rejection // the rejection, or nil
	m      *meter     // a metered call's account, in ctx; or nil
}

// Context returns the context the call runs with: the caller's, carrying
// the Decision (FromContext) when the call was limited rather than exempt.
func (a *Admission) Context() context.Context { return a.ctx }

// Done ends an admitted call, giving its overload controller slot
// (WithOverload) to the next, and settles a metered call (tenant.Meter) at
// the cost it reported (ReportCost, WithActualCost), or at its estimate
// when it reported nothing: call it once, when the handler returns,
// deferred so that a panic settles too. The settle outlives the call's
// context. Done does nothing for a call that holds no slot and no
// reservation, and nothing more when called again.
func (a *Admission) Done() {
	a.permit.Done()
	a.permit = overload.Permit{}
	if a.m != nil {
		a.m.settle()
	}
}

// Metered reports whether the call holds a reservation of a metered quota
// (tenant.Meter), which Send covers and Done settles.
func (a *Admission) Metered() bool { return a.m != nil }

// Send accounts for a message an admitted metered call is about to send
// (a stream's message, the bytes of an HTTP response's Write): what the
// WithActualCost function says msg costs, with what the call reported so
// far, must fit what it reserved, or the call reserves the next chunks
// (tenant.Meter.Chunk) from its metered bucket. Send returns the
// rejection status error, RESOURCE_EXHAUSTED with the time until the
// chunk is back (or IN_DEBT), when a chunk is refused, and from then on:
// the message must not be sent, and the call should end. A call without
// a metered quota, or in dry-run mode, always may send. Send is safe for
// concurrent use.
func (a *Admission) Send(msg any) error {
	if a.m == nil {
		return nil
	}
	return a.m.send(msg)
}

// Decision returns the Limiter's decision, and false for an exempt call,
// which has none. A call the overload controller shed has Allowed false
// and Reason ReasonOverload; a call whose context ended while it waited
// for the controller keeps the decision of its quota.
func (a *Admission) Decision() (Decision, bool) {
	if a.v.r == nil {
		return Decision{}, false
	}
	return a.v.decision(), true
}

// Admit decides one call: the one path of the tap handle and the
// interceptors, which Limit and package httplimit take too. With
// WithOverload, the call enters the controller (Enter, which may turn it
// away at once), unless the tap handle counted it in already; then its
// identity, tenant, the method's rule and a take from the caller's bucket;
// then a slot of the controller, which may wait. Call it as the call
// enters, before reading its body. It returns the admission and nil when
// the call may run (in dry-run mode, always), or the rejection's status
// error, the one the interceptors return, which a gRPC-aware transport can
// send as it is; or, when ctx ended while the call waited for a slot,
// ctx's error as a status. Admit sets no gRPC trailer.
func (l *Limiter) Admit(ctx context.Context, c Call) (Admission, error) {
	var a Admission
	err := l.admit(ctx, &c, l.o.overload, true, &a)
	return a, err
}

// admit is Admit holding an admitted call to the controller ctl (nil: to
// none, for a stream and for Limit, which see no end of the call), filling
// in a, which the interceptors keep on their stack. It reuses the tap
// handle's resolution of the call, carried by ctx, when the tenant table
// has not changed since. enter says whether a call the tap handle did not
// count into ctl enters it here (Admit), or goes to Acquire without
// (the interceptors on a server without the tap handle, which the
// controller counts as untapped).
func (l *Limiter) admit(ctx context.Context, c *Call, ctl *overload.Controller, enter bool, a *Admission) error {
	a.ctx = ctx
	dc, _ := ctx.Value(decisionKey{}).(*decisionCtx)
	if dc != nil && (!dc.tap || dc.decided.Load() || dc.v.method != c.Method) {
		dc = nil // an outer call's decision: this call is not the tap's
	}
	if dc == nil && l.exempt(c.Method) { // the tap makes no context for an exempt call
		if obs := l.o.observer; obs != nil {
			obs(Event{Decision: Decision{Allowed: true, Reason: ReasonExempt}, Method: c.Method, Context: ctx})
		}
		return nil
	}
	if l.o.dryRun {
		ctl = nil
	}
	if dc != nil && c.Header == nil {
		c.md = dc.md // grpc-go's own, as the tap handle got it
	}
	table := l.tables.Table()
	v := &a.v
	if dc != nil && dc.resolved && dc.table == table {
		*v = verdict{r: dc.v.r, prio: dc.v.prio, note: dc.v.note}
	} else {
		*v = verdict{}
		l.resolve(ctx, c, table, false, v)
	}
	v.method, v.dryRun, v.gated = c.Method, l.o.dryRun, ctl != nil
	entered := dc != nil && dc.entered
	if entered && dc.learn && ctl != nil && !enter {
		// The unary interceptor's call of a method new to the tap: from
		// now on the tap may turn the method's calls away.
		l.unary.add(c.Method)
	}
	switch {
	case entered && ctl == nil:
		// The tap counted the call in, and it will not be held: its
		// place goes back now.
		l.o.overload.Leave(ctx)
	case ctl != nil && !entered && enter:
		var in bool
		if ctx, in = l.enter(ctx, ctl, v); !in {
			// Turned away as it entered, as the tap handle turns calls
			// away: no quota was consulted.
			v.allowed, v.reason = false, ReasonOverload
			a.e = l.rej.lookup(ReasonOverload, ctl.RetryAfter(), v.note, nil)
			l.observe(v, ReasonOverload, false, Event{Context: ctx, Rejection: a.e, Shed: true, Cause: overload.ShedTap})
			a.ctx = ctx
			return a.e
		}
	}
	var rsv floodgate.Reservation
	if a.e = l.decide(ctx, c, v, &rsv); a.e != nil {
		if ctl != nil {
			ctl.Leave(ctx)
		}
		return a.e
	}
	if rsv.Result.Allowed {
		mc := l.metered(ctx, v, &rsv, c, nil)
		a.ctx, a.m = mc, &mc.m
	}
	if ctl != nil {
		var err error
		a.permit, a.e, err = l.acquire(ctx, ctl, v)
		if a.permit == (overload.Permit{}) {
			ctl.Leave(ctx) // shed, or its context ended: its place goes back now
		}
		if a.e != nil || err != nil {
			if a.m != nil {
				a.m.release() // the call does not run: its estimate goes back
				a.m = nil
			}
			a.ctx = ctx
			if a.e != nil {
				a.v.allowed, a.v.reason = false, ReasonOverload
				return a.e
			}
			return err
		}
	}
	// The call runs (a refusal in dry-run mode too): its context carries
	// the decision, and so does the tap handle's, for what derives from it.
	if dc != nil {
		dc.v = *v
		dc.decided.Store(true)
	}
	if a.m == nil && dc == nil {
		d := &decisionCtx{Context: ctx, v: *v}
		d.decided.Store(true)
		a.ctx = d
	}
	return nil
}

// acquire takes a slot of the overload controller for a call its quota
// admitted, or returns the overload rejection with the controller's retry
// delay, or the status of the caller's context when it ended while the
// call waited.
func (l *Limiter) acquire(ctx context.Context, c *overload.Controller, v *verdict) (overload.Permit, *Rejection, error) {
	f := v.r.flow
	f.Priority = v.prio
	p, err := c.Acquire(ctx, f)
	var shed *overload.ShedError
	if err != nil && !errors.As(err, &shed) {
		// The caller's context ended while the call waited: neither
		// admitted nor shed.
		l.observe(v, v.reason, false, Event{Context: ctx, Err: err})
		return p, nil, status.FromContextError(err).Err()
	}
	if shed == nil {
		l.observe(v, v.reason, true, Event{Context: ctx, Wait: p.Wait()})
		return p, nil, nil
	}
	e := l.rej.lookup(ReasonOverload, shed.RetryAfter, v.note, nil)
	l.observe(v, ReasonOverload, false, Event{Context: ctx, Rejection: e, Shed: true, Cause: shed.Cause})
	return p, e, nil
}
