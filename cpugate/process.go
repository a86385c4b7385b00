package cpugate

import "time"

// A ProcessSampler measures this process's own CPU time (getrusage) against
// the CPUs it may run on (its affinity mask, re-read every few seconds).
//
// It ignores other processes: use it when this process has the machine or
// its cgroup to itself and the cgroup is not visible. It is not safe for
// concurrent use.
type ProcessSampler struct {
	cpus     int
	limitsAt time.Time
	last     time.Duration
	lastAt   time.Time
}

// NewProcessSampler returns a ProcessSampler whose first reading covers the
// time since this call. It returns an error wrapping [ErrUnsupported] where
// getrusage does not exist.
func NewProcessSampler() (*ProcessSampler, error) {
	return newProcessSampler(time.Now())
}

func newProcessSampler(now time.Time) (*ProcessSampler, error) {
	u, err := processCPUTime()
	if err != nil {
		return nil, err
	}
	return &ProcessSampler{cpus: affinityCPUs(), limitsAt: now, last: u, lastAt: now}, nil
}

// CPUs returns how many CPUs the process may run on, as last read.
func (p *ProcessSampler) CPUs() int { return p.cpus }

// Sample returns the process's CPU use since the previous sample.
func (p *ProcessSampler) Sample() (Reading, error) { return p.SampleAt(time.Now()) }

// SampleAt is [ProcessSampler.Sample] at time now, from the same clock as
// the previous call's. An error wraps [ErrNoReading].
func (p *ProcessSampler) SampleAt(now time.Time) (Reading, error) {
	u, err := processCPUTime()
	if err != nil {
		return Reading{Source: SourceProcess}, err
	}
	if now.Sub(p.limitsAt) >= limitsEvery {
		p.cpus, p.limitsAt = affinityCPUs(), now
	}
	wall := now.Sub(p.lastAt)
	if wall < minInterval {
		return Reading{Source: SourceProcess}, ErrNoReading
	}
	busy := u - p.last
	p.last, p.lastAt = u, now
	return Reading{CPU: fraction(busy, wall, float64(p.cpus)), Source: SourceProcess}, nil
}

// Peek returns the process's CPU use since the latest Sample, without
// ending the interval (see [Peeker]).
func (p *ProcessSampler) Peek() (Reading, error) { return p.PeekAt(time.Now()) }

// PeekAt is [ProcessSampler.Peek] at time now, from the same clock as the
// latest Sample's. An error wraps [ErrNoReading].
func (p *ProcessSampler) PeekAt(now time.Time) (Reading, error) {
	wall := now.Sub(p.lastAt)
	if wall < MinPeek {
		return Reading{Source: SourceProcess}, ErrNoReading
	}
	u, err := processCPUTime()
	if err != nil {
		return Reading{Source: SourceProcess}, err
	}
	return Reading{CPU: fraction(u-p.last, wall, float64(p.cpus)), Source: SourceProcess}, nil
}
