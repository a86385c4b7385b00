package cpugate

import (
	"fmt"

	"github.com/shirou/gopsutil/v3/cpu"
)

// A HostSampler measures the whole machine's CPU use, from the deltas of its
// own successive cpu.Times readings (gopsutil): busy time over total time,
// across all CPUs.
//
// It keeps its own baseline on purpose. gopsutil's cpu.Percent(0) compares
// with a baseline shared by every caller in the process, so two users of it
// would each see the interval since the other's call.
//
// It is the portable fallback: it works wherever gopsutil does, but it sees
// other tenants' load, not this process's budget. It measures against every
// CPU of the machine, whatever this process's quota, affinity or GOMAXPROCS:
// a process that saturates the one CPU it is pinned to reads 0.5 on a
// machine of two. Parsing /proc/stat also costs more than reading one cgroup
// counter. It is not safe for concurrent use.
type HostSampler struct {
	busy, total float64 // seconds, at the previous reading
	times       func() (cpu.TimesStat, error)
}

// NewHostSampler returns a HostSampler whose first reading covers the time
// since this call.
func NewHostSampler() (*HostSampler, error) {
	return newHostSampler(hostTimes)
}

func newHostSampler(times func() (cpu.TimesStat, error)) (*HostSampler, error) {
	h := &HostSampler{times: times}
	t, err := times()
	if err != nil {
		return nil, err
	}
	h.busy, h.total = busyTotal(t)
	return h, nil
}

func hostTimes() (cpu.TimesStat, error) {
	ts, err := cpu.Times(false)
	if err != nil {
		return cpu.TimesStat{}, fmt.Errorf("%w: cpu.Times: %w", ErrNoReading, err)
	}
	if len(ts) == 0 {
		return cpu.TimesStat{}, fmt.Errorf("%w: cpu.Times returned nothing", ErrNoReading)
	}
	return ts[0], nil
}

// busyTotal splits CPU times into busy and total seconds. Guest time is
// already counted in user time on Linux, so it is left out of the total, as
// gopsutil itself does; idle and iowait are the only non-busy states.
func busyTotal(t cpu.TimesStat) (busy, total float64) {
	total = t.User + t.System + t.Idle + t.Nice + t.Iowait + t.Irq + t.Softirq + t.Steal
	return total - t.Idle - t.Iowait, total
}

// Sample returns the host's CPU use since the previous sample. An error wraps
// [ErrNoReading]; the baseline is then kept.
func (h *HostSampler) Sample() (Reading, error) {
	t, err := h.times()
	if err != nil {
		return Reading{Source: SourceHost}, err
	}
	busy, total := busyTotal(t)
	db, dt := busy-h.busy, total-h.total
	// /proc/stat counts in clock ticks (10 ms): until a tick has passed
	// there is nothing to divide by.
	if dt == 0 {
		return Reading{Source: SourceHost}, ErrNoReading
	}
	// Totals that went backwards (iowait may decrease, proc(5) says, and
	// an unplugged CPU takes its idle time with it) start a new baseline:
	// kept, the old one would refuse every reading until the totals
	// climbed back past it.
	if dt < 0 {
		h.busy, h.total = busy, total
		return Reading{Source: SourceHost}, ErrNoReading
	}
	h.busy, h.total = busy, total
	f := db / dt
	switch {
	case f < 0:
		f = 0
	case f > 1:
		f = 1
	}
	return Reading{CPU: f, Source: SourceHost}, nil
}
