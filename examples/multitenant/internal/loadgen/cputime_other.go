//go:build !unix

package loadgen

import "time"

// processCPU reports that CPU time is not measured here; the capacity probe
// then counts wall time, which a sequential caller spends about one CPU on.
func processCPU() (time.Duration, bool) { return 0, false }
