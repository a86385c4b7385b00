package fakeclock_test

import (
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/fakeclock"
)

var _ floodgate.Clock = (*fakeclock.Clock)(nil)

func TestClock(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := fakeclock.New(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("Now() = %v, want %v", got, t0)
	}
	c.Advance(1500 * time.Millisecond)
	if got := c.Now(); !got.Equal(t0.Add(1500 * time.Millisecond)) {
		t.Errorf("after Advance(1.5s): %v", got)
	}
	c.Set(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Errorf("after Set: %v, want %v", got, t0)
	}
}
