package redisstore

import (
	"testing"
	"time"
)

// TestCountedAfterGap: after a gap in registrations, a lower count does
// not replace the higher one for another instanceTTL: the set expired
// meanwhile, and the first store back would count itself alone and take a
// share of the whole limit while the others re-register.
func TestCountedAfterGap(t *testing.T) {
	in := newInstances("p", "n")
	in.counted(3)
	if got := in.count.Load(); got != 3 {
		t.Fatalf("count %d after counting 3; want 3", got)
	}
	// The last registration was long ago: Redis was down, or the store idle.
	now := int64(time.Since(monoBase))
	in.mu.Lock()
	in.lastOK, in.highAt = now-int64(10*time.Second), now-int64(10*time.Second)
	in.mu.Unlock()
	in.counted(1)
	if got := in.count.Load(); got != 3 {
		t.Errorf("count %d after a gap and a count of 1; want 3 kept", got)
	}
	// Without a gap, a lower count replaces a higher one only once the
	// higher one is instanceTTL old.
	in.counted(2)
	if got := in.count.Load(); got != 3 {
		t.Errorf("count %d a moment after; want 3 kept", got)
	}
	in.mu.Lock()
	in.highAt -= int64(instanceTTL)
	in.mu.Unlock()
	in.counted(2)
	if got := in.count.Load(); got != 2 {
		t.Errorf("count %d once the higher count is old; want 2", got)
	}
}
