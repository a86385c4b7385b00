package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chartSeries is one line of a chart panel.
type chartSeries struct {
	name  string
	color color.Color
	dash  []vg.Length
	value func(p point) float64
}

var (
	blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	red    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	orange = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	purple = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	gray   = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
	dashed = []vg.Length{vg.Points(5), vg.Points(3)}
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
	lat.Y.Scale, lat.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	lat.Y.Min = max(lat.Y.Min, 0.1)
	// Headroom for the legend, up to a power of ten so that the top of the
	// panel has a gridline.
	lat.Y.Max = math.Pow(10, math.Ceil(math.Log10(max(lat.Y.Max*5, lat.Y.Min*100))))
	// The log axis's labels push its data area down; keep the legend in it.
	lat.Legend.YOffs = -vg.Points(34)
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
	img := vgimg.NewWith(vgimg.UseWH(width, rowHeight*vg.Length(len(panels))), vgimg.UseDPI(110))
	dc := draw.New(img)
	rows := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		rows[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(6), PadRight: vg.Points(10), PadY: vg.Points(10)}
	canvases := plot.Align(rows, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[i][0])
	}

	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// panel returns a plot of the series over pts against time in seconds.
func panel(title, ylabel string, pts []point, series []chartSeries) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.X.Min = 0
	p.X.Tick.Marker = plot.TickerFunc(secondTicks)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	top := 0.0
	for _, s := range series {
		xys := make(plotter.XYs, 0, len(pts))
		for _, pt := range pts {
			if v := s.value(pt); !math.IsNaN(v) {
				xys = append(xys, plotter.XY{X: pt.T.Seconds(), Y: v})
				top = max(top, v)
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			continue // no finite points: nothing to draw
		}
		l.Color = s.color
		l.Width = vg.Points(1.5)
		l.Dashes = s.dash
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	// Headroom above the lines for the legend.
	p.Y.Max = max(p.Y.Max, top*(1+0.1*float64(len(series))))
	return p
}

// secondTicks marks whole seconds: a labelled tick every 5, 10, 30 or 60 s,
// whichever gives at most a dozen, and minor ticks between.
func secondTicks(lo, hi float64) []plot.Tick {
	step := 5.0
	for _, s := range []float64{5, 10, 30, 60, 300} {
		step = s
		if (hi-lo)/s <= 12 {
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		if minor := v + step/2; minor < hi {
			ticks = append(ticks, plot.Tick{Value: minor})
		}
	}
	return ticks
}
