package main

import (
	"image/color"
	"math"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	fgplot "github.com/floodgate-go/floodgate/internal/plot"
)

// chartSeries is one line of a chart panel.
type chartSeries struct {
	name  string
	color color.Color
	dash  []vg.Length
	value func(p point) float64
}

var (
	blue   = fgplot.Blue
	green  = fgplot.Green
	red    = fgplot.Red
	orange = fgplot.Orange
	purple = fgplot.Purple
	gray   = fgplot.Gray
	dashed = fgplot.Dashed
)

// writeChart draws the run as a PNG at path: offered load, goodput and shed
// rate on top, the gate's CPU reading and scale in the middle (when the gate
// was visible), the admitted calls' latency below.
func writeChart(path, title string, pts []point) error {
	ms := func(d time.Duration) float64 {
		if d == noLatency {
			return math.NaN()
		}
		return float64(d) / float64(time.Millisecond)
	}
	panels := []*plot.Plot{
		panel(title, "calls/s", pts, []chartSeries{
			{"offered", gray, dashed, func(p point) float64 { return p.Offered }},
			{"goodput", green, nil, func(p point) float64 { return p.Goodput }},
			{"shed: quota", orange, nil, func(p point) float64 { return p.Quota }},
			{"shed: overload", red, nil, func(p point) float64 { return p.Overload }},
			{"deadline exceeded", purple, dashed, func(p point) float64 { return p.Late }},
			{"goodput of steady tenants", blue, nil, func(p point) float64 { return p.SteadyOK }},
		}),
	}
	if len(pts) > 0 && !math.IsNaN(pts[len(pts)-1].Scale) {
		gate := panel("", "CPU and gate scale (%)", pts, []chartSeries{
			{"CPU (smoothed)", purple, nil, func(p point) float64 { return 100 * p.CPU }},
			{"gate scale", red, dashed, func(p point) float64 { return 100 * p.Scale }},
		})
		gate.Y.Min, gate.Y.Max = 0, 130 // headroom for the legend
		panels = append(panels, gate)
	}
	lat := panel("", "admitted latency (ms, log)", pts, []chartSeries{
		{"p50", green, nil, func(p point) float64 { return ms(p.P50) }},
		{"p99", red, nil, func(p point) float64 { return ms(p.P99) }},
	})
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
func panel(title, ylabel string, pts []point, series []chartSeries) *plot.Plot {
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
