package cpugate

import (
	"errors"
	"math"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestBudgetProcessLimits: the budget is the smallest of the cgroup quota,
// the cpuset, the affinity and GOMAXPROCS.
func TestBudgetProcessLimits(t *testing.T) {
	tests := []struct {
		name                 string
		root                 string
		quota                string // v1 cpu.cfs_quota_us to write over the fixture's, if set
		affinity, gomaxprocs int
		want                 float64
	}{
		{name: "quota 2, GOMAXPROCS 1", root: "v1-quota", quota: "200000\n", affinity: 2, gomaxprocs: 1, want: 1},
		{name: "quota 2, affinity 1", root: "v1-quota", quota: "200000\n", affinity: 1, gomaxprocs: 2, want: 1},
		{name: "quota 2, both 2", root: "v1-quota", quota: "200000\n", affinity: 2, gomaxprocs: 2, want: 2},
		{name: "quota 0.5, GOMAXPROCS 4", root: "v1-quota", affinity: 4, gomaxprocs: 4, want: 0.5},
		{name: "no quota, affinity 1 of 2", root: "v1-quota", quota: "-1\n", affinity: 1, gomaxprocs: 2, want: 1},
		{name: "no quota, cpuset 8, affinity 1", root: "v1", affinity: 1, gomaxprocs: 8, want: 1},
		{name: "no quota, cpuset 8, GOMAXPROCS 3", root: "v2", affinity: 8, gomaxprocs: 3, want: 3},
		{name: "quota 1.5 under 2, GOMAXPROCS 1", root: "v2-nested", affinity: 8, gomaxprocs: 1, want: 1},
		{name: "quota 1.5 under 2, GOMAXPROCS 8", root: "v2-nested", affinity: 8, gomaxprocs: 8, want: 1.5},
		{name: "nonsense limits count as 1", root: "v2", affinity: 0, gomaxprocs: 0, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := copyTree(t, tt.root)
			if tt.quota != "" {
				write(t, root, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", tt.quota)
			}
			fsys := os.DirFS(root)
			p, err := findCgroup(fsys)
			if err != nil {
				t.Fatal(err)
			}
			lim := limits(tt.affinity, tt.gomaxprocs)
			if got, err := readBudget(readFS(fsys), p, lim); err != nil || got != tt.want {
				t.Errorf("readBudget() = %v, %v, want %v, nil", got, err, tt.want)
			}
			s, err := newCgroupSampler(root, time.Unix(1000, 0), lim)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.Budget(); got != tt.want {
				t.Errorf("Budget() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCgroupSamplerGOMAXPROCS is the pinned server: a cgroup allowed 2 CPUs,
// GOMAXPROCS 1. One CPU-second per second is saturation, and GOMAXPROCS
// raised at run time counts from the next limits re-read.
func TestCgroupSamplerGOMAXPROCS(t *testing.T) {
	root := copyTree(t, "v1-quota")
	write(t, root, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "200000\n")
	gomaxprocs := 1
	lim := procLimits{
		affinity:   func() int { return 2 },
		gomaxprocs: func() int { return gomaxprocs },
	}
	t0 := time.Unix(1000, 0)
	s, err := newCgroupSampler(root, t0, lim) // usage starts at 1 CPU-second
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	steps := []struct {
		name       string
		gomaxprocs int // set before the sample
		at         time.Duration
		usage      string // cumulative ns
		cpu        float64
		budget     float64
	}{
		{"saturated at GOMAXPROCS 1", 1, time.Second, "2000000000\n", 1, 1},
		{"another process in the cgroup: over 1, reported as 1", 1, 2 * time.Second, "3600000000\n", 1, 1},
		{"half busy", 1, 3 * time.Second, "4100000000\n", 0.5, 1},
		{"GOMAXPROCS 2, not yet re-read", 2, 4 * time.Second, "5100000000\n", 1, 1},
		{"GOMAXPROCS 2 at the re-read", 2, limitsEvery, "6100000000\n", 0.5, 2},
		{"GOMAXPROCS 4, bounded by the affinity", 4, 2 * limitsEvery, "11100000000\n", 0.5, 2},
	}
	for _, st := range steps {
		gomaxprocs = st.gomaxprocs
		write(t, root, v1Usage, st.usage)
		r, err := s.sampleAt(t0.Add(st.at))
		if err != nil || math.Abs(r.CPU-st.cpu) > 1e-12 || s.Budget() != st.budget {
			t.Errorf("%s: sampleAt(%v) = %v, %v, budget %v, want CPU %v, budget %v",
				st.name, st.at, r, err, s.Budget(), st.cpu, st.budget)
		}
	}
}

// TestProcessSamplerGOMAXPROCS: a process sampler counts the smaller of the
// affinity and GOMAXPROCS, re-read with the other limits.
func TestProcessSamplerGOMAXPROCS(t *testing.T) {
	affinity, gomaxprocs := 4, 1
	lim := procLimits{
		affinity:   func() int { return affinity },
		gomaxprocs: func() int { return gomaxprocs },
	}
	t0 := time.Unix(1000, 0)
	s, err := newProcessSampler(t0, lim)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.CPUs(), 1; got != want {
		t.Errorf("CPUs() with affinity 4, GOMAXPROCS 1 = %d, want %d", got, want)
	}
	gomaxprocs = 8
	if _, err := s.sampleAt(t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, want := s.CPUs(), 1; got != want {
		t.Errorf("CPUs() before the limits re-read = %d, want %d", got, want)
	}
	if _, err := s.sampleAt(t0.Add(limitsEvery)); err != nil {
		t.Fatal(err)
	}
	if got, want := s.CPUs(), 4; got != want {
		t.Errorf("CPUs() after the re-read, affinity 4, GOMAXPROCS 8 = %d, want %d", got, want)
	}
}

// TestLiveLimitsGOMAXPROCS checks the production limits follow the real
// runtime.GOMAXPROCS, which it lowers for the test and then restores.
func TestLiveLimitsGOMAXPROCS(t *testing.T) {
	if affinityCPUs() < 2 {
		t.Skip("needs 2 CPUs to run on, to set GOMAXPROCS below them")
	}
	prev := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	if got, want := liveLimits.cpus(), 1; got != want {
		t.Errorf("liveLimits.cpus() at GOMAXPROCS 1 = %d, want %d", got, want)
	}
	s, err := NewProcessSampler()
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.CPUs(), 1; got != want {
		t.Errorf("ProcessSampler.CPUs() at GOMAXPROCS 1 = %d, want %d", got, want)
	}
	if c, err := NewCgroupSampler(); err == nil {
		defer c.Close()
		if got := c.Budget(); got > 1 {
			t.Errorf("CgroupSampler.Budget() at GOMAXPROCS 1 = %v, want at most 1", got)
		}
	}
	runtime.GOMAXPROCS(2)
	if got, want := liveLimits.cpus(), 2; got != want {
		t.Errorf("liveLimits.cpus() at GOMAXPROCS 2 = %d, want %d", got, want)
	}
}
