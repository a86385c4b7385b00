package burn

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBurnStopsWithItsContext(t *testing.T) {
	b := Calibrate()
	if b.PerIteration() <= 0 {
		t.Fatalf("PerIteration = %v, want > 0", b.PerIteration())
	}
	if err := b.Burn(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Burn: %v", err)
	}
	if got := WithPerIteration(b.PerIteration()).PerIteration(); got != b.PerIteration() {
		t.Errorf("WithPerIteration(%v).PerIteration() = %v", b.PerIteration(), got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Burn(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Burn with a cancelled context = %v, want context.Canceled", err)
	}
}
