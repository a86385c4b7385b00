package otelfloodgate

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/internal/labels"
	"github.com/floodgate-go/floodgate/overload"
)

// A builder makes a meter's observable instruments, keeping them for the
// callback's registration and the first error.
type builder struct {
	m     metric.Meter
	insts []metric.Observable
	err   error
}

func (b *builder) keep(i metric.Observable, err error) {
	b.insts = append(b.insts, i)
	b.fail(err)
}

// fail keeps err, if not nil.
func (b *builder) fail(err error) { b.err = errors.Join(b.err, err) }

func (b *builder) counter(name, unit, desc string) metric.Int64ObservableCounter {
	i, err := b.m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(i, err)
	return i
}

func (b *builder) gauge(name, unit, desc string) metric.Int64ObservableGauge {
	i, err := b.m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(i, err)
	return i
}

func (b *builder) float(name, unit, desc string) metric.Float64ObservableGauge {
	i, err := b.m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(i, err)
	return i
}

// register registers f for the instruments made, unless one failed.
func (b *builder) register(f metric.Callback) (metric.Registration, error) {
	if b.err != nil {
		return nil, b.err
	}
	return b.m.RegisterCallback(f, b.insts...)
}

// with returns the measurement option of the one attribute key=value.
func with(key, value string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String(key, value)))
}

// withEach returns the measurement options of key=each value, in order.
func withEach(key string, values ...string) []metric.MeasurementOption {
	out := make([]metric.MeasurementOption, len(values))
	for i, v := range values {
		out[i] = with(key, v)
	}
	return out
}

// b2i returns 1 for true, 0 for false.
func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// observables are a Recorder's instruments read at each collection, from
// the observer's counts and the sources given to New, with their attribute
// sets made once.
type observables struct {
	o         *options
	counts    *labels.Counts
	series    *labels.Map[labels.Series, *counter]
	decisions metric.Int64ObservableCounter

	costs                                  *labels.Map[labels.CostSeries, *costCounter]
	reserved, settled, refunded, uncharged metric.Int64ObservableCounter
	labels                                 *labels.Labeler
	debts                                  *labels.Debts
	debt                                   metric.Float64ObservableGauge

	tap, exempt, keysIgnored metric.Int64ObservableCounter
	ignoredBy                []metric.MeasurementOption // labels.KeysIgnored

	keys                                  metric.Int64ObservableGauge
	evictions, evictedNotFull, overflowed metric.Int64ObservableCounter

	scale, cpu, cpuSmoothed metric.Float64ObservableGauge
	gateState, samplerInfo  metric.Int64ObservableGauge
	failures                metric.Int64ObservableCounter
	gateStates              []cpugate.State
	gateStateIs             []metric.MeasurementOption

	ovState, ovInflight, ovQueued, ovQueueCap              metric.Int64ObservableGauge
	ovLimit, ovLatency, ovBaseline, ovTarget, ovThroughput metric.Float64ObservableGauge
	ovWait                                                 metric.Float64ObservableGauge
	ovAdmitted, ovShed, ovUntapped                         metric.Int64ObservableCounter
	ovStateIs, waited, shedBy                              []metric.MeasurementOption

	configLoads  metric.Int64ObservableCounter
	configLoaded metric.Float64ObservableGauge
	loadsBy      []metric.MeasurementOption // applied, rejected
}

// register makes the instruments of the observer's counts and of the
// sources o names, and registers the one callback that reads them all.
func (s *observables) register(m metric.Meter, o *options, l *labels.Labeler, counts *labels.Counts,
	series *labels.Map[labels.Series, *counter], costs *labels.Map[labels.CostSeries, *costCounter], debts *labels.Debts) (metric.Registration, error) {
	s.o, s.labels, s.counts, s.series, s.costs, s.debts = o, l, counts, series, costs, debts
	b := &builder{m: m}
	s.decisions = b.counter("floodgate.decisions", "{call}", "Decisions of the limiter, by outcome (admitted, rejected, dry_run_rejected), reason, status code sent, deciding source in the store, tier, method, deciding stage (interceptor or tap) and, opt-in, tenant.")
	s.reserved = b.counter("floodgate.cost.reserved", "{unit}", "Units metered calls reserved, their estimates and their streams' chunks, counted as they settle, by unit, tier, method and, opt-in, tenant.")
	s.settled = b.counter("floodgate.cost.settled", "{unit}", "Units metered calls were settled at, as they ended: the cost they reported, or their estimate when they reported none.")
	s.refunded = b.counter("floodgate.cost.refunded", "{unit}", "Units metered calls reserved beyond the cost they settled at, given back to their buckets (a bucket keeps what fits under its burst).")
	s.uncharged = b.counter("floodgate.cost.uncharged", "{unit}", "Units of settles that their buckets' debt limits left uncharged: the only units a metered quota does not count.")
	s.debt = b.float("floodgate.cost.debt", "{unit}", "Units the tenant's metered bucket owes, as last seen by this process, less what refill has repaid since, by unit, tier and, opt-in, tenant.")
	s.tap = b.counter("floodgate.tap.rejections", "{call}", "Calls rejected by the tap handle before their request was read.")
	s.exempt = b.counter("floodgate.exempt", "{call}", "Calls to exempt methods, which take no tokens and are not in floodgate.decisions.")
	s.keysIgnored = b.counter("floodgate.api_keys.ignored", "{call}", "Decisions of calls whose API key header the limiter ignored, judging the caller anonymous, by reason: repeated (more than one value) or too_long.")
	s.ignoredBy = withEach("reason", labels.KeysIgnored[:]...)
	if o.keyed != nil {
		s.keys = b.gauge("floodgate.keyed.keys", "{bucket}", "Buckets the in-memory store tracks.")
		s.evictions = b.counter("floodgate.keyed.evictions", "{bucket}", "Buckets dropped to make room for new keys.")
		s.evictedNotFull = b.counter("floodgate.keyed.evicted_not_full", "{bucket}", "Evicted buckets that had not refilled: each handed a client a fresh burst.")
		s.overflowed = b.counter("floodgate.keyed.overflowed", "{take}", "Takes by new keys decided by a shard's shared overflow bucket: the capacity is too small.")
	}
	if o.gate != nil {
		s.scale = b.float("floodgate.gate.scale", "1", "Factor the CPU gate multiplies every limit by, in (0, 1].")
		s.gateState = b.gauge("floodgate.gate.state", "", "1 for the CPU gate's current state, 0 for the others.")
		s.cpu = b.float("floodgate.gate.cpu", "1", "Latest CPU reading, as a fraction of the CPU available to the process.")
		s.cpuSmoothed = b.float("floodgate.gate.cpu.smoothed", "1", "Exponential moving average of the CPU readings (time constant 1s).")
		s.samplerInfo = b.gauge("floodgate.gate.sampler_info", "", "The CPU sampler's source, as an attribute, from the first reading on; the value is 1.")
		s.failures = b.counter("floodgate.gate.sample_failures", "{sample}", "Failed CPU samples.")
		s.gateStates = []cpugate.State{cpugate.Open, cpugate.Shedding, cpugate.Ramping}
		for _, st := range s.gateStates {
			s.gateStateIs = append(s.gateStateIs, with("state", st.String()))
		}
	}
	if o.overload != nil {
		s.ovState = b.gauge("floodgate.overload.state", "", "1 for the overload controller's current state (open, shedding), 0 for the other.")
		s.ovLimit = b.float("floodgate.overload.limit", "{call}", "The overload controller's concurrency limit: calls it lets run at once.")
		s.ovInflight = b.gauge("floodgate.overload.inflight", "{call}", "Calls holding one of the overload controller's slots.")
		s.ovQueued = b.gauge("floodgate.overload.queued", "{call}", "Calls waiting for one of the overload controller's slots.")
		s.ovQueueCap = b.gauge("floodgate.overload.queue_cap", "{call}", "Calls that may wait for one of the overload controller's slots before calls are shed.")
		s.ovLatency = b.float("floodgate.overload.latency", "s", "Mean service time of the calls completed in the overload controller's latest step, from admission to completion.")
		s.ovBaseline = b.float("floodgate.overload.baseline", "s", "The least mean service time of the overload controller's recent steps: what a call costs when it does not queue.")
		s.ovTarget = b.float("floodgate.overload.queue_target", "s", "The overload controller's queue target: a call waits for a slot at most twice this long.")
		s.ovThroughput = b.float("floodgate.overload.throughput", "{call}/s", "Calls per second the overload controller's admitted calls complete, smoothed: while calls are shed, the server's capacity.")
		s.ovWait = b.float("floodgate.overload.wait", "s", "Mean wait for a slot of the calls that waited in the overload controller's latest step.")
		s.ovAdmitted = b.counter("floodgate.overload.admitted", "{call}", "Calls the overload controller admitted, by whether they waited for a slot.")
		s.ovShed = b.counter("floodgate.overload.shed", "{call}", "Calls the overload controller shed, by cause (queue_full, displaced, wait_timeout, deadline, tap).")
		s.ovUntapped = b.counter("floodgate.overload.untapped", "{call}", "Calls that reached the overload controller without the tap handle counting them as they entered: a server wired without the tap handle, whose calls can queue where the controller cannot bound them. It should stay 0.")
		s.ovStateIs = withEach("state", overload.Open.String(), overload.Shedding.String())
		s.waited = withEach("waited", "false", "true")
		var causes []string
		for _, cause := range overload.ShedCauses() {
			causes = append(causes, cause.String())
		}
		s.shedBy = withEach("cause", causes...)
	}
	if o.registry != nil {
		s.configLoads = b.counter("floodgate.config.loads", "{load}", "Loads of the tenant config by outcome: applied (a new table put in force) or rejected (unreadable or invalid; the table in force stays).")
		s.configLoaded = b.float("floodgate.config.loaded_timestamp", "s", "When the tenant table in force was put in force, in Unix seconds; 0 while no config has loaded.")
		s.loadsBy = withEach("outcome", "applied", "rejected")
	}
	return b.register(s.observe)
}

// observe is the callback: it reads the counts and each source once.
func (s *observables) observe(_ context.Context, ob metric.Observer) error {
	for _, c := range s.series.Load() {
		ob.ObserveInt64(s.decisions, c.n.Load(), c.set)
	}
	for _, c := range s.costs.Load() {
		ob.ObserveInt64(s.reserved, c.reserved.Load(), c.set)
		ob.ObserveInt64(s.settled, c.settled.Load(), c.set)
		ob.ObserveInt64(s.refunded, c.refunded.Load(), c.set)
		ob.ObserveInt64(s.uncharged, c.uncharged.Load(), c.set)
	}
	s.debts.Each(func(v labels.DebtValues, owed float64) {
		values := s.labels.DebtLabels(v)
		kvs := make([]attribute.KeyValue, len(values))
		for i, val := range values {
			kvs[i] = attribute.String(labels.DebtNames[i], val)
		}
		ob.ObserveFloat64(s.debt, owed, metric.WithAttributes(kvs...))
	})
	ob.ObserveInt64(s.tap, int64(s.counts.Tap.Load()))
	ob.ObserveInt64(s.exempt, int64(s.counts.Exempt.Load()))
	for i := range labels.KeysIgnored {
		ob.ObserveInt64(s.keysIgnored, int64(s.counts.KeysIgnored[i].Load()), s.ignoredBy[i])
	}
	if m := s.o.keyed; m != nil {
		st := m.Stats()
		ob.ObserveInt64(s.keys, int64(m.Len()))
		ob.ObserveInt64(s.evictions, int64(st.Evictions))
		ob.ObserveInt64(s.evictedNotFull, int64(st.EvictedNotFull))
		ob.ObserveInt64(s.overflowed, int64(st.Overflowed))
	}
	if g := s.o.gate; g != nil {
		snap := g.Snapshot()
		ob.ObserveFloat64(s.scale, snap.Scale)
		for i, st := range s.gateStates {
			ob.ObserveInt64(s.gateState, b2i(st == snap.State), s.gateStateIs[i])
		}
		ob.ObserveFloat64(s.cpu, snap.CPU)
		ob.ObserveFloat64(s.cpuSmoothed, snap.Smoothed)
		if snap.Source != "" {
			ob.ObserveInt64(s.samplerInfo, 1, metric.WithAttributes(attribute.String("source", snap.Source)))
		}
		ob.ObserveInt64(s.failures, int64(snap.Failures))
	}
	if c := s.o.overload; c != nil {
		snap := c.Snapshot()
		ob.ObserveInt64(s.ovState, b2i(snap.State == overload.Open), s.ovStateIs[0])
		ob.ObserveInt64(s.ovState, b2i(snap.State == overload.Shedding), s.ovStateIs[1])
		ob.ObserveFloat64(s.ovLimit, snap.Limit)
		ob.ObserveInt64(s.ovInflight, int64(snap.Inflight))
		ob.ObserveInt64(s.ovQueued, int64(snap.Queued))
		ob.ObserveInt64(s.ovQueueCap, int64(snap.QueueCap))
		ob.ObserveFloat64(s.ovLatency, snap.Latency.Seconds())
		ob.ObserveFloat64(s.ovBaseline, snap.Baseline.Seconds())
		ob.ObserveFloat64(s.ovTarget, snap.Target.Seconds())
		ob.ObserveFloat64(s.ovThroughput, snap.Throughput)
		ob.ObserveFloat64(s.ovWait, snap.Wait.Seconds())
		ob.ObserveInt64(s.ovAdmitted, int64(snap.Admitted-snap.Waited), s.waited[0])
		ob.ObserveInt64(s.ovAdmitted, int64(snap.Waited), s.waited[1])
		for i, cause := range overload.ShedCauses() {
			ob.ObserveInt64(s.ovShed, int64(snap.ShedBy(cause)), s.shedBy[i])
		}
		ob.ObserveInt64(s.ovUntapped, int64(snap.Untapped))
	}
	if r := s.o.registry; r != nil {
		st := r.Stats()
		ob.ObserveInt64(s.configLoads, int64(st.Applied), s.loadsBy[0])
		ob.ObserveInt64(s.configLoads, int64(st.Rejected), s.loadsBy[1])
		at := 0.0
		if !st.LoadedAt.IsZero() {
			at = float64(st.LoadedAt.UnixNano()) / 1e9
		}
		ob.ObserveFloat64(s.configLoaded, at)
	}
	return nil
}
