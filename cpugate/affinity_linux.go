package cpugate

import (
	"math/bits"
	"runtime"
	"syscall"
	"unsafe"
)

// affinityCPUs returns how many CPUs this process may run on now, from
// sched_getaffinity. Unlike runtime.NumCPU it is read live, so a taskset or a
// cpuset change after start is seen. On failure it falls back to NumCPU.
func affinityCPUs() int {
	var mask [128]uint64 // 8192 CPUs
	n, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0,
		uintptr(len(mask)*8), uintptr(unsafe.Pointer(&mask[0])))
	if errno != 0 || n == 0 {
		return runtime.NumCPU()
	}
	count := 0
	for _, w := range mask[:(n+7)/8] {
		count += bits.OnesCount64(w)
	}
	if count == 0 {
		return runtime.NumCPU()
	}
	return count
}
