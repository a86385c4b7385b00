package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// window is the span a quota of tokens a minute is judged over.
const window = time.Minute

// A row is what one strategy delivered to one tenant, counting the calls
// that ended within the run, each at its end.
type row struct {
	strategy, tenant string
	calls            [outcomes]int
	samples          []sample // by end, within the run
	tokens           int
	// maxWindow is the most tokens delivered in any window of 60 s (or
	// less, at the start of the run), and maxAt the end of that window.
	maxWindow int
	maxAt     time.Duration
}

// newRow sums t over a run of duration d.
func newRow(strategy, tenant string, t *tally, d time.Duration) row {
	r := row{strategy: strategy, tenant: tenant, calls: t.calls}
	for _, s := range t.samples {
		if s.at <= d {
			r.samples = append(r.samples, s)
		}
	}
	slices.SortStableFunc(r.samples, func(a, b sample) int { return cmp.Compare(a.at, b.at) })
	r.maxWindow, r.maxAt = maxWindow(r.samples, window)
	for _, s := range r.samples {
		r.tokens += s.tokens
	}
	return r
}

// maxWindow returns the most tokens of samples, sorted by time, that end
// within a span of w, (t−w, t], and the t of the first such span.
func maxWindow(samples []sample, w time.Duration) (int, time.Duration) {
	most, at, sum, i := 0, time.Duration(0), 0, 0
	for _, s := range samples {
		sum += s.tokens
		for samples[i].at <= s.at-w {
			sum -= samples[i].tokens
			i++
		}
		if sum > most {
			most, at = sum, s.at
		}
	}
	return most, at
}

// trailing returns, for each of steps, the tokens of samples (sorted by
// time) that end within the window up to it.
func trailing(samples []sample, w time.Duration, steps []time.Duration) []float64 {
	out := make([]float64, len(steps))
	sum, lo, hi := 0, 0, 0
	for k, t := range steps {
		for hi < len(samples) && samples[hi].at <= t {
			sum += samples[hi].tokens
			hi++
		}
		for lo < hi && samples[lo].at <= t-w {
			sum -= samples[lo].tokens
			lo++
		}
		out[k] = float64(sum)
	}
	return out
}

// perMinute returns the tokens a minute of samples that end in (from, to].
func perMinute(samples []sample, from, to time.Duration) float64 {
	if to <= from {
		return math.NaN()
	}
	sum := 0
	for _, s := range samples {
		if s.at > from && s.at <= to {
			sum += s.tokens
		}
	}
	return float64(sum) / (to - from).Minutes()
}

// A report is a run's rows, by strategy and tenant.
type report struct {
	cfg  config
	rows [][]row
}

func newReport(cfg config, tallies [][]*tally) *report {
	r := &report{cfg: cfg, rows: make([][]row, len(tallies))}
	tenants := cfg.tenants()
	for s, byTenant := range tallies {
		for t, tl := range byTenant {
			r.rows[s] = append(r.rows[s], newRow(cfg.Strategies[s], tenants[t], tl, cfg.Duration))
		}
	}
	return r
}

// bound is the most tokens floodgate lets a tenant have in any window of
// 60 s: the quota and one burst, and the debt limit when estimates may run
// short of the replies.
func (r *report) bound() (int, string) {
	b, what := r.cfg.Quota+r.cfg.Burst, "quota + burst"
	if r.cfg.shortEstimates() {
		b += r.cfg.limit().DebtLimit()
		what += " + debt limit"
	}
	return b, what
}

func (r *report) write(w io.Writer) {
	c := r.cfg
	fmt.Fprintf(w, "quota: %s tokens a minute per tenant, bursts of %s, debt limit %s\n",
		commas(c.Quota), commas(c.Burst), commas(c.limit().DebtLimit()))
	if c.Demand > 0 {
		fmt.Fprintf(w, "load: open-loop arrivals offering %v× the quota per tenant; a rejected call is not asked again\n", c.Demand)
	} else {
		fmt.Fprintf(w, "load: %d callers per tenant and strategy, back to back; a rejected call is asked again after about %v\n", c.Callers, c.Backoff)
	}
	estimate := map[string]string{"max": "the most a reply costs, " + commas(maxReply), "half": "half of each reply's tokens"}[c.Estimate]
	if estimate == "" {
		estimate = c.Estimate + " tokens"
	}
	where := "in memory"
	if c.Redis != "" {
		where = "on Redis " + c.Redis
	}
	if c.Workers > 1 {
		where += fmt.Sprintf(", shared by %d server processes", c.Workers)
		if c.KillAfter > 0 {
			where += fmt.Sprintf(", the first killed after %v", c.KillAfter)
		}
	}
	clock := "real time over gRPC on loopback"
	if c.Sim {
		clock = "simulated time"
	}
	fmt.Fprintf(w, "estimate: %s; replies of %d to %s tokens (%s on average), lasting %v to %v\n",
		estimate, minReply, commas(maxReply), commas(meanReply), minLasts, maxLasts)
	fmt.Fprintf(w, "run: %v of %s, buckets %s\n\n", c.Duration, clock, where)

	// Numbers align right, names left: padded to their longest.
	ws, wt := len("strategy"), len("tenant")
	for _, byTenant := range r.rows {
		for _, row := range byTenant {
			ws, wt = max(ws, len(row.strategy)), max(wt, len(row.tenant))
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\t%-*s\tserved\trejected\tfor debt\tfailed\ttokens\tmost in 60 s\t× quota\ttokens/min\tafter 60 s\t\n", ws, "strategy", wt, "tenant")
	for _, byTenant := range r.rows {
		for _, row := range byTenant {
			fmt.Fprintf(tw, "%-*s\t%-*s\t%d\t%d\t%d\t%d\t%s\t%s\t%.2f\t%s\t%s\t\n", ws, row.strategy, wt, row.tenant,
				row.calls[served], row.calls[rejectedQuota]+row.calls[rejectedDebt], row.calls[rejectedDebt], row.calls[failed],
				commas(row.tokens), commas(row.maxWindow), float64(row.maxWindow)/float64(c.Quota),
				rate(perMinute(row.samples, 0, c.Duration)), rate(perMinute(row.samples, window, c.Duration)))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)

	bound, what := r.bound()
	for _, byTenant := range r.rows {
		for _, row := range byTenant {
			over := float64(row.maxWindow) / float64(c.Quota)
			if row.strategy != stratFloodgate {
				fmt.Fprintf(w, "%s, %s: at most %s tokens in 60 s (the window ending at %v), %.2f× the quota\n",
					row.strategy, row.tenant, commas(row.maxWindow), row.maxAt.Round(time.Second), over)
				continue
			}
			verdict := "within"
			if row.maxWindow > bound {
				verdict = "OVER"
			}
			fmt.Fprintf(w, "%s, %s: at most %s tokens in 60 s (the window ending at %v), %s the bound of %s (%s)\n",
				row.strategy, row.tenant, commas(row.maxWindow), row.maxAt.Round(time.Second), verdict, commas(bound), what)
			if steady := perMinute(row.samples, window, c.Duration); !math.IsNaN(steady) {
				fmt.Fprintf(w, "%s, %s: after the first 60 s, %s tokens a minute, %.1f%% of the quota\n",
					row.strategy, row.tenant, commas(int(math.Round(steady))), 100*steady/float64(c.Quota))
			}
		}
	}
}

// rate formats tokens a minute, "-" for none.
func rate(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return commas(int(math.Round(v)))
}

// commas formats n with thousands separators.
func commas(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
