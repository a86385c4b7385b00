package otelfloodgate

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/internal/labels"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// ScopeName is the instrumentation scope of the meters this package makes.
const ScopeName = "github.com/floodgate-go/floodgate/otelfloodgate"

const (
	// DefaultMaxTiers is the number of distinct tiers labelled when
	// WithMaxTiers is not given; later tiers are labelled "other".
	DefaultMaxTiers = 16
	// MaxMethods is the most methods WithMethods accepts.
	MaxMethods = labels.MaxMethods
	// MaxTenantLabels is the largest cap WithTenantLabels accepts.
	MaxTenantLabels = labels.MaxTenants
	// MaxUnitLabels is the most units of metered quotas whose cost
	// instruments carry their own unit attribute; later units are "other".
	MaxUnitLabels = labels.MaxUnits
	// MaxDebtBuckets is the most metered buckets floodgate.cost.debt
	// follows; a bucket newly seen in debt beyond them takes the place of
	// the one seen longest ago.
	MaxDebtBuckets = labels.MaxDebts

	// LabelOther labels a method not registered with WithMethods, a tier
	// beyond the WithMaxTiers cap, a tenant beyond the WithTenantLabels
	// cap, or a unit beyond MaxUnitLabels.
	LabelOther = labels.Other
	// LabelNone labels the tier and tenant of an anonymous caller, and the
	// source of a decision no store made (a store error, the tap handle).
	LabelNone = labels.None
)

// An Option configures a Recorder. New applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of floodgate.ErrInvalidOption).
type Option func(*options)

type options struct {
	keyed      KeyedMap
	gate       Gate
	overload   Controller
	registry   Registry
	methods    []string
	maxTiers   int
	maxTenants int
	noSpans    bool
	clock      floodgate.Clock
}

// The sources a Recorder reads at each collection are small interfaces, so
// that a wrapper or a test's fake can stand in for floodgate's own types.
type (
	// A KeyedMap is an in-memory store, such as *keyed.Map.
	KeyedMap interface {
		Len() int
		Stats() keyed.Stats
	}
	// A Gate is a CPU gate, such as *cpugate.Gate.
	Gate interface{ Snapshot() cpugate.Snapshot }
	// A Controller is an overload controller, such as *overload.Controller.
	Controller interface{ Snapshot() overload.Snapshot }
	// A Registry is a tenant registry, such as *tenant.Registry.
	Registry interface{ Stats() tenant.Stats }
)

// WithKeyed records the in-memory store's size, evictions and overflow.
// A nil m, the default, records none; a repeated call replaces m.
func WithKeyed(m KeyedMap) Option { return func(o *options) { o.keyed = m } }

// WithGate records the CPU gate's scale, state, CPU and sampler source.
// A nil g, the default, records none; a repeated call replaces g.
func WithGate(g Gate) Option { return func(o *options) { o.gate = g } }

// WithOverload records the overload controller's state, limit, calls in
// flight and waiting, latencies, throughput, the calls it admitted and
// shed, and the calls that reached it without the tap handle
// (floodgate.overload.untapped), which should stay 0: a server wired
// without the tap handle (middleware's Limiter.ServerOptions installs it)
// lets calls queue where the controller cannot bound them. A nil c, the
// default, records none; a repeated call replaces c.
func WithOverload(c Controller) Option { return func(o *options) { o.overload = c } }

// WithRegistry records the tenant registry's config loads and when the
// table in force was loaded. A nil r, the default, records none; a
// repeated call replaces r.
func WithRegistry(r Registry) Option { return func(o *options) { o.registry = r } }

// WithMethods sets the full method names ("/pkg.Svc/Method") whose
// decisions carry their own method attribute; every other method is
// "other". At most MaxMethods; repeated calls add to the list. The default
// is none. ServiceMethods lists a service's methods.
func WithMethods(fullMethods ...string) Option {
	return func(o *options) { o.methods = append(o.methods, fullMethods...) }
}

// WithMaxTiers caps the distinct tier attributes, in [1, 256]: the first n
// tiers seen are themselves, later ones "other". The default is
// DefaultMaxTiers; a repeated call replaces the cap.
func WithMaxTiers(n int) Option { return func(o *options) { o.maxTiers = n } }

// WithTenantLabels adds a tenant attribute to floodgate.decisions and the
// cost instruments (floodgate.cost.*) for the first n tenants seen, in [0,
// MaxTenantLabels]; later ones are "other", anonymous callers "none". The
// default, 0, is no tenant attribute. A repeated call replaces the cap.
func WithTenantLabels(n int) Option { return func(o *options) { o.maxTenants = n } }

// WithSpanEvents sets whether the observer adds events to the call's span
// (see the package doc, Span events). The default is true; a repeated
// call replaces the setting.
func WithSpanEvents(on bool) Option { return func(o *options) { o.noSpans = !on } }

// WithClock sets the clock the repayment of floodgate.cost.debt is
// measured on. A nil c, the default, reads time.Now. A repeated call
// replaces c.
func WithClock(c floodgate.Clock) Option { return func(o *options) { o.clock = c } }

// labels returns what the decisions are labelled by.
func (o *options) labels() labels.Config {
	return labels.Config{Methods: o.methods, MaxTiers: o.maxTiers, MaxTenants: o.maxTenants}
}

// ServiceMethods returns the full method names of a service's unary and
// streaming methods, for WithMethods.
func ServiceMethods(desc *grpc.ServiceDesc) []string { return labels.ServiceMethods(desc) }

// A Recorder records the Limiter's decisions as OpenTelemetry metrics and
// span events, and the state of the sources given to New as observable
// instruments read at each collection. It is safe for concurrent use; Close
// unregisters its callback.
type Recorder struct {
	o      options
	labels *labels.Labeler
	// series holds each decision series' count, reported at collection,
	// and costs each cost series' sums.
	series labels.Map[labels.Series, *counter]
	costs  labels.Map[labels.CostSeries, *costCounter]
	debts  *labels.Debts // what the metered buckets owe, as last seen
	// counts are the events no series above holds: the tap handle's
	// rejections, exempt calls, ignored API keys.
	counts labels.Counts
	obs    observables
	reg    metric.Registration
	close  sync.Once
}

// New returns a Recorder whose instruments come from mp's meter (nil: the
// global otel.GetMeterProvider()), or an error: one wrapping
// floodgate.ErrInvalidOption that names an invalid option, or the meter's.
func New(mp metric.MeterProvider, opts ...Option) (*Recorder, error) {
	o := options{maxTiers: DefaultMaxTiers}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.labels().Check("otelfloodgate"); err != nil {
		return nil, err
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if o.clock == nil {
		o.clock = floodgate.ClockFunc(time.Now)
	}
	m := mp.Meter(ScopeName)
	r := &Recorder{o: o, labels: labels.NewLabeler(o.labels())}
	r.debts = labels.NewDebts(r.labels, o.clock)
	var err error
	if r.reg, err = r.obs.register(m, &r.o, r.labels, &r.counts, &r.series, &r.costs, r.debts); err != nil {
		return nil, err
	}
	return r, nil
}

// Observer returns the function to pass to middleware.WithObserver, the
// source of every instrument but those of the sources given to New. It
// counts each decision, the tap handle's rejections, exempt calls and
// ignored API keys, sums each metered call's settle in the cost
// instruments and notes what metered buckets owe (floodgate.cost.debt),
// allocating nothing but a series' first attribute set and a bucket's
// entry as it is first seen in debt, and adds span events to a recording
// span in the call's context.
func (r *Recorder) Observer() func(middleware.Event) { return r.observe }

// A counter is one decision series' count and its attribute set, made
// once. Counting in process and reporting the counts through an
// asynchronous counter costs an atomic add a decision, where the SDK's
// synchronous Add hashes the series' seven attributes each time.
type counter struct {
	n   atomic.Int64
	set metric.MeasurementOption
}

func (r *Recorder) observe(e middleware.Event) {
	r.debts.Observe(e)
	r.counts.Observe(e)
	if e.Reason == middleware.ReasonSettled {
		r.observeCost(e)
		return
	}
	if !r.o.noSpans {
		spanEvent(e)
	}
	k, v, ok := r.labels.Series(e)
	if !ok {
		return
	}
	c, ok := r.series.Get(k)
	if !ok {
		c, _ = r.series.Add(k, math.MaxInt, func(int) *counter {
			return &counter{set: metric.WithAttributeSet(r.attributes(k, v))}
		})
	}
	c.n.Add(1)
}

// A costCounter is one cost series' sums and its attribute set, made
// once, counted as counter's counts are.
type costCounter struct {
	reserved, settled, refunded, uncharged atomic.Int64
	set                                    metric.MeasurementOption
}

// observeCost sums a metered call's settle.
func (r *Recorder) observeCost(e middleware.Event) {
	k, v, ok := r.labels.Cost(e)
	if !ok {
		return
	}
	c, ok := r.costs.Get(k)
	if !ok {
		c, _ = r.costs.Add(k, math.MaxInt, func(int) *costCounter {
			values := r.labels.CostLabels(v)
			kvs := make([]attribute.KeyValue, len(values))
			for i, val := range values {
				kvs[i] = attribute.String(labels.CostNames[i], val)
			}
			return &costCounter{set: metric.WithAttributeSet(attribute.NewSet(kvs...))}
		})
	}
	c.reserved.Add(max(e.Reserved, 0))
	c.settled.Add(max(e.Settled, 0))
	if e.Reserved > e.Settled {
		c.refunded.Add(e.Reserved - max(e.Settled, 0))
	}
	if e.Uncharged > 0 {
		c.uncharged.Add(e.Uncharged)
	}
}

// attributes returns the attribute set of series k, whose tier, method and
// tenant are v.
func (r *Recorder) attributes(k labels.Series, v labels.Values) attribute.Set {
	values := r.labels.Labels(k, v)
	kvs := make([]attribute.KeyValue, len(values))
	for i, val := range values {
		kvs[i] = attribute.String(labels.Names[i], val)
	}
	return attribute.NewSet(kvs...)
}

// Close unregisters the callback of the observable instruments; the
// observer keeps counting decisions. It is idempotent.
func (r *Recorder) Close() error {
	var err error
	r.close.Do(func() { err = r.reg.Unregister() })
	return err
}
