package main

import (
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	fgplot "github.com/floodgate-go/floodgate/internal/plot"
)

// chartFile is the file name of the chart called name: a scenario's.
func chartFile(name string) string { return "overload-" + name + ".png" }

// writeCharts draws the charts of the scenarios whose runs have their
// seconds (raw results do; a summary does not) into dir.
func writeCharts(res *Results, dir string) error {
	drawn := func(scenario string) bool {
		return slices.ContainsFunc(res.Runs, func(r Run) bool { return r.Scenario == scenario && len(r.Seconds) > 0 })
	}
	const width, row = 22 * vg.Centimeter, 8 * vg.Centimeter
	vs := res.variants()
	color := func(v string) int { return slices.Index(allVariants, v) % len(fgplot.Palette) }

	if loads := res.sweepLoads(); len(loads) > 0 && drawn("sweep") {
		var good, p99 []fgplot.Series
		for _, v := range vs {
			r := res.run("sweep", v)
			if r == nil {
				continue
			}
			var g, l plotter.XYs
			for _, ld := range loads {
				if w := r.window(loadName(ld)); w != nil {
					g = append(g, plotter.XY{X: ld, Y: w.Goodput})
					y := w.P99
					if y < 0 {
						y = math.NaN()
					}
					l = append(l, plotter.XY{X: ld, Y: y})
				}
			}
			s := fgplot.Series{Name: v + ": " + variantNames[v], Color: fgplot.Palette[color(v)], XYs: g}
			good = append(good, s)
			s.XYs = l
			p99 = append(p99, s)
		}
		ideal := fgplot.Series{Name: "capacity", Color: fgplot.Black, Dash: fgplot.Dashed, XYs: plotter.XYs{{X: loads[0], Y: res.Capacity}, {X: loads[len(loads)-1], Y: res.Capacity}}}
		a := fgplot.Panel("Goodput against offered load", "goodput (calls/s OK within the SLO)", append(good, ideal))
		a.Y.Min = 0
		a.X.Label.Text = "offered load (× measured capacity)"
		c := fgplot.Panel("", "accepted p99 (ms, log)", p99)
		logY(c)
		c.X.Label.Text = "offered load (× measured capacity)"
		path := filepath.Join(dir, chartFile("sweep"))
		if err := fgplot.WritePNG(path, width, row*1.2, a, c); err != nil {
			return err
		}
	}
	for _, sc := range []struct{ name, title string }{
		{"step", "Step 0.7× → 3× → 0.7×"},
		{"capchange", "Capacity change at 1.2× (cost doubles at 10 s)"},
		{"burst", "Tenant burst (heavy tenant 5× from 5 s to 15 s)"},
		{neighbourIdle, "Idle server (0.5×) beside a CPU-burning neighbour"},
		{neighbourOverload, "Overload (2×) beside a CPU-burning neighbour"},
		{retryStorm, "Retry storm at 3×: no retries, naive retries, throttled"},
	} {
		if !drawn(sc.name) {
			continue
		}
		var good, scale, lat, light, limit, wire []fgplot.Series
		var offered plotter.XYs
		for _, v := range vs {
			r := res.run(sc.name, v)
			if r == nil {
				continue
			}
			var g, l, lt, wx plotter.XYs
			for _, s := range r.Seconds {
				x := float64(s.T) + 0.5
				g = append(g, plotter.XY{X: x, Y: float64(s.Good)})
				wx = append(wx, plotter.XY{X: x, Y: float64(s.Wire)})
				y := s.P99
				if y < 0 {
					y = math.NaN()
				}
				l = append(l, plotter.XY{X: x, Y: y})
				lt = append(lt, plotter.XY{X: x, Y: 100 * float64(s.LightGood) / math.Max(float64(s.LightSent), 1)})
				if len(offered) < len(r.Seconds) && v == vs[0] {
					offered = append(offered, plotter.XY{X: x, Y: s.Offered})
				}
			}
			col := fgplot.Palette[color(v)]
			good = append(good, fgplot.Series{Name: v, Color: col, XYs: g})
			lat = append(lat, fgplot.Series{Name: v, Color: col, XYs: l})
			light = append(light, fgplot.Series{Name: v, Color: col, XYs: lt})
			if r.Wire {
				wire = append(wire, fgplot.Series{Name: v, Color: col, XYs: wx})
			}
			if v == "C" || v == "D" {
				var sx plotter.XYs
				for _, p := range r.Gate {
					sx = append(sx, plotter.XY{X: p.T, Y: 100 * p.Scale})
				}
				scale = append(scale, fgplot.Series{Name: v + " gate scale", Color: col, XYs: sx})
				var rx plotter.XYs
				for _, p := range r.Gate {
					rx = append(rx, plotter.XY{X: p.T, Y: 100 * p.Reading})
				}
				scale = append(scale, fgplot.Series{Name: v + " CPU reading", Color: col, Dash: fgplot.Dashed, XYs: rx})
			}
			if v == targetVariant {
				var lx, ix plotter.XYs
				for _, p := range r.Gate {
					if p.Limit > 0 {
						lx = append(lx, plotter.XY{X: p.T, Y: p.Limit})
						ix = append(ix, plotter.XY{X: p.T, Y: float64(p.Inflight + p.Queued)})
					}
				}
				if len(lx) > 0 {
					limit = append(limit, fgplot.Series{Name: v + " concurrency limit", Color: col, XYs: lx},
						fgplot.Series{Name: v + " calls in flight and waiting", Color: col, Dash: fgplot.Dashed, XYs: ix})
				}
			}
		}
		good = append(good, fgplot.Series{Name: "offered", Color: fgplot.Black, Dash: fgplot.Dashed, XYs: offered})
		panels := []*plot.Plot{fgplot.TimePanel(sc.title, "goodput (calls/s)", good)}
		panels[0].Y.Min = 0
		// The offered line dwarfs goodput at 3×; keep goodput readable.
		panels[0].Y.Max = math.Min(panels[0].Y.Max, 2.2*res.Capacity)
		if sc.name == "burst" {
			p := fgplot.TimePanel("", "light tenants' success (%)", light)
			p.Y.Min, p.Y.Max = 0, 135
			panels = append(panels, p)
		}
		if len(wire) > 0 {
			// The offered calls again, for scale: the wire carries their
			// attempts.
			p := fgplot.TimePanel("", "attempts on the wire (/s)", append(wire, good[len(good)-1]))
			p.Y.Min = 0
			panels = append(panels, p)
		}
		if len(scale) > 0 {
			p := fgplot.TimePanel("", "gate scale and CPU reading (%)", scale)
			p.Y.Min, p.Y.Max = 0, 150
			panels = append(panels, p)
		}
		if len(limit) > 0 {
			p := fgplot.TimePanel("", "concurrency limit and calls", limit)
			p.Y.Min = 0
			panels = append(panels, p)
		}
		lp := fgplot.TimePanel("", "accepted p99 (ms, log)", lat)
		logY(lp)
		panels = append(panels, lp)
		end := 0.0
		for _, s := range res.Scenarios {
			if s.Name == sc.name {
				end = s.Duration().Seconds()
			}
		}
		for _, p := range panels {
			p.X.Max = math.Max(end, 1)
		}
		panels[len(panels)-1].X.Label.Text = "time (s)"
		path := filepath.Join(dir, chartFile(sc.name))
		if err := fgplot.WritePNG(path, width, row, panels...); err != nil {
			return err
		}
	}
	return nil
}

// logY puts a latency panel on a log scale from 1 ms; a panel with no
// latency to show (every call failed) gets 1–1000 ms rather than an
// infinite range, which the log scale cannot draw.
func logY(p *plot.Plot) {
	if math.IsInf(p.Y.Min, 0) || math.IsInf(p.Y.Max, 0) || math.IsNaN(p.Y.Min) || math.IsNaN(p.Y.Max) || p.Y.Max <= 0 {
		p.Y.Min, p.Y.Max = 1, 200
	}
	fgplot.LogY(p, 1)
}
