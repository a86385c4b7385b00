//go:build !linux

package promfloodgate

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
