package middleware

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

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
	// ReasonOverload: the server is overloaded. The overload controller
	// (WithOverload) shed a call its quota admitted (Event.Shed); or the
	// tap handle turned the call away (Event.Tap) while the controller
	// held all the calls it can run and queue and the caller's flow its
	// share of them, or, with the CPU gate (WithGate) and no controller,
	// while the gate sheds and the caller is inside a retry delay
	// (WithTapFloor); or the caller is over its quota while the gate
	// scales limits down.
	ReasonOverload
	// ReasonStoreError: the store could not decide.
	ReasonStoreError
)

var reasonNames = [...]string{"admitted", "exempt", "quota", "overload", "store_error"}

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
	// Rule is the rule the call was held to, with its unscaled limit.
	Rule tenant.Rule
	// Result is the store's answer; Result.Limit is the rule's limit as
	// scaled by the CPU gate. It is the zero Result after a store error.
	Result floodgate.Result
	// Priority is the priority the call was admitted at: its method's or
	// its tenant's, or the one a trusted caller named in PriorityHeader.
	// PropagatePriority passes it on to the calls made for this one.
	Priority floodgate.Priority
}

// An Event reports one decision to the observer (WithObserver). Its strings
// are shared with the Limiter's tables, so reporting allocates nothing. It
// carries no key and no address; it names the tenant, so an observer that
// labels by tenant must bound its labels (promfloodgate caps them).
type Event struct {
	// Method is the full method name, "/pkg.Svc/Method".
	Method string
	// Tier is the tier of the caller's policy: its tenant's, or the
	// anonymous policy's for an anonymous caller; "" when that names none,
	// and in the tap handle's events (the tap does not resolve tiers).
	Tier string
	// Tenant is the caller's tenant ID, "" for an anonymous caller and in
	// the tap handle's events.
	Tenant string
	// Reason is the decision's reason.
	Reason Reason
	// Source is what decided in the store (floodgate.Result.Source: the
	// memory bucket, Redis, the deny cache, a lease, the local fallback, or
	// a failure policy). It is meaningful only for the interceptors'
	// decisions with reason ReasonAdmitted, ReasonQuota or ReasonOverload;
	// after a store error and in the tap handle's events no store decided,
	// and it is the zero Source.
	Source floodgate.Source
	// Allowed reports whether the limiter admitted the call. In dry-run
	// mode the call runs either way.
	Allowed bool
	// DryRun reports that the Limiter is in dry-run mode (WithDryRun).
	DryRun bool
	// Tap reports a decision of the tap handle, made before the call's
	// stream was.
	Tap bool
	// RetryAfter is the retry delay a rejection states in its RetryInfo,
	// on the pushback grid (WithMaxPushback); 0 when it states none, and
	// for a call that runs.
	RetryAfter time.Duration
	// Shed reports a call the overload controller (WithOverload) shed
	// after its quota admitted it, and Cause says why. The tap handle's
	// rejections report Tap instead.
	Shed  bool
	Cause overload.ShedCause
	// Wait is how long an admitted call waited for a slot of the overload
	// controller; 0 when it started at once.
	Wait time.Duration
	// Context is the call's context, for what it carries, such as a trace
	// span; the observer must not keep it. It is nil in the tap handle's
	// events, made before the call's context is.
	Context context.Context
}

// Stats are the Limiter's counters since it was made; each only grows.
//
// Each limited call is counted once in Admitted, Quota, Overload or
// StoreErrors, by what its quota decided (an exempt call in Exempt
// instead). The overload controller (WithOverload) then decides the calls
// the quota let through, those in Admitted and the store errors failing
// open, and Shed counts those it shed: without store errors, Admitted −
// Shed calls passed both (less those whose context ended while they
// waited for a slot). The interceptors' overload rejections are Overload +
// Shed; the tap handle's are counted apart, in Tap.
type Stats struct {
	// Admitted counts calls their quota admitted, those the overload
	// controller then shed included (store errors admitted under the
	// default fail-open policy are counted in StoreErrors).
	Admitted uint64
	// Exempt counts calls to exempt methods.
	Exempt uint64
	// Quota and Overload count the quota's rejections, dry-run ones
	// included: Quota at full limits, Overload while the CPU gate
	// (WithGate) scales them down.
	Quota, Overload uint64
	// Shed counts calls the quota let through (Admitted, or a store error
	// failing open) that the overload controller then shed (reason
	// ReasonOverload, Event.Shed).
	Shed uint64
	// StoreErrors counts decisions the store could not make.
	StoreErrors uint64
	// DryRun counts calls admitted only because of dry-run mode.
	DryRun uint64
	// Tap counts the tap handle's rejections (and those of Admit as a
	// call enters the overload controller); they are in no other count.
	Tap uint64
	// RepeatedKeys and LongKeys count calls by the interceptors whose API
	// key header was ignored, leaving the caller anonymous: it had more
	// than one value, or a value longer than any key.
	RepeatedKeys, LongKeys uint64
}

// counters are the Limiter's counts, one atomic word each (see Stats).
type counters struct {
	admitted, exempt, quota, overload, shed, storeErr, dryRun, tap, repeatedKeys, longKeys atomic.Uint64
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
// theirs. Limiters with different configs must not share a store.
type Limiter struct {
	store  floodgate.Store
	tables Tables
	o      options
	rej    *rejecter
	keys   *keyCache
	routes *lru.Cache[routeKey, *route]
	pen    *penalties
	c      counters
}

// New returns a Limiter taking tokens from store under the tables' rules.
// It returns an error wrapping floodgate.ErrInvalidOption when store or
// tables is nil, when tables supplies no table, or when an option is
// invalid; the message names the option.
func New(store floodgate.Store, tables Tables, opts ...Option) (*Limiter, error) {
	switch {
	case store == nil:
		return nil, fmt.Errorf("%w: middleware: New: nil store", floodgate.ErrInvalidOption)
	case tables == nil, reflect.ValueOf(tables).Kind() == reflect.Pointer && reflect.ValueOf(tables).IsNil():
		// A typed nil, such as a nil *tenant.Registry, is nil too.
		return nil, fmt.Errorf("%w: middleware: New: nil tables", floodgate.ErrInvalidOption)
	case tables.Table() == nil:
		return nil, fmt.Errorf("%w: middleware: New: the tables supply no table", floodgate.ErrInvalidOption)
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
		store:  store,
		tables: tables,
		o:      o,
		keys:   newKeyCache(),
		routes: newLRU[routeKey, *route](routeCacheSize),
		pen:    newPenalties(),
	}
	l.rej = newRejecter(&l.o)
	return l, nil
}

// Stats returns the Limiter's counters. Each is read atomically; together
// they are not a consistent snapshot.
func (l *Limiter) Stats() Stats {
	return Stats{
		Admitted:     l.c.admitted.Load(),
		Exempt:       l.c.exempt.Load(),
		Quota:        l.c.quota.Load(),
		Overload:     l.c.overload.Load(),
		Shed:         l.c.shed.Load(),
		StoreErrors:  l.c.storeErr.Load(),
		DryRun:       l.c.dryRun.Load(),
		Tap:          l.c.tap.Load(),
		RepeatedKeys: l.c.repeatedKeys.Load(),
		LongKeys:     l.c.longKeys.Load(),
	}
}

// Exempt reports whether fullMethod is exempt from limiting.
func (l *Limiter) Exempt(fullMethod string) bool {
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
	r       *route
	method  string
	allowed bool
	dryRun  bool
	// gated: the overload controller decides an allowed call next, and
	// reports it to the observer then, so that a shed call is one event.
	gated  bool
	reason Reason
	// note says why the caller's API key was ignored, for its rejection.
	note keyNote
	res  floodgate.Result
	prio floodgate.Priority
}

func (v *verdict) decision() Decision {
	d := Decision{
		Allowed:  v.allowed,
		Reason:   v.reason,
		DryRun:   v.dryRun,
		Tier:     v.r.ten.Tier(),
		Rule:     v.r.rule,
		Result:   v.res,
		Priority: v.prio,
	}
	if v.r.found {
		d.Tenant = v.r.ten.ID()
	}
	return d
}

// decisionCtx carries an admitted call's decision: the one allocation of
// an admitted call.
type decisionCtx struct {
	context.Context
	v verdict
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
	if !ok {
		return Decision{}, false
	}
	return dc.v.decision(), true
}

// identify finds the caller's tenant: the tenant and true, or the anonymous
// policy and false, with the reason an API key header was ignored, which
// it counts.
func (l *Limiter) identify(ctx context.Context, c *Call, table *tenant.Table) (*tenant.Tenant, bool, keyNote) {
	if l.o.keyFunc != nil {
		if id, ok := l.o.keyFunc(ctx, c.Method); ok {
			ten, found := table.TenantByID(id)
			return ten, found, noteNone
		}
	}
	// A certificate that names no tenant (a service mesh's workload
	// identity, say) leaves the question to the API key.
	if id, ok := l.certTenant(c); ok {
		if ten, found := table.TenantByID(id); found {
			return ten, true, noteNone
		}
	}
	key, note := l.apiKey(c)
	if key != "" {
		ten, found := l.keys.resolve(table, key)
		return ten, found, noteNone
	}
	switch note {
	case noteRepeated:
		l.c.repeatedKeys.Add(1)
	case noteTooLong:
		l.c.longKeys.Add(1)
	}
	return table.Anonymous(), false, note
}

// tapIdentify is identify as the tap handle can afford it, without a
// SHA-256 under the transport's lock: it resolves only API keys already
// cached. It reports ok false when it cannot tell what identify would say:
// a KeyFunc is set (it may name any caller, and may expect the interceptor
// chain's context), or the caller presents a key the cache does not hold.
// Judged by its address instead, such a caller would answer for its
// neighbours' penalties, and a tenant rejected at the tap would never reach
// the interceptor to have its key cached; TapHandle hashes the key when the
// address's penalty makes that matter.
func (l *Limiter) tapIdentify(c *Call, table *tenant.Table) (ten *tenant.Tenant, found, ok bool, note keyNote) {
	if l.o.keyFunc != nil {
		return nil, false, false, noteNone
	}
	if id, ok := l.certTenant(c); ok {
		if ten, found := table.TenantByID(id); found {
			return ten, true, true, noteNone
		}
	}
	key, note := l.apiKey(c)
	if key != "" {
		ten, found := l.keys.lookup(table, key)
		return ten, found, found, noteNone
	}
	return table.Anonymous(), false, true, note
}

// decide decides one call into v, and returns the rejection when the call
// must not run. It allocates nothing for a caller whose route is cached.
// gated says the overload controller decides an admitted call next.
func (l *Limiter) decide(ctx context.Context, c *Call, gated bool, v *verdict) *entry {
	ten, found, note := l.identify(ctx, c, l.tables.Table())
	*v = verdict{r: l.route(ten, found, c), method: c.Method, dryRun: l.o.dryRun, gated: gated, note: note}
	v.prio = l.priority(c, v.r)
	return l.take(ctx, v)
}

// observe reports v's call to the observer, if there is one, as decided
// for reason, allowed or not; e holds what only the caller knows (the
// context, the rejection's delay, the controller's shed or wait).
func (l *Limiter) observe(v *verdict, reason Reason, allowed bool, e Event) {
	obs := l.o.observer
	if obs == nil {
		return
	}
	e.Method, e.Tier, e.Reason, e.Source, e.Allowed, e.DryRun = v.method, v.r.ten.Tier(), reason, v.res.Source, allowed, v.dryRun
	if v.r.found {
		e.Tenant = v.r.ten.ID()
	}
	obs(e)
}

// take takes the route's cost from its bucket and records the outcome
// in v. It returns the rejection when the call must not run.
func (l *Limiter) take(ctx context.Context, v *verdict) *entry {
	r := v.r
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
	switch {
	case err != nil:
		v.res = floodgate.Result{}
		// A key the store refuses for its length never fits: failing
		// open on it would leave its caller unlimited.
		v.allowed = !l.o.failClosed && !errors.Is(err, floodgate.ErrKeyTooLong)
		v.reason = ReasonStoreError
		l.c.storeErr.Add(1)
	case res.Allowed:
		v.res = res
		v.allowed = true
		v.reason = ReasonAdmitted
		l.c.admitted.Add(1)
	default:
		v.res = res
		v.allowed = false
		if scale < 1 {
			v.reason = ReasonOverload
			l.c.overload.Add(1)
		} else {
			v.reason = ReasonQuota
			l.c.quota.Add(1)
		}
	}
	if !v.allowed && v.dryRun {
		l.c.dryRun.Add(1)
	}
	var e *entry
	if !v.allowed && !v.dryRun {
		e = l.rej.lookup(v.reason, res.RetryAfter, v.note)
	}
	if !(v.allowed && v.gated) {
		ev := Event{Context: ctx}
		if e != nil {
			ev.RetryAfter = e.d
		}
		l.observe(v, v.reason, v.allowed, ev)
	}
	if e == nil {
		return nil
	}
	if f := l.o.rejected; f != nil {
		f(r.subject)
	}
	// The tap handle acts only while the gate sheds, so only then is the
	// retry delay worth a clock read to remember. A wait beyond the cap (or
	// Never) is remembered as the cap.
	if v.reason == ReasonOverload && res.RetryAfter > 0 {
		l.pen.note(r.subject, l.o.clock.Now().Add(min(res.RetryAfter, l.o.maxPushback)))
	}
	return e
}
