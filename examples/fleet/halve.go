package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/floodgate-go/floodgate/internal/plot"
)

// halveRun drives the fleet at 0.6× under weighted_round_robin while the
// first replica loses half its pool, and reports how each replica's share
// of the calls moved.
func halveRun(ctx context.Context, cfg experimentConfig, capacity float64, w io.Writer) error {
	long := cfg
	long.Measure = 2 * cfg.Measure
	at := cfg.Warmup + cfg.Measure/2 // when the pool halves, from the start of the load
	res, offset, err := balanceCellAt(ctx, long, "weighted_round_robin", 0.6*capacity, at)
	if err != nil {
		return err
	}
	at -= offset // the replica's clock started before the load's
	caps := make([]float64, len(cfg.Pools))
	total := 0.0
	for i, p := range cfg.Pools {
		caps[i] = float64(p) / cfg.Hold.Seconds()
		if i == 0 {
			caps[i] /= 2
		}
		total += caps[i]
	}
	smooth := movingShares(res.shares, int(time.Second/binWidth))
	binAt := func(d time.Duration) int { return min(len(smooth)-1, max(0, int(d/binWidth))) }
	end := long.Warmup + long.Measure
	before := meanShare(smooth[binAt(at-4*time.Second):binAt(at)], 0)
	final := meanShare(smooth[binAt(end-5*time.Second):], 0)
	settled := settleTime(smooth, binAt(at), final, 0.05)
	fmt.Fprintf(w, "## A replica's capacity halves (weighted_round_robin, 0.6× the fleet's first capacity)\n\n")
	fmt.Fprintf(w, "Replica r0's pool goes from %d to %d connections %.1f s into the load.\n\n", cfg.Pools[0], cfg.Pools[0]/2, at.Seconds())
	fmt.Fprintf(w, "| r0's share of calls before | after (last 5 s) | its share of the capacity after | settled within ±5 points after | served within %v | shed |\n|---|---|---|---|---|---|\n", cfg.SLO)
	settledText := "did not settle"
	if settled >= 0 {
		settledText = fmt.Sprintf("%.2f s", settled.Seconds())
	}
	fmt.Fprintf(w, "| %.1f%% | %.1f%% | %.1f%% | %s | %.1f%% of offered | %.2f%% |\n\n",
		100*before, 100*final, 100*caps[0]/total, settledText, 100*res.inSLO/res.offered, 100*res.shed/res.offered)
	if cfg.Chart == "" {
		return nil
	}
	var series []plot.Series
	colors := []plot.Series{{Name: "r0 (halves)", Color: plot.Red}, {Name: "r1", Color: plot.Blue}, {Name: "r2 (a third)", Color: plot.Green}}
	for i := range cfg.Pools {
		s := colors[i%len(colors)]
		for b, row := range smooth {
			s.XYs = append(s.XYs, plotter.XY{X: (time.Duration(b+1) * binWidth).Seconds(), Y: 100 * row[i]})
		}
		series = append(series, s)
	}
	series = append(series, plot.Series{Name: "r0's share of the capacity", Color: plot.Red, Dash: plot.Dashed,
		XYs: plotter.XYs{{X: 0, Y: 100 * float64(cfg.Pools[0]) / sum(cfg.Pools)}, {X: at.Seconds(), Y: 100 * float64(cfg.Pools[0]) / sum(cfg.Pools)},
			{X: at.Seconds(), Y: 100 * caps[0] / total}, {X: end.Seconds(), Y: 100 * caps[0] / total}}})
	p := plot.TimePanel(fmt.Sprintf("share of calls per replica, 1 s moving average; r0 loses half its pool at %.1f s", at.Seconds()), "% of calls", series)
	return plot.WritePNG(cfg.Chart, 9*vg.Inch, 3.5*vg.Inch, p)
}

func sum(xs []int) float64 {
	s := 0
	for _, x := range xs {
		s += x
	}
	return float64(s)
}

// movingShares averages each replica's share over n bins ending at each.
func movingShares(shares [][]float64, n int) [][]float64 {
	out := make([][]float64, len(shares))
	for b := range shares {
		row := make([]float64, len(shares[b]))
		for i := range row {
			s, k := 0.0, 0
			for j := max(0, b-n+1); j <= b; j++ {
				if v := shares[j][i]; !math.IsNaN(v) {
					s, k = s+v, k+1
				}
			}
			row[i] = math.NaN()
			if k > 0 {
				row[i] = s / float64(k)
			}
		}
		out[b] = row
	}
	return out
}

// meanShare is replica i's mean share over rows.
func meanShare(rows [][]float64, i int) float64 {
	s, k := 0.0, 0
	for _, r := range rows {
		if !math.IsNaN(r[i]) {
			s, k = s+r[i], k+1
		}
	}
	if k == 0 {
		return math.NaN()
	}
	return s / float64(k)
}

// settleTime returns how long after bin from replica 0's share came within
// tol of final and stayed there, or -1.
func settleTime(rows [][]float64, from int, final, tol float64) time.Duration {
	last := -1
	for b := len(rows) - 1; b >= from; b-- {
		if math.IsNaN(rows[b][0]) || math.Abs(rows[b][0]-final) > tol {
			last = b
			break
		}
	}
	if last == len(rows)-1 {
		return -1
	}
	if last < from {
		return 0
	}
	return time.Duration(last+1-from) * binWidth
}
