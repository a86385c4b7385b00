//go:build unix

package cpugate

import (
	"fmt"
	"syscall"
	"time"
)

// processCPUTime returns the user plus system CPU time this process has used.
func processCPUTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("%w: getrusage: %w", ErrNoReading, err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
