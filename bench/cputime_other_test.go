//go:build !linux

package bench

import "time"

func threadCPU() (time.Duration, bool)  { return 0, false }
func processCPU() (time.Duration, bool) { return 0, false }
