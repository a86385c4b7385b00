package main

import (
	"image/color"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	fgplot "github.com/floodgate-go/floodgate/internal/plot"
)

var strategyColors = map[string]color.Color{
	stratChargeAtEnd:    fgplot.Red,
	stratCheckThenCount: fgplot.Orange,
	stratFloodgate:      fgplot.Blue,
}

// chart draws the first tenant's tokens in the trailing 60 s, each second,
// as a PNG at path: every strategy against the quota on a log scale on
// top, and floodgate alone against its bound below.
func (r *report) chart(path string) error {
	c := r.cfg
	var steps []time.Duration
	for t := time.Second; t <= c.Duration; t += time.Second {
		steps = append(steps, t)
	}
	line := func(name string, clr color.Color, dash []vg.Length, ys []float64) fgplot.Series {
		xys := make(plotter.XYs, len(steps))
		for i, t := range steps {
			xys[i] = plotter.XY{X: t.Seconds(), Y: ys[i]}
		}
		return fgplot.Series{Name: name, Color: clr, Dash: dash, XYs: xys}
	}
	flat := func(v int) []float64 {
		ys := make([]float64, len(steps))
		for i := range ys {
			ys[i] = float64(v)
		}
		return ys
	}
	bound, what := r.bound()
	refs := []fgplot.Series{
		line("quota", fgplot.Gray, fgplot.Dashed, flat(c.Quota)),
		line(what, fgplot.Black, fgplot.Dashed, flat(bound)),
	}
	all := append([]fgplot.Series(nil), refs...)
	var fg []fgplot.Series
	for _, byTenant := range r.rows {
		row := byTenant[0]
		s := line(row.strategy, strategyColors[row.strategy], nil, trailing(row.samples, window, steps))
		all = append(all, s)
		if row.strategy == stratFloodgate {
			fg = append(append(fg, refs...), s)
		}
	}
	title := "tokens delivered to " + r.rows[0][0].tenant + " in the trailing 60 s"
	top := fgplot.TimePanel(title, "tokens in 60 s (log)", all)
	fgplot.LogY(top, float64(c.Quota)/100)
	panels := []*plot.Plot{top}
	if fg != nil {
		bottom := fgplot.TimePanel("", "tokens in 60 s", fg)
		bottom.Y.Min = 0
		panels = append(panels, bottom)
	}
	for _, p := range panels {
		p.X.Max = c.Duration.Seconds()
	}
	panels[len(panels)-1].X.Label.Text = "time (s)"
	const width, rowHeight = 22 * vg.Centimeter, 8 * vg.Centimeter
	return fgplot.WritePNG(path, width, rowHeight, panels...)
}
