package cpugate

import "time"

// A ProcessSampler measures this process's own CPU time (getrusage) against
// the CPUs it can use: the smaller of its affinity mask and GOMAXPROCS, both
// re-read every few seconds since either can change at run time. It sees no
// cgroup quota; [CgroupSampler] does.
//
// Threads that run outside GOMAXPROCS (in system calls or cgo) can take the
// process past its budget; such readings are reported as 1.
//
// It ignores other processes: use it when this process has the machine or
// its cgroup to itself and the cgroup is not visible, or when it shares a
// cgroup with busy processes. It is not safe for concurrent use.
type ProcessSampler struct {
	procs    procLimits
	cpus     int
	limitsAt time.Time
	last     time.Duration
	lastAt   time.Time
}

// NewProcessSampler returns a ProcessSampler whose first reading covers the
// time since this call. It returns an error wrapping [ErrUnsupported] where
// getrusage does not exist.
func NewProcessSampler() (*ProcessSampler, error) {
	return newProcessSampler(time.Now(), liveLimits)
}

// newProcessSampler reads this process's limits from procs, so tests can
// set them.
func newProcessSampler(now time.Time, procs procLimits) (*ProcessSampler, error) {
	u, err := processCPUTime()
	if err != nil {
		return nil, err
	}
	return &ProcessSampler{procs: procs, cpus: procs.cpus(), limitsAt: now, last: u, lastAt: now}, nil
}

// CPUs returns how many CPUs readings are measured against, as last read:
// the smaller of the affinity count and GOMAXPROCS.
func (p *ProcessSampler) CPUs() int { return p.cpus }

// Sample returns the process's CPU use since the previous sample. An error
// wraps [ErrNoReading].
func (p *ProcessSampler) Sample() (Reading, error) { return p.sampleAt(time.Now()) }

// sampleAt is Sample at time now, from the same clock as the previous
// call's.
func (p *ProcessSampler) sampleAt(now time.Time) (Reading, error) {
	u, err := processCPUTime()
	if err != nil {
		return Reading{Source: SourceProcess}, err
	}
	if now.Sub(p.limitsAt) >= limitsEvery {
		p.cpus, p.limitsAt = p.procs.cpus(), now
	}
	wall := now.Sub(p.lastAt)
	if wall < minInterval {
		return Reading{Source: SourceProcess}, ErrNoReading
	}
	busy := u - p.last
	p.last, p.lastAt = u, now
	return Reading{CPU: fraction(busy, wall, float64(p.cpus)), Source: SourceProcess}, nil
}
