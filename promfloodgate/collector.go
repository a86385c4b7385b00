package promfloodgate

import (
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/internal/labels"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

const (
	// DefaultMaxTiers is the number of distinct tiers labelled when
	// WithMaxTiers is not given; later tiers are labelled "other".
	DefaultMaxTiers = 16
	// MaxMethods is the most methods WithMethods accepts.
	MaxMethods = labels.MaxMethods
	// DefaultLogInterval is the least time between two rejection log lines.
	DefaultLogInterval = time.Second
	// MaxTenantLabels is the largest cap WithTenantLabels accepts.
	MaxTenantLabels = labels.MaxTenants
	// MaxUnitLabels is the most units of metered quotas that label the
	// cost series as themselves; later units are labelled "other".
	MaxUnitLabels = labels.MaxUnits
	// MaxDebtBuckets is the most metered buckets floodgate_cost_debt
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

// An Option configures a Collector. New applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of floodgate.ErrInvalidOption).
type Option func(*options)

type options struct {
	keyed       KeyedMap
	gate        Gate
	overload    Controller
	registry    Registry
	methods     []string
	maxTiers    int
	maxTenants  int // 0: no tenant label
	logger      *slog.Logger
	logInterval time.Duration
	clock       floodgate.Clock
	offenders   *Offenders
}

// The sources a Collector reads at each scrape are small interfaces, so
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

// WithKeyed exports the in-memory store's size, evictions and overflow.
// A nil m, the default, exports none; a repeated call replaces m.
func WithKeyed(m KeyedMap) Option { return func(o *options) { o.keyed = m } }

// WithGate exports the CPU gate's scale, state, CPU and sampler source.
// A nil g, the default, exports none; a repeated call replaces g.
func WithGate(g Gate) Option { return func(o *options) { o.gate = g } }

// WithOverload exports the overload controller's signals, the values its
// log lines give for each change of state, so that a dashboard can say why
// calls were shed: its state, concurrency limit, calls in flight and
// waiting and the queue's cap, the latency of the latest step against its
// baseline, the queue target, the mean wait, the throughput, and the calls
// it admitted, made wait and shed by cause; and the calls that reached it
// without the tap handle (floodgate_overload_untapped_total), which should
// stay 0: a server wired without the tap handle (middleware's
// Limiter.ServerOptions installs it) lets calls queue where the controller
// cannot bound them. A nil c, the default, exports none; a repeated call
// replaces c.
func WithOverload(c Controller) Option { return func(o *options) { o.overload = c } }

// WithRegistry exports the tenant registry's config loads by outcome
// (applied, rejected) and the time the table in force was loaded, so that
// a dashboard shows a reload that failed, or one that never happened. A
// nil r, the default, exports none; a repeated call replaces r.
func WithRegistry(r Registry) Option { return func(o *options) { o.registry = r } }

// WithMethods sets the full method names ("/pkg.Svc/Method") that label
// decisions as themselves; every other method is labelled "other", so a
// client calling made-up methods cannot add series. ServiceMethods lists a
// service's methods. At most MaxMethods; repeated calls add to the list.
// The default is none: every method is "other".
func WithMethods(fullMethods ...string) Option {
	return func(o *options) { o.methods = append(o.methods, fullMethods...) }
}

// WithMaxTiers caps the distinct tier labels, in [1, 256]: the first n tiers
// seen label themselves, later ones "other". The default is DefaultMaxTiers;
// a repeated call replaces the cap.
func WithMaxTiers(n int) Option { return func(o *options) { o.maxTiers = n } }

// WithTenantLabels adds a tenant label to floodgate_decisions_total and the
// cost series (floodgate_cost_*), for at most n tenants, in [0,
// MaxTenantLabels]: the first n tenants seen label themselves, later ones
// "other", and anonymous callers "none". Tiers stay labelled as well. The
// default, 0, is no tenant label: every tenant multiplies the series by the
// methods and outcomes it meets, so keep n to the tenants an operator
// watches one by one. With the label, each decision also costs a map
// lookup of the tenant ID. A repeated call replaces the cap.
func WithTenantLabels(n int) Option { return func(o *options) { o.maxTenants = n } }

// WithLogger makes the observer log rejections to l at Warn, at most one line
// per interval (≥ 0; DefaultLogInterval when 0): the line names the latest
// rejection's reason, tier, tenant ("none" when anonymous) and method and
// counts the rejections not logged since the previous line ("suppressed").
// Never a key or an address: a tenant is a name from the operator's
// configuration, not a credential. A nil l, the default, logs nothing; a
// repeated call replaces both.
func WithLogger(l *slog.Logger, interval time.Duration) Option {
	return func(o *options) { o.logger, o.logInterval = l, interval }
}

// WithOffenders makes the observer feed f: the subject of each call the
// Limiter turned away (Offenders.RecordSubject), the tap handle's
// rejections included and dry-run ones, which run, not; and each metered
// call's settled cost, in its unit's cost ranking, by tenant
// (Offenders.ObserveCost). A nil f, the default, records none; a repeated
// call replaces f.
func WithOffenders(f *Offenders) Option { return func(o *options) { o.offenders = f } }

// WithClock sets the clock the rejection log's interval and the repayment
// of floodgate_cost_debt are measured on. A nil c, the default, reads
// time.Now, whose monotonic reading no step of the wall clock disturbs. A
// repeated call replaces c.
func WithClock(c floodgate.Clock) Option { return func(o *options) { o.clock = c } }

func (o *options) validate() error {
	if err := o.labels().Check("promfloodgate"); err != nil {
		return err
	}
	if o.logInterval < 0 {
		return invalid("WithLogger", o.logInterval, "an interval ≥ 0")
	}
	return nil
}

// labels returns what the decisions are labelled by.
func (o *options) labels() labels.Config {
	return labels.Config{Methods: o.methods, MaxTiers: o.maxTiers, MaxTenants: o.maxTenants}
}

// invalid is every configuration error: it wraps floodgate.ErrInvalidOption
// and names the option.
func invalid(option string, v any, want string) error {
	return fmt.Errorf("%w: promfloodgate: %s = %v, want %s", floodgate.ErrInvalidOption, option, v, want)
}

// ServiceMethods returns the full method names of a service's unary and
// streaming methods, for WithMethods.
func ServiceMethods(desc *grpc.ServiceDesc) []string { return labels.ServiceMethods(desc) }

// A Collector is a prometheus.Collector over floodgate's counters: the
// events its observer counts and the stats of the sources given to New.
// It is safe for concurrent use; register it once.
type Collector struct {
	o         options
	labels    *labels.Labeler
	decisions *prometheus.CounterVec
	// series finds a decision's counter without the CounterVec's hashing
	// and lock.
	series labels.Map[labels.Series, prometheus.Counter]
	// costs are the metered calls' counters, by cost series.
	costs                                  labels.Map[labels.CostSeries, *costCounters]
	reserved, settled, refunded, uncharged *prometheus.CounterVec
	// debts are what the metered buckets owe, as last seen.
	debts *labels.Debts
	debt  *prometheus.Desc
	// counts are the events no series above holds: the tap handle's
	// rejections, exempt calls, ignored API keys.
	counts labels.Counts

	nextLog    atomic.Int64 // ns since logBase before which rejections are not logged
	logBase    time.Time    // read from the clock at New: monotonic by default
	suppressed atomic.Uint64

	descs descs
}

type descs struct {
	tap, exempt, keysIgnored                         *prometheus.Desc
	keys, evictions, evictedNotFull, overflowed      *prometheus.Desc
	scale, state, cpu, cpuSmoothed, source, failures *prometheus.Desc

	ovState, ovLimit, ovInflight, ovQueued, ovRTT, ovBaseline *prometheus.Desc
	ovQueueCap, ovAdmitted, ovShed                            *prometheus.Desc
	ovTarget, ovThroughput                                    *prometheus.Desc
	ovWait, ovUntapped                                        *prometheus.Desc

	configLoads, configLoaded *prometheus.Desc
}

// New returns a Collector configured by opts, or an error wrapping
// floodgate.ErrInvalidOption that names the option. Only the sources
// passed are exported.
func New(opts ...Option) (*Collector, error) {
	o := options{maxTiers: DefaultMaxTiers}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.logInterval == 0 {
		o.logInterval = DefaultLogInterval
	}
	if o.clock == nil {
		o.clock = floodgate.ClockFunc(time.Now)
	}
	c := &Collector{o: o, labels: labels.NewLabeler(o.labels()), logBase: o.clock.Now()}
	names := labels.Names[:len(labels.Names)-1]
	if c.labels.Tenants() {
		names = labels.Names
	}
	c.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "floodgate_decisions_total",
		Help: "Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.",
	}, names)

	costNames := labels.CostNames[:len(labels.CostNames)-1]
	if c.labels.Tenants() {
		costNames = labels.CostNames
	}
	costVec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_cost_" + name, Help: help}, costNames)
	}
	c.reserved = costVec("reserved_total", "Units metered calls reserved, their estimates and their streams' chunks, counted as they settle, by unit, tier, method and, opt-in, tenant.")
	c.settled = costVec("settled_total", "Units metered calls were settled at, as they ended: the cost they reported, or their estimate when they reported none.")
	c.refunded = costVec("refunded_total", "Units metered calls reserved beyond the cost they settled at, given back to their buckets (a bucket keeps what fits under its burst).")
	c.uncharged = costVec("uncharged_total", "Units of settles that their buckets' debt limits left uncharged: the only units a metered quota does not count.")
	c.debts = labels.NewDebts(c.labels, o.clock)
	debtNames := labels.DebtNames[:len(labels.DebtNames)-1]
	if c.labels.Tenants() {
		debtNames = labels.DebtNames
	}
	c.debt = prometheus.NewDesc("floodgate_cost_debt", "Units the tenant's metered bucket owes, as last seen by this process, less what refill has repaid since, by unit, tier and, opt-in, tenant.", debtNames, nil)

	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("floodgate_"+name, help, labels, nil)
	}
	c.descs = descs{
		exempt:         d("exempt_total", "Calls to exempt methods, which take no tokens and are not in floodgate_decisions_total."),
		tap:            d("tap_rejections_total", "Calls rejected by the tap handle before their request was read."),
		keysIgnored:    d("api_keys_ignored_total", "Decisions of calls whose API key header the limiter ignored, judging the caller anonymous, by reason: repeated (more than one value) or too_long.", "reason"),
		keys:           d("keyed_keys", "Buckets the in-memory store tracks."),
		evictions:      d("keyed_evictions_total", "Buckets dropped to make room for new keys."),
		evictedNotFull: d("keyed_evicted_not_full_total", "Evicted buckets that had not refilled: each handed a client a fresh burst."),
		overflowed:     d("keyed_overflowed_total", "Takes by new keys decided by a shard's shared overflow bucket: the capacity is too small."),
		scale:          d("gate_scale", "Factor the CPU gate multiplies every limit by, in (0, 1]."),
		state:          d("gate_state", "1 for the CPU gate's current state, 0 for the others.", "state"),
		cpu:            d("gate_cpu_ratio", "Latest CPU reading, as a fraction of the CPU available to the process."),
		cpuSmoothed:    d("gate_cpu_smoothed_ratio", "Exponential moving average of the CPU readings (time constant 1s)."),
		source:         d("gate_sampler_info", "The CPU sampler's source, as a label, from the first reading on; the value is 1.", "source"),
		failures:       d("gate_sample_failures_total", "Failed CPU samples."),
		ovState:        d("overload_state", "1 for the overload controller's current state (open, shedding), 0 for the other.", "state"),
		ovLimit:        d("overload_limit", "The overload controller's concurrency limit: calls it lets run at once."),
		ovInflight:     d("overload_inflight", "Calls holding one of the overload controller's slots."),
		ovQueued:       d("overload_queued", "Calls waiting for one of the overload controller's slots."),
		ovQueueCap:     d("overload_queue_cap", "Calls that may wait for one of the overload controller's slots before calls are shed."),
		ovRTT:          d("overload_latency_seconds", "Mean service time of the calls completed in the overload controller's latest step, from admission to completion."),
		ovBaseline:     d("overload_baseline_seconds", "The least mean service time of the overload controller's recent steps: what a call costs when it does not queue."),
		ovTarget:       d("overload_queue_target_seconds", "The overload controller's queue target: a call waits for a slot at most twice this long."),
		ovThroughput:   d("overload_throughput", "Calls per second the overload controller's admitted calls complete, smoothed: while calls are shed, the server's capacity."),
		ovWait:         d("overload_wait_seconds", "Mean wait for a slot of the calls that waited in the overload controller's latest step."),
		ovAdmitted:     d("overload_admitted_total", "Calls the overload controller admitted, by whether they waited for a slot.", "waited"),
		ovShed:         d("overload_shed_total", "Calls the overload controller shed, by cause (queue_full, displaced, wait_timeout, deadline, tap).", "cause"),
		ovUntapped:     d("overload_untapped_total", "Calls that reached the overload controller without the tap handle counting them as they entered: a server wired without the tap handle, whose calls can queue where the controller cannot bound them. It should stay 0."),
		configLoads:    d("config_loads_total", "Loads of the tenant config by outcome: applied (a new table put in force) or rejected (unreadable or invalid; the table in force stays).", "outcome"),
		configLoaded:   d("config_loaded_timestamp_seconds", "When the tenant table in force was put in force, in Unix seconds; 0 while no config has loaded."),
	}
	return c, nil
}

// Observer returns the function to pass to middleware.WithObserver, the
// source of every series but those of the sources given to New. It counts
// each decision, the tap handle's rejections, exempt calls and ignored API
// keys, and each metered call's settle in the cost series, and notes what
// metered buckets owe (floodgate_cost_debt), allocating nothing but a
// series' first counters, a bucket's entry as it is first seen in debt
// (and, with WithOffenders, a subject's string as it enters a ranking); a
// rejection may also be logged (WithLogger).
func (c *Collector) Observer() func(middleware.Event) { return c.observe }

func (c *Collector) observe(e middleware.Event) {
	c.debts.Observe(e)
	c.counts.Observe(e)
	if e.Reason == middleware.ReasonSettled {
		c.observeCost(e)
		return
	}
	if f := c.o.offenders; f != nil && !e.Allowed && !e.DryRun {
		f.RecordSubject(e.Subject)
	}
	k, v, ok := c.labels.Series(e)
	if !ok {
		return
	}
	ctr, ok := c.series.Get(k)
	if !ok {
		ctr, _ = c.series.Add(k, math.MaxInt, func(int) prometheus.Counter {
			return c.decisions.WithLabelValues(c.labels.Labels(k, v)...)
		})
	}
	ctr.Inc()
	if !e.Allowed && c.o.logger != nil {
		c.logRejection(e)
	}
}

// costCounters are one cost series' counters.
type costCounters struct{ reserved, settled, refunded, uncharged prometheus.Counter }

// observeCost counts a metered call's settle.
func (c *Collector) observeCost(e middleware.Event) {
	if f := c.o.offenders; f != nil {
		f.ObserveCost(e)
	}
	k, v, ok := c.labels.Cost(e)
	if !ok {
		return
	}
	cc, ok := c.costs.Get(k)
	if !ok {
		cc, _ = c.costs.Add(k, math.MaxInt, func(int) *costCounters {
			lv := c.labels.CostLabels(v)
			return &costCounters{c.reserved.WithLabelValues(lv...), c.settled.WithLabelValues(lv...),
				c.refunded.WithLabelValues(lv...), c.uncharged.WithLabelValues(lv...)}
		})
	}
	cc.reserved.Add(float64(max(e.Reserved, 0)))
	cc.settled.Add(float64(max(e.Settled, 0)))
	if e.Reserved > e.Settled {
		cc.refunded.Add(float64(e.Reserved - max(e.Settled, 0)))
	}
	if e.Uncharged > 0 {
		cc.uncharged.Add(float64(e.Uncharged))
	}
}

// logRejection logs e unless a line was logged less than an interval ago, in
// which case it counts e as suppressed.
func (c *Collector) logRejection(e middleware.Event) {
	// Time since New, on the monotonic clock unless WithClock set another:
	// a wall clock stepped back must not silence the log.
	now := int64(c.o.clock.Now().Sub(c.logBase))
	next := c.nextLog.Load()
	if now < next && next-now <= int64(c.o.logInterval) || !c.nextLog.CompareAndSwap(next, now+int64(c.o.logInterval)) {
		c.suppressed.Add(1)
		return
	}
	tier, tenant := e.Tier, e.Tenant
	if tier == "" {
		tier = LabelNone
	}
	if tenant == "" {
		tenant = LabelNone
	}
	c.o.logger.Warn("floodgate: call rejected", "reason", e.Reason.String(), "tier", tier, "tenant", tenant,
		"method", c.labels.Method(e.Method).Value, "tap", e.Tap, "dry_run", e.DryRun,
		"suppressed", c.suppressed.Swap(0))
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.decisions.Describe(ch)
	for _, v := range []*prometheus.CounterVec{c.reserved, c.settled, c.refunded, c.uncharged} {
		v.Describe(ch)
	}
	ch <- c.debt
	ch <- c.descs.tap
	ch <- c.descs.exempt
	ch <- c.descs.keysIgnored
	if c.o.keyed != nil {
		ch <- c.descs.keys
		ch <- c.descs.evictions
		ch <- c.descs.evictedNotFull
		ch <- c.descs.overflowed
	}
	if c.o.gate != nil {
		for _, d := range []*prometheus.Desc{c.descs.scale, c.descs.state, c.descs.cpu, c.descs.cpuSmoothed, c.descs.source, c.descs.failures} {
			ch <- d
		}
	}
	if c.o.overload != nil {
		for _, d := range []*prometheus.Desc{c.descs.ovState, c.descs.ovLimit, c.descs.ovInflight, c.descs.ovQueued, c.descs.ovQueueCap,
			c.descs.ovRTT, c.descs.ovBaseline, c.descs.ovTarget, c.descs.ovThroughput, c.descs.ovWait, c.descs.ovAdmitted, c.descs.ovShed,
			c.descs.ovUntapped} {
			ch <- d
		}
	}
	if c.o.registry != nil {
		ch <- c.descs.configLoads
		ch <- c.descs.configLoaded
	}
}

// Collect implements prometheus.Collector. Decision series appear once
// their count is non-zero.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.decisions.Collect(ch)
	for _, v := range []*prometheus.CounterVec{c.reserved, c.settled, c.refunded, c.uncharged} {
		v.Collect(ch)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	c.debts.Each(func(v labels.DebtValues, owed float64) { gauge(c.debt, owed, c.labels.DebtLabels(v)...) })
	counter(c.descs.tap, c.counts.Tap.Load())
	counter(c.descs.exempt, c.counts.Exempt.Load())
	for i, reason := range labels.KeysIgnored {
		counter(c.descs.keysIgnored, c.counts.KeysIgnored[i].Load(), reason)
	}
	if m := c.o.keyed; m != nil {
		st := m.Stats()
		gauge(c.descs.keys, float64(m.Len()))
		counter(c.descs.evictions, st.Evictions)
		counter(c.descs.evictedNotFull, st.EvictedNotFull)
		counter(c.descs.overflowed, st.Overflowed)
	}
	if g := c.o.gate; g != nil {
		s := g.Snapshot()
		gauge(c.descs.scale, s.Scale)
		for _, st := range []cpugate.State{cpugate.Open, cpugate.Shedding, cpugate.Ramping} {
			v := 0.0
			if st == s.State {
				v = 1
			}
			gauge(c.descs.state, v, st.String())
		}
		gauge(c.descs.cpu, s.CPU)
		gauge(c.descs.cpuSmoothed, s.Smoothed)
		if s.Source != "" {
			gauge(c.descs.source, 1, s.Source)
		}
		counter(c.descs.failures, s.Failures)
	}
	if ov := c.o.overload; ov != nil {
		s := ov.Snapshot()
		for _, st := range []overload.State{overload.Open, overload.Shedding} {
			gauge(c.descs.ovState, b2f(st == s.State), st.String())
		}
		gauge(c.descs.ovLimit, s.Limit)
		gauge(c.descs.ovInflight, float64(s.Inflight))
		gauge(c.descs.ovQueued, float64(s.Queued))
		gauge(c.descs.ovQueueCap, float64(s.QueueCap))
		gauge(c.descs.ovRTT, s.Latency.Seconds())
		gauge(c.descs.ovBaseline, s.Baseline.Seconds())
		gauge(c.descs.ovTarget, s.Target.Seconds())
		gauge(c.descs.ovThroughput, s.Throughput)
		gauge(c.descs.ovWait, s.Wait.Seconds())
		counter(c.descs.ovAdmitted, s.Admitted-s.Waited, "false")
		counter(c.descs.ovAdmitted, s.Waited, "true")
		for _, cause := range overload.ShedCauses() {
			counter(c.descs.ovShed, s.ShedBy(cause), cause.String())
		}
		counter(c.descs.ovUntapped, s.Untapped)
	}
	if r := c.o.registry; r != nil {
		st := r.Stats()
		counter(c.descs.configLoads, st.Applied, "applied")
		counter(c.descs.configLoads, st.Rejected, "rejected")
		at := 0.0
		if !st.LoadedAt.IsZero() {
			at = float64(st.LoadedAt.UnixNano()) / 1e9
		}
		gauge(c.descs.configLoaded, at)
	}
}

// b2f returns 1 for true, 0 for false.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
