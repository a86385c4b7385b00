//go:build unix

package middleware_test

import (
	"syscall"
	"testing"
	"time"
)

// processCPU returns the CPU time (user and system) this process has used,
// on all its threads, GC workers included.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per op as cpu-ns/op. On a
// machine shared with other work, wall-clock ns/op also counts the time the
// benchmark waited for a core; CPU time does not.
func reportCPU(b *testing.B, run func()) {
	start := processCPU()
	run()
	b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
}
