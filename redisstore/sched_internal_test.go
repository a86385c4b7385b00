package redisstore

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestSchedWatch: a CPU-bound crowd of goroutines shows as a scheduling
// delay, recent and since a point in time; a wait from before an idle
// spell does not count as recent, though since still covers it.
func TestSchedWatch(t *testing.T) {
	var w schedWatch
	w.sample = sched.sample
	w.recentNow()
	start := int64(time.Since(monoBase))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := 0; i < 1e6; i++ { // no preemption point but the loop's
				}
			}
		})
	}
	var busy time.Duration
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && busy < 5*time.Millisecond; {
		time.Sleep(schedWindow)
		busy = max(busy, w.recentNow())
	}
	close(stop)
	wg.Wait()
	if busy < 5*time.Millisecond {
		t.Fatalf("recent delay with %d spinning goroutines on %d Ps = %v, want ≥ 5ms", 4*runtime.GOMAXPROCS(0), runtime.GOMAXPROCS(0), busy)
	}
	if got := w.since(start); got < busy {
		t.Errorf("since the crowd started = %v, want ≥ the recent %v", got, busy)
	}
	if testing.Short() {
		return
	}
	time.Sleep(staleWindow + schedWindow) // idle: the next window is stale
	if got := w.recentNow(); got != 0 {
		t.Errorf("recent delay after an idle spell = %v, want 0", got)
	}
}

// recentNow samples now and returns the recent delay.
func (w *schedWatch) recentNow() time.Duration {
	w.mu.Lock()
	w.read(int64(time.Since(monoBase)))
	w.mu.Unlock()
	return time.Duration(w.delay.Load())
}
