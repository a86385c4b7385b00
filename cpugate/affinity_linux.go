package cpugate

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// affinityCPUs returns how many CPUs this process may run on now, from
// sched_getaffinity. Unlike runtime.NumCPU it is read live, so a taskset or a
// cpuset change after start is seen. On failure it falls back to NumCPU.
func affinityCPUs() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return runtime.NumCPU()
	}
	if n := set.Count(); n > 0 {
		return n
	}
	return runtime.NumCPU()
}
