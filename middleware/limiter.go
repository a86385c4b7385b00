package middleware

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// Tables supplies the tenant table in force; *tenant.Registry implements it.
// Table is called once per decision and must be cheap and never return nil.
type Tables interface {
	Table() *tenant.Table
}

var _ Tables = (*tenant.Registry)(nil)

// Static returns Tables that always supply t, for a table built once with
// tenant.Compile or tenant.Parse.
func Static(t *tenant.Table) Tables { return staticTables{t} }

type staticTables struct{ t *tenant.Table }

func (s staticTables) Table() *tenant.Table { return s.t }

// A Gate scales every limit down while the server is overloaded
// (WithGate); *cpugate.Gate is one. Both methods are called on the request
// path: they must be cheap and safe for concurrent use.
type Gate interface {
	// Scale returns the factor, in (0, 1], that every limit is multiplied
	// by: 1 means full limits.
	Scale() float64
	// Shedding reports whether the gate is cutting limits now, rather than
	// giving them back: only then does the tap handle turn callers away.
	Shedding() bool
}

// Reason says why a decision went the way it did.
type Reason uint8

const (
	// ReasonAdmitted: the caller's bucket held the call's cost.
	ReasonAdmitted Reason = iota
	// ReasonExempt: the method is exempt; nothing was taken.
	ReasonExempt
	// ReasonQuota: the caller is over its quota at full limits.
	ReasonQuota
	// ReasonOverload: the overload controller (WithOverload) turned the
	// call away: it shed a call its quota admitted (Event.Shed), or, at
	// the tap handle (Event.Tap), the controller held all the calls it can
	// run and queue and the caller's flow its share of them.
	ReasonOverload
	// ReasonStoreError: the store could not decide.
	ReasonStoreError
	// ReasonDebt: the caller's metered bucket (tenant.Meter) owes units:
	// its calls cost more than they reserved, and every call under the
	// quota is refused until the debt is repaid at the quota's rate.
	ReasonDebt
	// ReasonInvalidEstimate: the call's estimate header
	// (tenant.Meter.EstimateHeader) was not a whole number of units
	// within the quota's burst. Nothing was taken.
	ReasonInvalidEstimate
	// ReasonSettled is no decision: it marks the Event of a metered
	// call's end, which reports what the call reserved and the cost it
	// was settled at (Event.Reserved, Event.Settled), with Allowed true
	// (the call ran). An observer that counts decisions skips it.
	ReasonSettled
	// ReasonGate: the CPU gate (WithGate) scales limits down and the
	// caller is over its scaled quota; or, at the tap handle (Event.Tap),
	// the gate sheds and the caller is inside the retry delay it was given
	// (WithTapFloor).
	ReasonGate
)

var reasonNames = [...]string{"admitted", "exempt", "quota", "overload", "store_error", "debt", "invalid_estimate", "settled", "gate"}

// String returns the reason's lower-case name, such as "quota", fit for a
// metric label.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// A Decision is the outcome of admitting one call (or one stream), as the
// interceptors leave it in the context for later interceptors and the
// handler: see FromContext.
type Decision struct {
	// Allowed reports whether the limiter admits the call. In dry-run mode a
	// call with Allowed false still runs; DryRun says so.
	Allowed bool
	// Reason says why.
	Reason Reason
	// DryRun reports whether the Limiter is in dry-run mode.
	DryRun bool
	// Tenant is the caller's tenant ID, or "" for an anonymous caller.
	Tenant string
	// Tier is the tenant's tier, or "".
	Tier string
	// Subject names the caller's buckets: "t:<tenant ID>", or
	// "a:<address prefix>" for an anonymous caller ("a:-" without an IP
	// address). It holds an address: never use it as a metric label.
	Subject string
	// KeyIgnored says why the caller's API key header was ignored, which
	// left it anonymous (Rejection.KeyIgnored's values), "" when it was not.
	KeyIgnored string
	// Rule is the rule the call was held to, with its unscaled limit.
	Rule tenant.Rule
	// Result is the store's answer from the call limit's bucket;
	// Result.Limit is the rule's limit as scaled by the CPU gate. It is
	// the zero Result when the store failed to take from it, or the call
	// was refused for an invalid estimate.
	Result floodgate.Result
	// Priority is the priority the call was admitted at: its method's or
	// its tenant's, or the one a trusted caller named in PriorityHeader.
	// PropagatePriority passes it on to the calls made for this one.
	Priority floodgate.Priority
	// Reserved is the estimate the call reserved from its metered quota
	// (Rule.Meter), in the quota's unit: 0 without a metered quota, and
	// when the reservation was refused.
	Reserved int64
	// Metered is the metered bucket's answer to the reservation, its
	// Owed the units the bucket owes; the zero Result without a metered
	// quota, or when the call never got as far as the reservation.
	Metered floodgate.Result
}

// An Event reports one decision to the observer (WithObserver): a call's,
// the tap handle's, a stream message's or chunk's, an exempt call's
// (ReasonExempt), or a metered call's settle (ReasonSettled). Its strings
// are shared with the Limiter's tables, so reporting allocates nothing. It
// names the tenant, so an observer that labels by tenant must bound its
// labels (promfloodgate caps them), and the subject, which holds an
// address.
type Event struct {
	// Decision is the decision. In the tap handle's events it holds the
	// caller as the tap resolved it (an API key it has not seen counts as
	// its address's), no rule and no store's answer; in a ReasonSettled
	// event, Reserved is everything the call reserved, its stream's chunks
	// included, and Metered the settle's answer (the zero Result when the
	// settle made no store call or failed).
	Decision
	// Method is the full method name, "/pkg.Svc/Method".
	Method string
	// Source is what decided in the store (floodgate.Result.Source: the
	// memory bucket, Redis, the deny cache, a lease, the local fallback, or
	// a failure policy): the metered bucket's answer when it refused the
	// call, or settled it (ReasonSettled), else the call limit's. It is
	// the zero Source when no store decided: after a store error, for an
	// invalid estimate, for an exempt call and in the tap handle's events.
	Source floodgate.Source
	// Tap reports a decision of the tap handle, made before the call's
	// stream was.
	Tap bool
	// Rejection is what the caller was told: nil for a call that runs
	// (in dry-run mode, every call).
	Rejection *Rejection
	// Shed reports a call the overload controller (WithOverload) shed
	// after its quota admitted it, and Cause says why. The tap handle's
	// rejections report Tap instead.
	Shed  bool
	Cause overload.ShedCause
	// Wait is how long an admitted call waited for a slot of the overload
	// controller; 0 when it started at once.
	Wait time.Duration
	// Unit is the unit of the call's metered quota (tenant.Meter.Unit),
	// "" when its method has none. The cost fields are in it.
	Unit string
	// MeterID names the metered bucket among the tenant's buckets
	// (tenant.Meter.ID), "" when the method has no metered quota: two
	// events of a tenant with the same MeterID are of the same bucket.
	MeterID string
	// Settled is the cost the call was settled at, in its ReasonSettled
	// event: what it reported, or its estimate when it reported nothing.
	// Rank tenants by its sum to find who costs most.
	Settled int64
	// Uncharged is the part of Settled that the bucket's debt limit left
	// uncharged (floodgate.DebtLimitError), in a ReasonSettled event.
	Uncharged int64
	// InvalidCosts counts negative costs, all ignored: the one the
	// WithCostEstimate function returned, in the call's decision; those
	// WithActualCost returned or ReportCost was given, in its
	// ReasonSettled event. Each is reported once.
	InvalidCosts int
	// Err is the store's error, of a ReasonStoreError decision or of a
	// settle that failed, which leaves the call's reservations charged; or
	// the context's error of a call whose context ended while it waited
	// for the overload controller's slot (Allowed false, no Rejection).
	Err error
	// Context is the call's context, for what it carries, such as a trace
	// span; the observer must not keep it. It is nil in the tap handle's
	// events, made before the call's context is.
	Context context.Context
}

// A Limiter admits or rejects gRPC calls: it resolves each call's caller to
// a tenant (or an anonymous address), looks up the method's rule, scales
// its limit by the CPU gate, takes the rule's cost from the caller's
// bucket in the store and, with an overload controller, holds the call to
// one of its slots. Build one with New; it is safe for concurrent use.
// It holds no goroutine, except that a Limiter from NewFromFile has one
// watching its file until the context given to NewFromFile ends (a store
// may run goroutines of its own: redisstore's doc says which). The zero
// Limiter is not usable.
//
// A caller's bucket key is "t:<tenant ID>:<rule ID>" for a tenant and
// "a:<address prefix>:<rule ID>" for an anonymous caller ("a:-:<rule ID>"
// when the connection has no IP address), so methods under different rules
// use different buckets and all anonymous callers from one address share
// theirs; a metered quota's bucket (tenant.Meter) is "<subject>:<meter
// ID>", with "dry:" before it in dry-run mode. Limiters with different
// configs must not share a store. A table with metered quotas needs a
// store that settles, a floodgate.Reserver (keyed, redisstore).
type Limiter struct {
	store    floodgate.Store
	reserver floodgate.Reserver // the store, when it can settle
	tables   Tables
	o        options
	rej      *rejecter
	keys     *keyCache
	routes   *lru.Cache[routeKey, *route]
	pen      *penalties
	unary    methodSet
	streams  methodSet
}

// New returns a Limiter taking tokens from store under the tables' rules.
// It returns an error wrapping floodgate.ErrInvalidOption when store or
// tables is nil, when tables supplies no table, when that table has
// metered quotas (tenant.Table.Metered) and the store is no
// floodgate.Reserver, or when an option is invalid; the message names the
// option. (Over such a store, metered calls of a table loaded later are
// store errors.)
func New(store floodgate.Store, tables Tables, opts ...Option) (*Limiter, error) {
	switch {
	case store == nil:
		return nil, fmt.Errorf("%w: middleware: New: nil store", floodgate.ErrInvalidOption)
	case isNil(tables):
		// A typed nil, such as a nil *tenant.Registry, is nil too.
		return nil, fmt.Errorf("%w: middleware: New: nil tables", floodgate.ErrInvalidOption)
	case tables.Table() == nil:
		return nil, fmt.Errorf("%w: middleware: New: the tables supply no table", floodgate.ErrInvalidOption)
	}
	reserver, _ := store.(floodgate.Reserver)
	if reserver == nil && tables.Table().Metered() {
		return nil, fmt.Errorf("%w: middleware: New: the table has metered quotas and the store cannot settle (it is no floodgate.Reserver)", floodgate.ErrInvalidOption)
	}
	o := defaults()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	l := &Limiter{
		store:    store,
		reserver: reserver,
		tables:   tables,
		o:        o,
		keys:     newKeyCache(),
		routes:   newLRU[routeKey, *route](routeCacheSize),
		pen:      newPenalties(),
	}
	l.rej = newRejecter(&l.o)
	return l, nil
}

// exempt reports whether fullMethod is exempt from limiting.
func (l *Limiter) exempt(fullMethod string) bool {
	for _, p := range l.o.exempt {
		if strings.HasPrefix(fullMethod, p) {
			return true
		}
	}
	return false
}

// verdict is a decision as the interceptors keep it: Decision is built
// from it only when FromContext asks. The route holds the tenant and the
// rule.
type verdict struct {
	r      *route
	method string
	res    floodgate.Result
	err    error // the store's, for ReasonStoreError
	// invalid counts the negative costs the estimate function returned.
	invalid int
	// The metered quota's part, when the rule has a Meter: the estimate
	// and whether the header that stated it was invalid (badEst), the
	// bucket's answer, the estimate reserved when it admitted the call,
	// and whether the metered bucket refused it (byMeter).
	est      int64
	mres     floodgate.Result
	reserved int64
	allowed  bool
	dryRun   bool
	// gated: the overload controller decides an allowed call next, and
	// reports it to the observer then, so that a shed call is one event.
	gated  bool
	reason Reason
	// note says why the caller's API key was ignored, for its rejection.
	note    keyNote
	prio    floodgate.Priority
	badEst  bool
	byMeter bool
}

func (v *verdict) decision() Decision {
	d := Decision{
		Allowed:    v.allowed,
		Reason:     v.reason,
		DryRun:     v.dryRun,
		Tier:       v.r.ten.Tier(),
		Subject:    v.r.subject,
		KeyIgnored: noteNames[v.note],
		Rule:       v.r.rule,
		Result:     v.res,
		Priority:   v.prio,
		Reserved:   v.reserved,
		Metered:    v.mres,
	}
	if v.r.found {
		d.Tenant = v.r.ten.ID()
	}
	return d
}

// decisionCtx is the context a limited call runs with. The tap handle
// makes it, with the call's resolution (v.r, v.prio, v.note) in the table
// it came from, and the interceptor fills in the decision; without the
// tap, the interceptor makes it. It is the one allocation of an admitted
// call.
type decisionCtx struct {
	context.Context
	v verdict
	// The tap handle's: the call's headers as it got them, the table it
	// resolved the call in, whether it made this context, resolved the
	// call (it may not hash an API key), counted it into the overload
	// controller, and did not know its method (the unary interceptor
	// learns it).
	md                            metadata.MD
	table                         *tenant.Table
	tap, resolved, entered, learn bool
	// decided: v is the call's decision (FromContext). It is stored after
	// v is written, on the handler's goroutine, and loaded before v is
	// read, by what derives from the tap's context on any goroutine.
	decided atomic.Bool
}

type decisionKey struct{}

func (c *decisionCtx) Value(key any) any {
	if key == (decisionKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// FromContext returns the decision the Limiter's interceptors (or Admit)
// made for the call whose context ctx is (or derives from), and whether
// there is one. Exempt calls carry none.
func FromContext(ctx context.Context) (Decision, bool) {
	dc, ok := ctx.Value(decisionKey{}).(*decisionCtx)
	if !ok || !dc.decided.Load() {
		return Decision{}, false
	}
	return dc.v.decision(), true
}

// onResolve, when set (by tests), is called at each resolution of a call.
var onResolve func()

// resolve resolves call c in table into v: the caller's tenant, or the
// anonymous policy and its address; its route; its priority; and why an
// API key header was ignored. At the tap handle (tap true) it calls no
// WithKeyFunc hook and hashes no API key, and reports false when
// it could not tell the caller without: then v holds the route of the
// caller's address.
func (l *Limiter) resolve(ctx context.Context, c *Call, table *tenant.Table, tap bool, v *verdict) bool {
	if onResolve != nil {
		onResolve()
	}
	if c.peer != nil {
		withPeer(c.peer, c)
		c.peer = nil
	}
	ten, found, ok, note := l.identify(ctx, c, table, tap)
	if !ok {
		ten, found = table.Anonymous(), false
	}
	v.r = l.route(ten, found, c)
	v.prio = l.priority(c, v.r)
	v.note = note
	return ok
}

// identify finds the caller's tenant: the tenant and true, or the
// anonymous policy and false, with the reason an API key header was
// ignored. At the tap handle (tap true) it resolves only API keys already
// cached, without a SHA-256 under the transport's lock, and reports ok
// false when it cannot tell what the interceptor would say: a WithKeyFunc
// hook is set (it may name any caller, and may expect the interceptor chain's
// context), or the caller presents a key the cache does not hold.
func (l *Limiter) identify(ctx context.Context, c *Call, table *tenant.Table, tap bool) (ten *tenant.Tenant, found, ok bool, note keyNote) {
	if l.o.keyFunc != nil {
		if tap {
			return nil, false, false, noteNone
		}
		if id, ok := l.o.keyFunc(ctx, c.Method); ok {
			ten, found := table.TenantByID(id)
			return ten, found, true, noteNone
		}
	}
	// A certificate that names no tenant (a service mesh's workload
	// identity, say) leaves the question to the API key.
	if id, ok := l.certTenant(c); ok {
		if ten, found := table.TenantByID(id); found {
			return ten, true, true, noteNone
		}
	}
	key, note := l.apiKey(c)
	if key == "" {
		return table.Anonymous(), false, true, note
	}
	if tap {
		ten, found := l.keys.lookup(table, key)
		return ten, found, found, noteNone
	}
	ten, found = l.keys.resolve(table, key)
	return ten, found, true, noteNone
}

// decide decides the call c resolved into v, and returns the rejection
// when the call must not run. It allocates nothing for a caller whose
// route is cached. A metered call's reservation goes to rsv, which holds
// its tokens when rsv.Result.Allowed.
func (l *Limiter) decide(ctx context.Context, c *Call, v *verdict, rsv *floodgate.Reservation) *Rejection {
	if m := v.r.rule.Meter; m != nil {
		var ok bool
		v.est, ok = l.estimate(ctx, c, m, v)
		v.badEst = !ok
	}
	return l.take(ctx, v, rsv)
}

// observe reports v's call to the observer, if there is one, as decided
// for reason, allowed or not; e holds what only the caller knows (the
// context, the rejection, the controller's shed or wait).
func (l *Limiter) observe(v *verdict, reason Reason, allowed bool, e Event) {
	obs := l.o.observer
	if obs == nil {
		return
	}
	l.event(v, reason, allowed, &e)
	obs(e)
}

// event fills in e, an Event of v's call, as decided for reason.
func (l *Limiter) event(v *verdict, reason Reason, allowed bool, e *Event) {
	e.Decision = v.decision()
	e.Reason, e.Allowed = reason, allowed
	e.Method, e.Source, e.InvalidCosts = v.method, v.res.Source, v.invalid
	if e.Err == nil {
		e.Err = v.err
	}
	if v.byMeter {
		e.Source = v.mres.Source
	}
	if m := v.r.rule.Meter; m != nil {
		e.Unit, e.MeterID = m.Unit, m.ID
	}
}

// take takes the route's cost from its bucket and, for a metered rule
// when rsv is not nil, reserves the call's estimate into rsv; it records
// the outcome in v and returns the rejection when the call must not run.
func (l *Limiter) take(ctx context.Context, v *verdict, rsv *floodgate.Reservation) *Rejection {
	r := v.r
	if v.badEst && !v.dryRun {
		// Refused before anything is taken: the caller's bug costs it
		// nothing but the call.
		v.res, v.allowed, v.reason = floodgate.Result{}, false, ReasonInvalidEstimate
		return l.decided(ctx, v, 0)
	}
	scale := 1.0
	if l.o.gate != nil {
		scale = l.o.gate.Scale()
	}
	lim := r.rule.Limit
	if scale < 1 {
		lim = lim.Scale(scale)
	}
	res, err := l.store.TakeN(ctx, r.key, lim, r.rule.Cost)
	if errors.Is(err, floodgate.ErrExceedsBurst) {
		// The call costs more than the bucket can ever hold at this
		// scale: a refusal, not a store that failed (which fails open by
		// default). It can come back once the gate gives limits back.
		res, err = floodgate.Result{Limit: lim, RetryAfter: floodgate.Never}, nil
	}
	retry := res.RetryAfter
	switch {
	case err != nil:
		v.res, v.err = floodgate.Result{}, err
		// A key the store refuses for its length never fits: failing
		// open on it would leave its caller unlimited.
		v.allowed = !l.o.failClosed && !errors.Is(err, floodgate.ErrKeyTooLong)
		v.reason = ReasonStoreError
	case res.Allowed:
		v.res = res
		v.allowed = true
		v.reason = ReasonAdmitted
		if rsv != nil && r.rule.Meter != nil {
			retry = l.reserve(ctx, v, rsv, scale)
		}
	default:
		v.res = res
		v.allowed = false
		v.reason = ReasonQuota
		if scale < 1 {
			v.reason = ReasonGate
		}
	}
	if v.badEst { // in dry-run mode, which ran the call on the config's estimate
		v.allowed, v.reason = false, ReasonInvalidEstimate
	}
	return l.decided(ctx, v, retry)
}

// decided reports v's decision unless the overload controller decides
// next, and returns its rejection, after retry, when the call must not
// run.
func (l *Limiter) decided(ctx context.Context, v *verdict, retry time.Duration) *Rejection {
	r := v.r
	var e *Rejection
	if !v.allowed && !v.dryRun {
		var m *tenant.Meter // when the metered quota refused the call
		if v.byMeter || v.reason == ReasonInvalidEstimate {
			m = r.rule.Meter
		}
		e = l.rej.lookup(v.reason, retry, v.note, m)
	}
	if !(v.allowed && v.gated) {
		l.observe(v, v.reason, v.allowed, Event{Context: ctx, Rejection: e})
	}
	if e == nil {
		return nil
	}
	// The tap handle acts only while the gate sheds, so only then is the
	// retry delay worth a clock read to remember. A wait beyond the cap (or
	// Never) is remembered as the cap.
	if v.reason == ReasonGate && retry > 0 {
		l.pen.note(r.subject, l.o.clock.Now().Add(min(retry, l.o.maxPushback)))
	}
	return e
}
