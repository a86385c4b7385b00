package plot

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

func TestWritePNG(t *testing.T) {
	xys := plotter.XYs{{X: 0, Y: 1}, {X: 1, Y: math.NaN()}, {X: 2, Y: 3}}
	a := TimePanel("t", "calls/s", []Series{{Name: "a", Color: Red, XYs: xys}, {Name: "empty", Color: Blue}})
	b := Panel("", "ms", []Series{{Name: "b", Color: Green, Dash: Dashed, XYs: xys}})
	LogY(b, 0.1)
	path := filepath.Join(t.TempDir(), "sub", "c.png")
	if err := WritePNG(path, 10*vg.Centimeter, 5*vg.Centimeter, a, b); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("\x89PNG")) {
		t.Fatalf("%s is not a PNG", path)
	}
}

func TestSecondTicks(t *testing.T) {
	ticks := SecondTicks(0, 30)
	if len(ticks) == 0 || ticks[0].Label != "0" {
		t.Fatalf("SecondTicks(0, 30) = %v", ticks)
	}
}
