package loadgen

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/overload"
)

// A Point is one sampling interval of a run, as the chart plots it. Rates
// are per second over the interval; CPU is NaN when the load generator
// cannot see the server (the load subcommand), Scale also when the gate
// scales nothing (the overload controller sheds instead), and Ctrl is nil
// without a controller.
type Point struct {
	T         time.Duration // end of the interval, from the start
	Dt        time.Duration // the interval's length
	Factor    float64       // the ramp's multiple of the capacity
	Target    float64       // the load the ramp asked for
	Offered   float64       // arrivals
	Goodput   float64       // admitted and served
	Quota     float64       // shed over quota
	Overload  float64       // shed by the overload controller or the CPU gate
	Late      float64       // failed with DEADLINE_EXCEEDED
	Errors    float64       // other errors and dropped arrivals
	SteadyOK  float64       // goodput of the steady (non-ramp) callers
	SteadyOff float64       // offered by the steady callers
	P50, P99  time.Duration // of calls admitted in the interval, NoLatency without any
	CPU       float64       // the gate's smoothed CPU reading, 0–1
	Scale     float64       // the gate's scale
	SchedP99  time.Duration // the gate's latest scheduling-latency reading
	State     cpugate.State
	// Ctrl is the overload controller's state at the end of the interval,
	// CtrlShed the calls it shed during it, and QueueTarget its queue
	// target then.
	Ctrl        *overload.Snapshot
	CtrlShed    uint64
	QueueTarget time.Duration
}

// NoLatency marks an interval without admitted calls: nothing to plot.
const NoLatency = time.Duration(-1)

// window is what the monitor accumulated for one caller since its last print.
type window struct {
	c Counts
	h Histogram
}

// monitor samples the generator's statistics, the gate and the overload
// controller every tick, keeps the points for the chart and prints the live
// table every few ticks.
type monitor struct {
	gen    *Generator
	gate   *cpugate.Gate        // nil when the server is elsewhere
	ctrl   *overload.Controller // nil when the server is elsewhere or has none
	out    io.Writer
	live   bool // redraw the table in place (a terminal)
	every  int  // ticks between prints
	points []Point

	ticks   int
	pending []window // per caller, since the last print
	drawn   int      // lines of the last table, to redraw over
	shed    uint64   // the controller's shed calls at the last tick
}

// newMonitor returns a monitor of gen's callers and, when not nil, the
// server's gate and overload controller. With a controller the gate's scale
// is not recorded: it scales nothing.
func newMonitor(gen *Generator, gate *cpugate.Gate, ctrl *overload.Controller, out io.Writer, live bool, every int) *monitor {
	return &monitor{gen: gen, gate: gate, ctrl: ctrl, out: out, live: live, every: max(every, 1), pending: make([]window, len(gen.callers))}
}

// sample closes the interval ending at offset t, of length dt.
func (m *monitor) sample(t, dt time.Duration) {
	secs := dt.Seconds()
	p := Point{T: t, Dt: dt, Factor: m.gen.factorAt(t), Target: m.gen.offeredAt(t), CPU: math.NaN(), Scale: math.NaN()}
	var all Histogram
	for i, c := range m.gen.callers {
		w, h := c.stats.roll()
		m.pending[i].c.add(w)
		m.pending[i].h.Merge(&h)
		all.Merge(&h)
		p.Offered += float64(w.Offered) / secs
		p.Goodput += float64(w.By[OutcomeOK]) / secs
		p.Quota += float64(w.By[OutcomeQuota]) / secs
		p.Overload += float64(w.By[OutcomeOverload]) / secs
		p.Late += float64(w.By[OutcomeDeadline]) / secs
		p.Errors += float64(w.By[OutcomeError]+w.By[OutcomeDropped]) / secs
		if !c.spec.Ramp {
			p.SteadyOK += float64(w.By[OutcomeOK]) / secs
			p.SteadyOff += float64(w.Offered) / secs
		}
	}
	p.P50, p.P99 = NoLatency, NoLatency
	if all.Count() > 0 {
		p.P50, p.P99 = all.Quantile(0.50), all.Quantile(0.99)
	}
	if m.gate != nil {
		s := m.gate.Snapshot()
		p.CPU, p.SchedP99 = s.Smoothed, s.SchedP99
		if m.ctrl == nil {
			p.Scale, p.State = s.Scale, s.State
		}
	}
	if m.ctrl != nil {
		s := m.ctrl.Snapshot()
		p.Ctrl = &s
		p.QueueTarget = s.Target
		total := s.ShedTotal()
		p.CtrlShed, m.shed = total-m.shed, total
	}
	m.points = append(m.points, p)
	m.ticks++
	if m.ticks%m.every == 0 {
		m.print(m.points[len(m.points)-m.every:])
	}
}

// print writes the table for the intervals pts, over the pending windows.
func (m *monitor) print(pts []Point) {
	var b strings.Builder
	last := pts[len(pts)-1]
	span := (last.T - m.prevT(pts)).Seconds()
	var offered, good, shed, failed float64
	for _, p := range pts {
		offered += p.Offered
		good += p.Goodput
		shed += p.Quota + p.Overload
		failed += p.Late + p.Errors
	}
	n := float64(len(pts))
	fmt.Fprintf(&b, "%5.0fs/%.0fs  load %.2f× capacity  offered %5.0f/s  goodput %5.0f/s  shed %5.0f/s  failed %4.0f/s",
		last.T.Seconds(), m.gen.length.Seconds(), last.Factor, offered/n, good/n, shed/n, failed/n)
	if !math.IsNaN(last.Scale) {
		fmt.Fprintf(&b, "  gate %s ×%.2f  cpu %3.0f%%", last.State, last.Scale, 100*last.CPU)
		if last.SchedP99 > 0 {
			fmt.Fprintf(&b, "  sched p99 %s", fmtLatency(last.SchedP99, 1))
		}
	}
	b.WriteString("\n")
	if last.Ctrl != nil {
		b.WriteString("  ")
		b.WriteString(ctrlLine(*last.Ctrl, last.QueueTarget, last.CPU))
		b.WriteString("\n")
	}
	b.WriteString(tableHeader)
	for i, c := range m.gen.callers {
		w := &m.pending[i]
		writeRow(&b, c.spec.Name, w.c, &w.h, span)
		m.pending[i] = window{}
	}
	text := b.String()
	if m.live && m.drawn > 0 {
		// Move up over the previous table and clear to the end of the screen.
		fmt.Fprintf(m.out, "\x1b[%dA\x1b[J", m.drawn)
	}
	io.WriteString(m.out, text)
	m.drawn = strings.Count(text, "\n")
}

// ctrlLine describes the overload controller's state for the table: its
// regime; the concurrency limit, with the calls holding and waiting for a
// slot and the calls inside (counted from the tap) against the places;
// the wait for a slot against the target; the latency of its calls
// against the baseline, which moves the limit; what completes per second;
// and the CPU (NaN when unknown), which explains but does not decide.
func ctrlLine(s overload.Snapshot, target time.Duration, cpu float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "overload %s: limit %.1f, %d in flight, %d queued, %d inside of %d places;  slot wait %s (target %s);  latency %s vs baseline %s;  %.0f/s completed",
		s.State, s.Limit, s.Inflight, s.Queued, s.Inside, max(1, int(s.Limit))+s.QueueCap, fmtDur(s.Wait), fmtDur(target), fmtDur(s.Latency), fmtDur(s.Baseline), s.Throughput)
	if !math.IsNaN(cpu) {
		fmt.Fprintf(&b, ";  cpu %.0f%%", 100*cpu)
	}
	return b.String()
}

// fmtDur formats a duration of the controller's, "-" when not measured.
func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmtLatency(d, 1)
}

// prevT is the end of the interval before pts, 0 at the start.
func (m *monitor) prevT(pts []Point) time.Duration {
	i := len(m.points) - len(pts) - 1
	if i < 0 {
		return 0
	}
	return m.points[i].T
}

const tableHeader = "  caller       offered/s    ok/s  quota/s  overload/s  late/s  error/s  retries/s      p50      p99\n"

// writeRow writes one caller's line of the live table: rates over span
// seconds, latencies of its admitted calls.
func writeRow(b *strings.Builder, name string, c Counts, h *Histogram, span float64) {
	rate := func(v uint64) float64 { return float64(v) / span }
	retries := c.Attempts - min(c.Attempts, c.Sent())
	fmt.Fprintf(b, "  %-12s %9.1f %7.1f %8.1f %11.1f %7.1f %8.1f %10.1f %8s %8s\n",
		name, rate(c.Offered), rate(c.By[OutcomeOK]), rate(c.By[OutcomeQuota]), rate(c.By[OutcomeOverload]),
		rate(c.By[OutcomeDeadline]), rate(c.By[OutcomeError]+c.By[OutcomeDropped]), rate(retries), fmtLatency(h.Quantile(0.50), h.Count()), fmtLatency(h.Quantile(0.99), h.Count()))
}

// fmtLatency formats a latency compactly, or "-" without samples.
func fmtLatency(d time.Duration, n uint64) string {
	if n == 0 {
		return "-"
	}
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	}
}

// CallerTotal is one caller's line of the summary.
type CallerTotal struct {
	Name   string
	Ramp   bool
	Counts Counts
	Lat    Histogram
}

// Summary is the outcome of a run: each caller's totals, the goodput, what
// the overload protection did, and the points the chart plots.
type Summary struct {
	Length   time.Duration
	Capacity float64
	Measured bool // the capacity was measured, not given
	Ramp     Ramp
	Callers  []CallerTotal
	Peak     float64 // best one-interval goodput
	Overload float64 // mean goodput over the intervals at ≥ 2× capacity, 0 if none
	// Shedding is how long the gate shed (with a gate that scales) or the
	// controller shed calls (with a controller).
	Shedding time.Duration
	MinScale float64 // NaN without a gate that scales
	// Ctrl is the controller's final state, nil without one; LimitMin,
	// LimitMed and LimitMax its limit's range and median over the run's
	// ticks, and CompletedMed the median of what its calls completed per
	// second over the ticks it shed calls in.
	Ctrl                         *overload.Snapshot
	LimitMin, LimitMed, LimitMax float64
	CompletedMed                 float64
	// Server is the server's counts, nil when the server is elsewhere.
	Server *ServerCounts
	// Points are the run's sampling intervals, for WriteChart.
	Points []Point
	// ChartPath, when set, is printed as where the chart is.
	ChartPath string
}

// ServerCounts are the decisions of the server's Limiter, as its observer
// counts them: calls that ran, and the calls it refused over quota, for
// overload (by the CPU gate or the overload controller) and at the tap
// handle; and the calls to exempt methods.
type ServerCounts struct{ Admitted, Quota, Overload, Tap, Exempt uint64 }

// summarize builds the summary of a finished run, with the server's counts
// when counts is not nil.
func summarize(gen *Generator, pts []Point, counts func() ServerCounts) *Summary {
	s := &Summary{Length: gen.length, Capacity: gen.capacity, Ramp: gen.prof.Ramp, MinScale: math.NaN(), Points: pts}
	for _, c := range gen.callers {
		cnt, h := c.stats.totals()
		s.Callers = append(s.Callers, CallerTotal{Name: c.spec.Name, Ramp: c.spec.Ramp, Counts: cnt, Lat: h})
	}
	var sum float64
	var n int
	var limits, rates []float64
	for _, p := range pts {
		s.Peak = max(s.Peak, p.Goodput)
		if p.Factor >= 2 {
			sum += p.Goodput
			n++
		}
		if !math.IsNaN(p.Scale) {
			if math.IsNaN(s.MinScale) || p.Scale < s.MinScale {
				s.MinScale = p.Scale
			}
			if p.State != cpugate.Open {
				s.Shedding += p.Dt
			}
		}
		if p.Ctrl != nil {
			s.Ctrl = p.Ctrl
			limits = append(limits, p.Ctrl.Limit)
			if p.CtrlShed > 0 {
				s.Shedding += p.Dt
				rates = append(rates, p.Ctrl.Throughput)
			}
		}
	}
	if len(limits) > 0 {
		slices.Sort(limits)
		s.LimitMin, s.LimitMed, s.LimitMax = limits[0], limits[len(limits)/2], limits[len(limits)-1]
	}
	if len(rates) > 0 {
		slices.Sort(rates)
		s.CompletedMed = rates[len(rates)/2]
	}
	if n > 0 {
		s.Overload = sum / float64(n)
	}
	if counts != nil {
		st := counts()
		s.Server = &st
	}
	return s
}

// Report draws the chart of the run, titled title, at chartPath (none when
// it is empty), then prints the summary to w.
func (s *Summary) Report(w io.Writer, chartPath, title string) error {
	if chartPath != "" {
		if err := WriteChart(chartPath, title, s.Points); err != nil {
			return err
		}
		s.ChartPath = chartPath
	}
	s.Write(w)
	return nil
}

// Write prints the summary table.
func (s *Summary) Write(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nsummary: %.0fs, offered load %g× → %g× → %g× of a capacity of %.0f calls/s\n",
		s.Length.Seconds(), s.Ramp.From, s.Ramp.To, s.Ramp.From, s.Capacity)
	b.WriteString("  caller           offered        ok    quota  overload    late   error    ok%      p50      p99\n")
	var all CallerTotal
	all.Name = "all"
	row := func(c *CallerTotal) {
		okPct := 0.0
		if c.Counts.Offered > 0 {
			okPct = 100 * float64(c.Counts.By[OutcomeOK]) / float64(c.Counts.Offered)
		}
		name := c.Name
		if c.Ramp {
			name += " (ramp)"
		}
		fmt.Fprintf(&b, "  %-16s %8d %9d %8d %9d %7d %7d %6.1f %8s %8s\n",
			name, c.Counts.Offered, c.Counts.By[OutcomeOK], c.Counts.By[OutcomeQuota], c.Counts.By[OutcomeOverload],
			c.Counts.By[OutcomeDeadline], c.Counts.By[OutcomeError]+c.Counts.By[OutcomeDropped], okPct,
			fmtLatency(c.Lat.Quantile(0.50), c.Lat.Count()), fmtLatency(c.Lat.Quantile(0.99), c.Lat.Count()))
	}
	for i := range s.Callers {
		c := &s.Callers[i]
		row(c)
		all.Counts.add(c.Counts)
		all.Lat.Merge(&c.Lat)
	}
	row(&all)
	fmt.Fprintf(&b, "goodput: peak %.0f/s", s.Peak)
	if s.Overload > 0 && s.Peak > 0 {
		// The capacity is the yardstick: a protection that halves the
		// server's goodput keeps 100% of its own (halved) peak.
		which := "the given capacity"
		if s.Measured {
			which = "the measured capacity"
		}
		fmt.Fprintf(&b, "; while offered ≥ 2× capacity: %.0f/s on average = %.0f%% of %s (%.0f%% of the peak)",
			s.Overload, 100*s.Overload/s.Capacity, which, 100*s.Overload/s.Peak)
	}
	b.WriteString("\n")
	if !math.IsNaN(s.MinScale) {
		fmt.Fprintf(&b, "gate: shed load for %.0fs of %.0fs, lowest scale %.2f\n", s.Shedding.Seconds(), s.Length.Seconds(), s.MinScale)
	}
	if c := s.Ctrl; c != nil {
		fmt.Fprintf(&b, "overload controller: shed calls in %.0fs of %.0fs; ", s.Shedding.Seconds(), s.Length.Seconds())
		if s.CompletedMed > 0 {
			fmt.Fprintf(&b, "completing a median %.0f/s meanwhile; ", s.CompletedMed)
		}
		fmt.Fprintf(&b, "limit %.1f–%.1f (median %.1f), baseline %s", s.LimitMin, s.LimitMax, s.LimitMed, fmtDur(c.Baseline))
		if c.Admitted > 0 {
			fmt.Fprintf(&b, "; %.0f%% of admitted calls waited for a slot", 100*float64(c.Waited)/float64(c.Admitted))
		}
		fmt.Fprintf(&b, "; shed %d", c.ShedTotal())
		sep := " ("
		for _, cause := range overload.ShedCauses() {
			if n := c.ShedBy(cause); n > 0 {
				fmt.Fprintf(&b, "%s%s %d", sep, cause, n)
				sep = ", "
			}
		}
		if sep == ", " {
			b.WriteString(")")
		}
		b.WriteString("\n")
	}
	if st := s.Server; st != nil {
		fmt.Fprintf(&b, "server: admitted %d, over quota %d, overload %d, tap handle %d, exempt %d\n",
			st.Admitted, st.Quota, st.Overload, st.Tap, st.Exempt)
	}
	if s.ChartPath != "" {
		fmt.Fprintf(&b, "chart: %s\n", s.ChartPath)
	}
	io.WriteString(w, b.String())
}
