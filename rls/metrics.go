package rls

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-go/floodgate/internal/topk"
)

// Metric names. Every label's values come from the config (domains, the
// configured descriptor paths) or from a fixed set (codes, policies), so
// the number of series is bounded by the config, never by the traffic.
const (
	metricDecisions = "floodgate_rls_descriptor_decisions_total"
	metricRequests  = "floodgate_rls_requests_total"
	metricShadow    = "floodgate_rls_shadow_over_limit_total"
	metricNear      = "floodgate_rls_near_limit_total"
	metricFallback  = "floodgate_rls_store_fallback_total"
	metricUnmatched = "floodgate_rls_unmatched_descriptors_total"
	metricLoads     = "floodgate_rls_config_loads_total"
	metricTop       = "floodgate_rls_over_limit_top"
	metricSettles   = "floodgate_rls_response_charges_total"
)

// unknownDomain is the domain label of requests for a domain the config
// does not have: any string may arrive there, so they share one series.
const unknownDomain = "(unknown)"

type metrics struct {
	decisions *prometheus.CounterVec // domain, descriptor, code
	requests  *prometheus.CounterVec // domain, code
	shadow    *prometheus.CounterVec // domain, descriptor
	near      *prometheus.CounterVec // domain, descriptor
	fallback  *prometheus.CounterVec // domain, policy
	unmatched *prometheus.CounterVec // domain
	loads     *prometheus.CounterVec // result
	settles   *prometheus.CounterVec // domain, outcome
	top       *topGauge
}

func newMetrics(top *topk.Summary, topN int) *metrics {
	return &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricDecisions,
			Help: "Descriptor decisions by domain, configured descriptor path (keys and configured values, never request values) and code (ok, over_limit)."},
			[]string{"domain", "descriptor", "code"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRequests,
			Help: "ShouldRateLimit requests by domain and overall code (ok, over_limit)."},
			[]string{"domain", "code"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricShadow,
			Help: "Descriptor decisions that were over the limit under shadow_mode, and so answered OK."},
			[]string{"domain", "descriptor"}),
		near: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricNear,
			Help: "Admitted descriptor decisions that left the bucket below the near-limit share of its burst."},
			[]string{"domain", "descriptor"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricFallback,
			Help: "Descriptor decisions the store could not make itself (Redis down, slow or its breaker open), by domain and the domain's failure policy."},
			[]string{"domain", "policy"}),
		unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricUnmatched,
			Help: "Descriptors no configured descriptor limits, answered OK."},
			[]string{"domain"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricLoads,
			Help: "Config loads by result (success, error); an error keeps the previous config in force."},
			[]string{"result"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricSettles,
			Help: "Charges on the response (a second call naming a reservation) by outcome: settled, refund (is_negative_hits), debt_limit (part of the charge beyond the debt limit), error."},
			[]string{"domain", "outcome"}),
		top: &topGauge{s: top, n: topN, desc: prometheus.NewDesc(metricTop,
			"The descriptors most often over the limit (Space-Saving estimate, an upper bound): at most the summary's capacity of series, named by configured path, or by domain, keys and values for detailed_metric descriptors.",
			[]string{"descriptor"}, nil)},
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.decisions, m.requests, m.shadow, m.near, m.fallback, m.unmatched, m.loads, m.settles, m.top}
}

// ruleMetrics are one rule's counters, resolved when a config is set so
// that a decision costs atomic adds only.
type ruleMetrics struct {
	ok, over, shadow, near prometheus.Counter
}

type domainMetrics struct {
	ok, over, unmatched, fallback prometheus.Counter
	settled, refund, debt, errs   prometheus.Counter
}

func (m *metrics) forRule(r *rule) ruleMetrics {
	return ruleMetrics{
		ok:     m.decisions.WithLabelValues(r.domain, r.path, "ok"),
		over:   m.decisions.WithLabelValues(r.domain, r.path, "over_limit"),
		shadow: m.shadow.WithLabelValues(r.domain, r.path),
		near:   m.near.WithLabelValues(r.domain, r.path),
	}
}

func (m *metrics) forDomain(name string, p FailurePolicy) *domainMetrics {
	return &domainMetrics{
		ok:        m.requests.WithLabelValues(name, "ok"),
		over:      m.requests.WithLabelValues(name, "over_limit"),
		unmatched: m.unmatched.WithLabelValues(name),
		fallback:  m.fallback.WithLabelValues(name, p.String()),
		settled:   m.settles.WithLabelValues(name, "settled"),
		refund:    m.settles.WithLabelValues(name, "refund"),
		debt:      m.settles.WithLabelValues(name, "debt_limit"),
		errs:      m.settles.WithLabelValues(name, "error"),
	}
}

// topGauge exports the over-limit summary's top entries as gauges.
type topGauge struct {
	s    *topk.Summary
	n    int
	desc *prometheus.Desc
}

func (g *topGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *topGauge) Collect(ch chan<- prometheus.Metric) {
	for _, it := range g.s.Top(g.n) {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(it.Count), it.Key)
	}
}
