// Package plot draws the time-series and sweep charts of floodgate's
// examples and of the overload experiment (bench/cmd/overload) with
// gonum.org/v1/plot: panels of lines stacked into one PNG. It is a module
// of its own, which the examples and bench modules require, so that neither
// needs the other and the core module does not depend on gonum; it is not
// part of floodgate's API.
package plot

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// A Series is one line of a panel. Points whose Y is NaN are left out.
type Series struct {
	Name  string
	Color color.Color
	Dash  []vg.Length
	XYs   plotter.XYs
}

// Colours and the dash pattern the charts share.
var (
	Blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	Green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	Red    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	Orange = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	Purple = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	Gray   = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
	Brown  = color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}
	Pink   = color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}
	Black  = color.RGBA{A: 0xff}
	Dashed = []vg.Length{vg.Points(5), vg.Points(3)}
)

// Palette is a list of distinct colours for charts with many series.
var Palette = []color.Color{Gray, Orange, Purple, Blue, Red, Green, Brown, Pink, Black}

// Panel returns a plot of the series with a legend in its top left corner
// and headroom above the lines for it.
func Panel(title, ylabel string, series []Series) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	top := 0.0
	for _, s := range series {
		xys := make(plotter.XYs, 0, len(s.XYs))
		for _, pt := range s.XYs {
			if !math.IsNaN(pt.Y) && !math.IsInf(pt.Y, 0) {
				xys = append(xys, pt)
				top = max(top, pt.Y)
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			continue // no finite points: nothing to draw
		}
		l.Color = s.Color
		l.Width = vg.Points(1.5)
		l.Dashes = s.Dash
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	p.Y.Max = max(p.Y.Max, top*(1+0.1*float64(len(series))))
	return p
}

// TimePanel is Panel with X in seconds from 0, ticked by SecondTicks.
func TimePanel(title, ylabel string, series []Series) *plot.Plot {
	p := Panel(title, ylabel, series)
	p.X.Min = 0
	p.X.Tick.Marker = plot.TickerFunc(SecondTicks)
	return p
}

// LogY puts p's Y axis on a log scale that starts at least at lo, with
// headroom up to a power of ten for the legend.
func LogY(p *plot.Plot, lo float64) {
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Min = max(p.Y.Min, lo)
	p.Y.Max = math.Pow(10, math.Ceil(math.Log10(max(p.Y.Max*5, p.Y.Min*100))))
	// The log axis's labels push its data area down; keep the legend in it.
	p.Legend.YOffs = -vg.Points(34)
}

// WritePNG stacks the panels vertically, width wide and rowHeight each, and
// writes them to path as a PNG, creating its directory.
func WritePNG(path string, width, rowHeight vg.Length, panels ...*plot.Plot) error {
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

// SecondTicks marks whole seconds: a labelled tick every 5, 10, 30 or 60 s,
// whichever gives at most a dozen, and minor ticks between.
func SecondTicks(lo, hi float64) []plot.Tick {
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
