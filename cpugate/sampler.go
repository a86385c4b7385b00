package cpugate

import (
	"errors"
	"runtime"
	"time"
)

// Source labels name the built-in samplers in [Reading.Source], in logs and in
// metrics. They are short, fixed and safe to use as a metric label.
const (
	SourceCgroup2 = "cgroup2" // the cgroup v2 cpu controller: usage_usec against cpu.max and the cpuset
	SourceCgroup1 = "cgroup1" // the cgroup v1 cpuacct and cpu controllers: usage against the CFS quota
	SourceProcess = "process" // getrusage of this process against the CPUs it can use (affinity, GOMAXPROCS)
	SourceHost    = "host"    // the whole machine's busy time, from /proc/stat or the OS equivalent
)

// Sentinel errors, for errors.Is.
var (
	// ErrNoReading means a sampler has nothing new to report: the interval
	// since its previous read was too short, a counter went backwards, or a
	// read failed. The gate keeps its state and counts the failure; it never
	// turns a missing reading into 0% or 100%.
	ErrNoReading = errors.New("cpugate: no new reading")
	// ErrNoCgroup means no usable cgroup cpu accounting was found for this
	// process: not on Linux, no cgroup mounted, or the controller missing.
	ErrNoCgroup = errors.New("cpugate: no cgroup cpu accounting")
	// ErrUnsupported means a sampler cannot work on this operating system.
	ErrUnsupported = errors.New("cpugate: unsupported on this platform")
)

// errMalformed is wrapped by the error for a kernel file that did not have
// the expected format; the message names the file and quotes its start.
var errMalformed = errors.New("cpugate: malformed file")

// A Reading is one measurement of CPU use.
//
// CPU is the fraction of the CPU available to this process that was busy over
// the interval since the sampler's previous reading: 0 is idle, 1 is all of
// it. "Available" means what this process can use: the smallest of its
// container's quota, the CPUs it may run on and GOMAXPROCS (see the package
// documentation); a [HostSampler] measures the whole machine instead.
// Samplers report values above 1 (timer jitter, burst quota, other
// processes in the cgroup) as 1.
//
// SchedP99 is the guard signal: the 99th percentile of the time goroutines
// waited to run during the interval, or 0 when unknown. Only [SchedGuard]
// fills it.
type Reading struct {
	CPU      float64
	SchedP99 time.Duration
	// Source names the sampler that produced the reading, such as
	// [SourceCgroup2].
	Source string
}

// A Sampler measures CPU use. Each call to Sample returns the use over the
// interval since the previous call (or since the sampler was made). An error
// means there is no new reading; it is never a reading of 0 or 1.
//
// The gate calls Sample from one goroutine at a time. The samplers of this
// package are not safe for concurrent use.
type Sampler interface {
	Sample() (Reading, error)
}

// SamplerFunc adapts a function to a [Sampler], for tests, scripted loads and
// signals of your own.
type SamplerFunc func() (Reading, error)

// Sample returns f().
func (f SamplerFunc) Sample() (Reading, error) { return f() }

// limitsEvery is how often samplers re-read limits (quota, cpuset, affinity,
// GOMAXPROCS). They change at run time (a resized pod, a moved container, a
// taskset, a call to runtime.GOMAXPROCS or the runtime following a new
// quota), but rarely, and re-reading them costs more than a sample.
const limitsEvery = 5 * time.Second

// procLimits reads how many CPUs this process can keep busy at once: no
// more than it may run on, and no more than GOMAXPROCS, since Go runs its
// code on at most GOMAXPROCS threads. A process held below its cgroup's
// quota is saturated at these, so readings are measured against them. The
// samplers call them at each limits re-read; tests replace them.
type procLimits struct {
	affinity   func() int // CPUs in the affinity mask
	gomaxprocs func() int // runtime.GOMAXPROCS(0)
}

// liveLimits reads this process's limits from the kernel and the runtime.
var liveLimits = procLimits{
	affinity:   affinityCPUs,
	gomaxprocs: func() int { return runtime.GOMAXPROCS(0) },
}

// cpus returns the smaller limit, at least 1.
func (l procLimits) cpus() int { return max(1, min(l.affinity(), l.gomaxprocs())) }

// minInterval is the shortest interval a sampler turns into a reading. Below
// it, counter granularity (1 µs, or a 10 ms tick for /proc/stat) dominates.
const minInterval = time.Millisecond

// fraction turns busy time over an interval into a fraction of budget CPUs,
// reported within [0, 1].
func fraction(busy, wall time.Duration, cpus float64) float64 {
	f := busy.Seconds() / (wall.Seconds() * cpus)
	switch {
	case f < 0:
		return 0
	case f > 1:
		return 1
	}
	return f
}

// NewSampler returns the best sampler available to this process and its
// source label, for logs and metrics. It prefers, in order: the cgroup
// (container) accounting of this process, its own CPU time (getrusage), and
// the host's CPU time. The cgroup is best because a container's quota is the
// budget the kernel enforces; process time is next because it sees only this
// process but is exact; host time is the portable fallback.
//
// NewSampler reads files but starts nothing.
func NewSampler() (s Sampler, source string, err error) {
	if c, cerr := NewCgroupSampler(); cerr == nil {
		return c, c.Source(), nil
	} else {
		err = cerr
	}
	if p, perr := NewProcessSampler(); perr == nil {
		return p, SourceProcess, nil
	} else {
		err = errors.Join(err, perr)
	}
	h, herr := NewHostSampler()
	if herr != nil {
		return nil, "", errors.Join(err, herr)
	}
	return h, SourceHost, nil
}

var (
	_ Sampler = SamplerFunc(nil)
	_ Sampler = (*CgroupSampler)(nil)
	_ Sampler = (*ProcessSampler)(nil)
	_ Sampler = (*HostSampler)(nil)
	_ Sampler = (*SchedGuard)(nil)
	_ Policy  = Fixed{}
	_ Policy  = Adaptive{}
)
