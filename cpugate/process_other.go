//go:build !unix

package cpugate

import "time"

func processCPUTime() (time.Duration, error) { return 0, ErrUnsupported }
