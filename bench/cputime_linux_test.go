package bench

import (
	"syscall"
	"time"
)

const rusageThread = 1 // RUSAGE_THREAD, missing from package syscall

// threadCPU returns the CPU time the calling thread has used, or false.
func threadCPU() (time.Duration, bool) { return rusage(rusageThread) }

// processCPU returns the CPU time the process has used, or false.
func processCPU() (time.Duration, bool) { return rusage(syscall.RUSAGE_SELF) }

func rusage(who int) (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
