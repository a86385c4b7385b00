//go:build !linux

package cpugate

import "runtime"

// affinityCPUs returns the CPUs this process may use. Outside Linux the
// runtime's count, taken at start, is the best portable answer.
func affinityCPUs() int { return runtime.NumCPU() }
