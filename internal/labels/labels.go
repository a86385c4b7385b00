// Package labels labels the Limiter's decisions for floodgate's metric
// exporters (promfloodgate, otelfloodgate) from bounded sets, so that no
// caller can add series: methods registered up front, the first tiers and
// tenants seen, "other" beyond them and "none" for no value. Its tables are
// read without a lock on every decision.
package labels

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
)

const (
	// Other labels a method not registered, or a tier or tenant beyond its
	// cap.
	Other = "other"
	// None labels the tier and tenant of an anonymous caller, and the
	// source of a decision no store made.
	None = "none"

	// MaxMethods is the most methods a Labeler takes.
	MaxMethods = 1024
	// MaxTiers is the largest tier cap.
	MaxTiers = 256
	// MaxTenants is the largest tenant cap.
	MaxTenants = 1024
	// MaxUnits is the most units of metered quotas labelled as
	// themselves; later ones are "other".
	MaxUnits = 16
)

// Sources label the source: none, then floodgate.Source values in order
// (named as in the Redis store's fallback series), then any newer source.
var Sources = [...]string{None, "memory", "redis", "cache", "lease", "fallback", "fail_open", "fail_closed", "unknown"}

// A Map is read without a lock and copied on every write: the observers'
// tables take a bounded number of entries, each once, and are read on
// every call.
type Map[K comparable, V any] struct {
	mu sync.Mutex // serializes writers
	m  atomic.Pointer[map[K]V]
}

// Load returns the map in force; the caller must not modify it.
func (c *Map[K, V]) Load() map[K]V {
	if m := c.m.Load(); m != nil {
		return *m
	}
	return nil
}

// Get returns what k holds.
func (c *Map[K, V]) Get(k K) (V, bool) {
	v, ok := c.Load()[k]
	return v, ok
}

// Add stores newV(entries) under k unless k is present or the map holds
// max entries, and returns what k holds then.
func (c *Map[K, V]) Add(k K, max int, newV func(n int) V) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.Load()
	if v, ok := old[k]; ok || len(old) >= max {
		return v, ok
	}
	v := newV(len(old))
	next := make(map[K]V, len(old)+1)
	maps.Copy(next, old)
	next[k] = v
	c.m.Store(&next)
	return v, true
}

// A Label is a label value and a number that stands for it in a series'
// key, cheaper to hash than the value.
type Label struct {
	Value string
	ID    int
}

// capped labels the first max values it is given as themselves and later
// ones "other"; the empty value is "none".
type capped struct {
	max  int
	seen Map[string, Label]
}

var (
	labelNone  = Label{None, 0}
	labelOther = Label{Other, 1}
)

func (c *capped) label(v string) Label {
	if v == "" {
		return labelNone
	}
	if l, ok := c.seen.Get(v); ok {
		return l
	}
	// Values past the cap are common to every later event of theirs: they
	// must not take the lock each time.
	if len(c.seen.Load()) >= c.max {
		return labelOther
	}
	// A copy, so the label does not pin a reloaded-away table's strings.
	v = strings.Clone(v)
	if l, ok := c.seen.Add(v, c.max, func(n int) Label { return Label{Valid(v), n + 2} }); ok {
		return l
	}
	return labelOther
}

// Valid returns s with invalid UTF-8 replaced: a label value that is not
// valid UTF-8 fails a whole Prometheus scrape. Names from a validated
// tenant table always are; an observer fed by other code may pass anything.
func Valid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// A Series is a decision's labels as numbers: two events whose labels come
// out alike have equal Series, and share a counter.
type Series struct {
	Reason               middleware.Reason
	Code                 codes.Code // the rejection's, OK for a call that runs
	Allowed, DryRun, Tap bool
	Source               int // index in Sources
	Tier, Method, Tenant int // label ids
}

// Values are the label values of a decision's tier, method and tenant
// ("" when tenants are not labelled).
type Values struct{ Tier, Method, Tenant string }

// Config is what a Labeler labels by, as the exporters' options give it.
type Config struct {
	Methods              []string
	MaxTiers, MaxTenants int // MaxTenants 0: no tenant label
}

// Check returns an error wrapping floodgate.ErrInvalidOption that names
// the first invalid field by its option in package pkg, or nil.
func (c Config) Check(pkg string) error {
	invalid := func(option string, v any, want string) error {
		return fmt.Errorf("%w: %s: %s = %v, want %s", floodgate.ErrInvalidOption, pkg, option, v, want)
	}
	for _, m := range c.Methods {
		if m == "" || m[0] != '/' || !utf8.ValidString(m) {
			return invalid("WithMethods", fmt.Sprintf("%q", m), "a full method name")
		}
	}
	switch {
	case len(c.Methods) > MaxMethods:
		return invalid("WithMethods", fmt.Sprintf("%d methods", len(c.Methods)), fmt.Sprint("at most ", MaxMethods))
	case c.MaxTiers < 1 || c.MaxTiers > MaxTiers:
		return invalid("WithMaxTiers", c.MaxTiers, fmt.Sprintf("in [1, %d]", MaxTiers))
	case c.MaxTenants < 0 || c.MaxTenants > MaxTenants:
		return invalid("WithTenantLabels", c.MaxTenants, fmt.Sprintf("in [0, %d]", MaxTenants))
	}
	return nil
}

// A Labeler labels decisions. It is safe for concurrent use.
type Labeler struct {
	cfg     Config
	methods map[string]Label // registered full method → its label
	tiers   capped
	tenants capped
	units   capped
}

// NewLabeler returns a Labeler for a checked cfg.
func NewLabeler(cfg Config) *Labeler {
	l := &Labeler{cfg: cfg, methods: make(map[string]Label),
		tiers: capped{max: cfg.MaxTiers}, tenants: capped{max: cfg.MaxTenants}, units: capped{max: MaxUnits}}
	for _, m := range cfg.Methods {
		if _, ok := l.methods[m]; !ok {
			l.methods[m] = Label{m, len(l.methods) + 1} // 0 is "other"
		}
	}
	return l
}

// Tenants reports whether decisions are labelled by tenant.
func (l *Labeler) Tenants() bool { return l.cfg.MaxTenants > 0 }

// Method returns the label of a method: its name if registered.
func (l *Labeler) Method(method string) Label {
	if m, ok := l.methods[method]; ok {
		return m
	}
	return Label{Other, 0}
}

// Series returns the series of e and its tier, method and tenant values,
// or false for an event that is no limiting decision (an exempt call,
// middleware.ReasonExempt, and a metered call's settle,
// middleware.ReasonSettled) and for a reason newer than the Labeler, which
// are not counted. Its code is the rejection's (Event.Rejection), OK for a
// call that runs. It allocates nothing but a tier's or tenant's first
// label.
func (l *Labeler) Series(e middleware.Event) (Series, Values, bool) {
	switch e.Reason {
	case middleware.ReasonAdmitted, middleware.ReasonQuota, middleware.ReasonOverload, middleware.ReasonStoreError,
		middleware.ReasonDebt, middleware.ReasonInvalidEstimate, middleware.ReasonGate:
	default:
		return Series{}, Values{}, false
	}
	tier, method, tenant := l.tiers.label(e.Tier), l.Method(e.Method), l.tenant(e.Tenant)
	k := Series{Reason: e.Reason, Code: codes.OK, Allowed: e.Allowed, DryRun: e.DryRun, Tap: e.Tap,
		Tier: tier.ID, Method: method.ID, Tenant: tenant.ID}
	if e.Rejection != nil {
		k.Code = e.Rejection.Code
	}
	// Only the interceptors' decisions were made by a store: a bucket's
	// answer, scaled by the CPU gate or not, or a metered quota's debt.
	switch e.Reason {
	case middleware.ReasonAdmitted, middleware.ReasonQuota, middleware.ReasonOverload, middleware.ReasonDebt, middleware.ReasonGate:
		if !e.Tap {
			k.Source = 1 + min(int(e.Source), len(Sources)-2)
		}
	}
	return k, Values{tier.Value, method.Value, tenant.Value}, true
}

// tenant returns the label of a tenant ID, the zero Label when tenants
// are not labelled.
func (l *Labeler) tenant(id string) Label {
	if l.cfg.MaxTenants == 0 {
		return Label{}
	}
	return l.tenants.label(id)
}

// Names are the decision labels' names, in the order of Labels' values;
// tenant last, only when decisions are labelled by tenant.
var Names = []string{"outcome", "reason", "code", "source", "tier", "method", "stage", "tenant"}

// Labels returns the label values of series k, whose tier, method and
// tenant values are v, in the order of Names.
func (l *Labeler) Labels(k Series, v Values) []string {
	outcome, stage := "admitted", "interceptor"
	switch {
	case k.Allowed:
	case k.DryRun:
		outcome = "dry_run_rejected"
	default:
		outcome = "rejected"
	}
	if k.Tap {
		stage = "tap"
	}
	labels := []string{outcome, k.Reason.String(), k.Code.String(), Sources[k.Source], v.Tier, v.Method, stage}
	if l.cfg.MaxTenants > 0 {
		labels = append(labels, v.Tenant)
	}
	return labels
}

// ServiceMethods returns the full method names of a service's unary and
// streaming methods.
func ServiceMethods(desc *grpc.ServiceDesc) []string {
	var out []string
	for _, m := range desc.Methods {
		out = append(out, "/"+desc.ServiceName+"/"+m.MethodName)
	}
	for _, s := range desc.Streams {
		out = append(out, "/"+desc.ServiceName+"/"+s.StreamName)
	}
	return out
}

// A CostSeries is the labels of a metered call's cost as numbers: the
// quota's unit, and the call's tier, method and tenant. Calls whose labels
// come out alike share its counts.
type CostSeries struct{ Unit, Tier, Method, Tenant int }

// CostValues are a CostSeries' label values ("" tenant when tenants are
// not labelled).
type CostValues struct{ Unit, Tier, Method, Tenant string }

// CostNames are the cost labels' names, in the order of CostLabels'
// values; tenant last, only when tenants are labelled.
var CostNames = []string{"unit", "tier", "method", "tenant"}

// Cost returns the cost series of e, a metered call's settle
// (middleware.ReasonSettled), or false for any other event. The unit is
// one of the first MaxUnits seen, or "other". It allocates nothing but a
// unit's, tier's or tenant's first label.
func (l *Labeler) Cost(e middleware.Event) (CostSeries, CostValues, bool) {
	if e.Reason != middleware.ReasonSettled || e.Unit == "" {
		return CostSeries{}, CostValues{}, false
	}
	unit, tier, method, tenant := l.units.label(e.Unit), l.tiers.label(e.Tier), l.Method(e.Method), l.tenant(e.Tenant)
	return CostSeries{unit.ID, tier.ID, method.ID, tenant.ID}, CostValues{unit.Value, tier.Value, method.Value, tenant.Value}, true
}

// CostLabels returns v in the order of CostNames.
func (l *Labeler) CostLabels(v CostValues) []string {
	labels := []string{v.Unit, v.Tier, v.Method}
	if l.cfg.MaxTenants > 0 {
		labels = append(labels, v.Tenant)
	}
	return labels
}
