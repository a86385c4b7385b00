package promfloodgate

import (
	"syscall"
	"time"
)

const rusageThread = 1 // RUSAGE_THREAD, missing from package syscall

// threadCPU returns the CPU time the calling thread has used, or false. On
// a shared machine it leaves out the time the thread waited for a core,
// which wall-clock time counts.
func threadCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
