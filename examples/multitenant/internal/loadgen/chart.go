package loadgen

import (
	"image/color"
	"math"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	fgplot "github.com/floodgate-go/floodgate/internal/plot"
	"github.com/floodgate-go/floodgate/overload"
)

// chartSeries is one line of a chart panel.
type chartSeries struct {
	name  string
	color color.Color
	dash  []vg.Length
	value func(p Point) float64
}

var (
	blue   = fgplot.Blue
	green  = fgplot.Green
	red    = fgplot.Red
	orange = fgplot.Orange
	purple = fgplot.Purple
	gray   = fgplot.Gray
	black  = fgplot.Black
	dashed = fgplot.Dashed
)

// WriteChart draws the run as a PNG at path: offered load, goodput, shed
// rate and what the overload controller's calls complete per second on top; the gate's CPU reading and, when it scales the quotas, its
// scale (when the gate was visible); the overload controller's limit and
// calls in flight (when it was there); the admitted calls' latency below,
// with the controller's baseline.
func WriteChart(path, title string, pts []Point) error {
	ms := func(d time.Duration) float64 {
		if d == NoLatency {
			return math.NaN()
		}
		return float64(d) / float64(time.Millisecond)
	}
	var last Point
	if len(pts) > 0 {
		last = pts[len(pts)-1]
	}
	ctrl := func(f func(s *overload.Snapshot) float64) func(p Point) float64 {
		return func(p Point) float64 {
			if p.Ctrl == nil {
				return math.NaN()
			}
			return f(p.Ctrl)
		}
	}
	rates := []chartSeries{
		{"offered", gray, dashed, func(p Point) float64 { return p.Offered }},
		{"goodput", green, nil, func(p Point) float64 { return p.Goodput }},
		{"shed: quota", orange, nil, func(p Point) float64 { return p.Quota }},
		{"shed: overload", red, nil, func(p Point) float64 { return p.Overload }},
		{"deadline exceeded", purple, dashed, func(p Point) float64 { return p.Late }},
		{"goodput of steady tenants", blue, nil, func(p Point) float64 { return p.SteadyOK }},
	}
	if last.Ctrl != nil {
		rates = append(rates, chartSeries{"controller: completed per second", black, dashed, ctrl(func(s *overload.Snapshot) float64 {
			if s.Throughput == 0 {
				return math.NaN() // not measured yet
			}
			return s.Throughput
		})})
	}
	panels := []*plot.Plot{panel(title, "calls/s", pts, rates)}
	if len(pts) > 0 && !math.IsNaN(last.CPU) {
		ylabel, series := "CPU (%)", []chartSeries{
			{"CPU (smoothed)", purple, nil, func(p Point) float64 { return 100 * p.CPU }},
		}
		if !math.IsNaN(last.Scale) {
			ylabel = "CPU and gate scale (%)"
			series = append(series, chartSeries{"gate scale", red, dashed, func(p Point) float64 { return 100 * p.Scale }})
		}
		gate := panel("", ylabel, pts, series)
		gate.Y.Min, gate.Y.Max = 0, 130 // headroom for the legend
		panels = append(panels, gate)
	}
	if last.Ctrl != nil {
		// In flight is an instant's count, at each tick: it shows whether
		// the limit binds, not a mean.
		panels = append(panels, panel("", "overload controller (calls)", pts, []chartSeries{
			{"concurrency limit", red, nil, ctrl(func(s *overload.Snapshot) float64 { return s.Limit })},
			{"in flight (at the tick)", blue, dashed, ctrl(func(s *overload.Snapshot) float64 { return float64(s.Inflight) })},
		}))
	}
	latSeries := []chartSeries{
		{"p50", green, nil, func(p Point) float64 { return ms(p.P50) }},
		{"p99", red, nil, func(p Point) float64 { return ms(p.P99) }},
	}
	if last.Ctrl != nil {
		latSeries = append(latSeries, chartSeries{"controller's baseline", gray, dashed,
			ctrl(func(s *overload.Snapshot) float64 {
				if s.Baseline <= 0 {
					return math.NaN() // not measured yet
				}
				return ms(s.Baseline)
			})})
	}
	lat := panel("", "admitted latency (ms, log)", pts, latSeries)
	// A log scale shows a 2ms service time and a multi-second stall on one
	// axis; latencies below 0.1ms are clamped onto it.
	fgplot.LogY(lat, 0.1)
	panels = append(panels, lat)
	panels[len(panels)-1].X.Label.Text = "time (s)"
	if len(pts) > 0 {
		// End every panel on the same whole second, so the last tick shows.
		end := math.Ceil(pts[len(pts)-1].T.Seconds() - 0.05)
		for _, p := range panels {
			p.X.Max = max(end, 1)
		}
	}
	const width, rowHeight = 22 * vg.Centimeter, 8 * vg.Centimeter
	return fgplot.WritePNG(path, width, rowHeight, panels...)
}

// panel returns a plot of the series over pts against time in seconds.
func panel(title, ylabel string, pts []Point, series []chartSeries) *plot.Plot {
	out := make([]fgplot.Series, len(series))
	for i, s := range series {
		xys := make(plotter.XYs, len(pts))
		for j, pt := range pts {
			xys[j] = plotter.XY{X: pt.T.Seconds(), Y: s.value(pt)}
		}
		out[i] = fgplot.Series{Name: s.name, Color: s.color, Dash: s.dash, XYs: xys}
	}
	return fgplot.TimePanel(title, ylabel, out)
}
