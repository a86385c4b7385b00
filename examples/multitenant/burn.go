package main

import (
	"context"
	"time"

	"github.com/floodgate-go/floodgate/internal/burn"
)

// A burner spends CPU time on purpose: the simulated work of an allocation.
// The calibrated loop lives in internal/burn, shared with the overload
// experiment in bench/cmd/overload.
type burner struct{ b *burn.Burner }

// calibrate measures the burn loop (see burn.Calibrate).
func calibrate() *burner { return &burner{b: burn.Calibrate()} }

// burn spends about d of CPU time on the calling goroutine and stops early
// with ctx's error once ctx is done (see burn.Burner.Burn).
func (bn *burner) burn(ctx context.Context, d time.Duration) error { return bn.b.Burn(ctx, d) }
