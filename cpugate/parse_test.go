package cpugate

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/shirou/gopsutil/v3/cpu"
)

const fixtures = "../testdata/cgroup"

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtures, "files", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseCPUMax(t *testing.T) {
	tests := []struct {
		file    string
		cpus    float64
		limited bool
		err     error
	}{
		{file: "cpu.max.unlimited"},
		{file: "cpu.max.quota", cpus: 1.5, limited: true},
		{file: "cpu.max.malformed", err: errMalformed},
		{file: "cpu.max.zero-period", err: errMalformed},
		{file: "cpu.max.extra", err: errMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			cpus, limited, err := parseCPUMax(readFixture(t, tt.file))
			if !errors.Is(err, tt.err) {
				t.Fatalf("parseCPUMax() error = %v, want %v", err, tt.err)
			}
			if cpus != tt.cpus || limited != tt.limited {
				t.Errorf("parseCPUMax() = %v, %v, want %v, %v", cpus, limited, tt.cpus, tt.limited)
			}
		})
	}
}

func TestParseCFS(t *testing.T) {
	period := readFixture(t, "cpu.cfs_period_us")
	tests := []struct {
		file    string
		cpus    float64
		limited bool
		err     error
	}{
		{file: "cpu.cfs_quota_us.unlimited"},
		{file: "cpu.cfs_quota_us.quota", cpus: 0.5, limited: true},
		{file: "cpu.cfs_quota_us.malformed", err: errMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			cpus, limited, err := parseCFS(readFixture(t, tt.file), period)
			if !errors.Is(err, tt.err) {
				t.Fatalf("parseCFS() error = %v, want %v", err, tt.err)
			}
			if cpus != tt.cpus || limited != tt.limited {
				t.Errorf("parseCFS() = %v, %v, want %v, %v", cpus, limited, tt.cpus, tt.limited)
			}
		})
	}
	if _, _, err := parseCFS([]byte("50000\n"), []byte("0\n")); !errors.Is(err, errMalformed) {
		t.Errorf("parseCFS(period 0) error = %v, want errMalformed", err)
	}
}

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		file string
		n    int
		err  error
	}{
		{file: "cpuset.cpus", n: 8},
		{file: "cpuset.cpus.single", n: 1},
		{file: "cpuset.cpus.empty", err: errMalformed},
		{file: "cpuset.cpus.reversed", err: errMalformed},
		{file: "cpuset.cpus.open", err: errMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			n, err := parseCPUList(tt.file, readFixture(t, tt.file))
			if !errors.Is(err, tt.err) {
				t.Fatalf("parseCPUList() error = %v, want %v", err, tt.err)
			}
			if n != tt.n {
				t.Errorf("parseCPUList() = %d, want %d", n, tt.n)
			}
		})
	}
}

func TestParseCounters(t *testing.T) {
	if got, err := parseCPUStat(readFixture(t, "cpu.stat")); err != nil || got != 87368000 {
		t.Errorf("parseCPUStat(cpu.stat) = %d, %v, want 87368000, nil", got, err)
	}
	if _, err := parseCPUStat(readFixture(t, "cpu.stat.malformed")); !errors.Is(err, errMalformed) {
		t.Errorf("parseCPUStat(cpu.stat.malformed) error = %v, want errMalformed", err)
	}
	if got, err := parseCounter("cpuacct.usage", readFixture(t, "cpuacct.usage")); err != nil || got != 88229658184 {
		t.Errorf("parseCounter(cpuacct.usage) = %d, %v, want 88229658184, nil", got, err)
	}
	if _, err := parseCounter("cpuacct.usage", readFixture(t, "cpuacct.usage.malformed")); !errors.Is(err, errMalformed) {
		t.Errorf("parseCounter(cpuacct.usage.malformed) error = %v, want errMalformed", err)
	}
	if _, ok := parseDecimal([]byte("99999999999999999999")); ok {
		t.Error("parseDecimal(20 digits) ok, want overflow rejected")
	}
	if _, ok := parseDecimal([]byte("18446744073709551616")); ok {
		t.Error("parseDecimal(2^64) ok, want overflow rejected")
	}
	// A uint64 counter such as cpuacct.usage reaches 20 digits.
	for _, s := range []string{"10000000000000000000", "18446744073709551615"} {
		if got, err := parseCounter("cpuacct.usage", []byte(s+"\n")); err != nil || strconv.FormatUint(got, 10) != s {
			t.Errorf("parseCounter(%s) = %d, %v", s, got, err)
		}
	}
}

// TestHostTotalsBackwards: host totals that go backwards start a new
// baseline, and readings resume at the next sample.
func TestHostTotalsBackwards(t *testing.T) {
	tick := 0.0
	drop := false
	h, err := newHostSampler(func() (cpu.TimesStat, error) {
		tick++
		idle := 100 * tick
		if drop {
			idle -= 5000 // iowait or an unplugged CPU's idle time gone
		}
		return cpu.TimesStat{User: 100 * tick, Idle: idle}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := h.Sample(); err != nil || r.CPU != 0.5 {
		t.Fatalf("Sample = %+v, %v; want 0.5", r, err)
	}
	drop = true
	if _, err := h.Sample(); !errors.Is(err, ErrNoReading) {
		t.Fatalf("Sample after the totals dropped: %v, want ErrNoReading", err)
	}
	for i := range 3 {
		if r, err := h.Sample(); err != nil || r.CPU != 0.5 {
			t.Errorf("Sample %d after the drop = %+v, %v; want 0.5", i, r, err)
		}
	}
}

func TestParseProcCgroupAndMountinfo(t *testing.T) {
	if _, err := parseProcCgroup([]byte("garbage\n")); !errors.Is(err, errMalformed) {
		t.Errorf("parseProcCgroup(garbage) error = %v, want errMalformed", err)
	}
	if _, err := parseMountinfo([]byte("1 2 3\n")); !errors.Is(err, errMalformed) {
		t.Errorf("parseMountinfo(short line) error = %v, want errMalformed", err)
	}
	got, err := parseMountinfo([]byte(`40 30 0:37 / /sys/fs/my\040cgroup rw - cgroup2 cgroup2 rw` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []mount{{root: "/", point: "/sys/fs/my cgroup", fstype: "cgroup2", superOpts: []string{"rw"}}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(mount{})); diff != "" {
		t.Errorf("parseMountinfo() mismatch (-want +got):\n%s", diff)
	}
}

func TestFindCgroup(t *testing.T) {
	tests := []struct {
		root   string
		want   cgroupPaths
		budget float64
		err    error
	}{
		{
			root: "v2",
			want: cgroupPaths{
				version:   2,
				usage:     "sys/fs/cgroup/cpu.stat",
				quotaDirs: []string{"sys/fs/cgroup"},
				cpusets:   []string{"sys/fs/cgroup/cpuset.cpus.effective"},
			},
			budget: 8, // no quota ("max 100000"), cpuset 0-3,8-11
		},
		{
			root: "v2-nested",
			want: cgroupPaths{
				version: 2,
				usage:   "sys/fs/cgroup/kubepods.slice/pod1/ctr/cpu.stat",
				quotaDirs: []string{
					"sys/fs/cgroup/kubepods.slice/pod1/ctr",
					"sys/fs/cgroup/kubepods.slice/pod1",
					"sys/fs/cgroup/kubepods.slice",
					"sys/fs/cgroup",
				},
				cpusets: []string{
					"sys/fs/cgroup/kubepods.slice/pod1/ctr/cpuset.cpus.effective",
					"sys/fs/cgroup/kubepods.slice/pod1/cpuset.cpus.effective",
					"sys/fs/cgroup/kubepods.slice/cpuset.cpus.effective",
					"sys/fs/cgroup/cpuset.cpus.effective",
				},
			},
			budget: 1.5, // container 1.5 under a pod of 2, on 8 CPUs
		},
		{
			root: "v1",
			want: cgroupPaths{
				version: 1,
				usage:   "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpuacct.usage",
				quotaDirs: []string{
					"sys/fs/cgroup/cpu,cpuacct/docker/abc",
					"sys/fs/cgroup/cpu,cpuacct/docker",
					"sys/fs/cgroup/cpu,cpuacct",
				},
				cpusets: []string{
					"sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus",
					"sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus",
				},
			},
			budget: 8, // quota -1 everywhere; the v2 mount of a hybrid host is ignored
		},
		{
			root: "v1-quota",
			want: cgroupPaths{
				version:   1,
				usage:     "sys/fs/cgroup/cpuacct/cpuacct.usage",
				quotaDirs: []string{"sys/fs/cgroup/cpu"},
			},
			budget: 0.5,
		},
		{root: "no-controller", err: ErrNoCgroup},
		{root: "does-not-exist", err: ErrNoCgroup},
	}
	for _, tt := range tests {
		t.Run(tt.root, func(t *testing.T) {
			fsys := os.DirFS(filepath.Join(fixtures, tt.root))
			got, err := findCgroup(fsys)
			if !errors.Is(err, tt.err) {
				t.Fatalf("findCgroup() error = %v, want %v", err, tt.err)
			}
			if err != nil {
				return
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(cgroupPaths{})); diff != "" {
				t.Errorf("findCgroup() mismatch (-want +got):\n%s", diff)
			}
			budget, err := readBudget(readFS(fsys), got, limits(64, 64))
			if err != nil || budget != tt.budget {
				t.Errorf("readBudget() = %v, %v, want %v, nil", budget, err, tt.budget)
			}
		})
	}
}

func TestReadBudgetMalformed(t *testing.T) {
	fsys := os.DirFS(filepath.Join(fixtures, "malformed"))
	p, err := findCgroup(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readBudget(readFS(fsys), p, limits(2, 2)); !errors.Is(err, errMalformed) {
		t.Errorf("readBudget(malformed) error = %v, want errMalformed", err)
	}
	if _, err := newCgroupSampler(filepath.Join(fixtures, "malformed"), time.Now(), limits(2, 2)); !errors.Is(err, errMalformed) {
		t.Errorf("newCgroupSampler(malformed) error = %v, want errMalformed", err)
	}
}

// limits returns fixed process limits: affinity CPUs and GOMAXPROCS.
func limits(affinity, gomaxprocs int) procLimits {
	return procLimits{
		affinity:   func() int { return affinity },
		gomaxprocs: func() int { return gomaxprocs },
	}
}

func readFS(fsys fs.FS) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) { return fs.ReadFile(fsys, name) }
}

// copyTree copies a fixture tree to a temporary directory, so a test can
// rewrite counters and limits as the kernel would.
func copyTree(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	src := filepath.Join(fixtures, name)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, r), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, r), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func write(t *testing.T, root, name, content string) {
	t.Helper()
	// WriteFile truncates in place, so the sampler's open file sees the new
	// content, as it does when the kernel updates a counter.
	if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(name)), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCgroupSamplerV2(t *testing.T) {
	root := copyTree(t, "v2-nested")
	const dir = "sys/fs/cgroup/kubepods.slice/pod1/ctr/"
	write(t, root, dir+"cpu.stat", "usage_usec 1000000\nuser_usec 1\n")
	t0 := time.Unix(1000, 0)
	s, err := newCgroupSampler(root, t0, limits(64, 64))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if got, want := s.Source(), SourceCgroup2; got != want {
		t.Errorf("Source() = %q, want %q", got, want)
	}

	// 0.75 CPU-seconds in one second against a budget of 1.5 CPUs.
	write(t, root, dir+"cpu.stat", "usage_usec 1750000\nuser_usec 1\n")
	r, err := s.sampleAt(t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Reading{CPU: 0.5, Source: SourceCgroup2}, r); diff != "" {
		t.Errorf("sampleAt() mismatch (-want +got):\n%s", diff)
	}

	// Too soon after the previous reading: no reading, baseline kept.
	if _, err := s.sampleAt(t0.Add(time.Second + time.Microsecond)); !errors.Is(err, ErrNoReading) {
		t.Errorf("sampleAt(+1µs) error = %v, want ErrNoReading", err)
	}

	// The container is resized to 3 CPUs, but the pod still caps it at 2.
	// The sampler sees it at the next limits re-read, 5 s after the last.
	write(t, root, dir+"cpu.max", "300000 100000\n")
	write(t, root, dir+"cpu.stat", "usage_usec 2750000\nuser_usec 1\n")
	r, err = s.sampleAt(t0.Add(2 * time.Second))
	if err != nil || r.CPU != 1.0/1.5 {
		t.Errorf("sampleAt(2s) = %v, %v, want CPU %v (old budget)", r, err, 1.0/1.5)
	}
	write(t, root, dir+"cpu.stat", "usage_usec 6750000\nuser_usec 1\n")
	r, err = s.sampleAt(t0.Add(6 * time.Second))
	if err != nil || r.CPU != 0.5 || s.Budget() != 2 {
		t.Errorf("sampleAt(6s) = %v, %v, budget %v, want CPU 0.5, budget 2", r, err, s.Budget())
	}

	// A garbled counter is no reading, never 0 or 1, and the baseline stays.
	write(t, root, dir+"cpu.stat", "garbage\n")
	if _, err := s.sampleAt(t0.Add(7 * time.Second)); !errors.Is(err, ErrNoReading) {
		t.Errorf("sampleAt(garbled) error = %v, want ErrNoReading", err)
	}
	write(t, root, dir+"cpu.stat", "usage_usec 10750000\n")
	r, err = s.sampleAt(t0.Add(8 * time.Second))
	if err != nil || r.CPU != 1 {
		t.Errorf("sampleAt(8s) = %v, %v, want CPU 1 over the 2 s gap", r, err)
	}

	// A counter that goes backwards (a recreated cgroup) restarts the baseline.
	write(t, root, dir+"cpu.stat", "usage_usec 5\n")
	if _, err := s.sampleAt(t0.Add(9 * time.Second)); !errors.Is(err, ErrNoReading) {
		t.Errorf("sampleAt(counter reset) error = %v, want ErrNoReading", err)
	}

	// Close is idempotent, and a closed sampler reopens its file.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
	write(t, root, dir+"cpu.stat", "usage_usec 1000005\n")
	if r, err := s.sampleAt(t0.Add(10 * time.Second)); err != nil || r.CPU != 0.5 {
		t.Errorf("sampleAt(after Close) = %v, %v, want CPU 0.5", r, err)
	}
}

// v1Usage is the usage counter of the v1-quota fixture, whose quota is
// 0.5 CPU and whose usage starts at 1 CPU-second.
const v1Usage = "sys/fs/cgroup/cpuacct/cpuacct.usage"

// v1Sampler returns a sampler of a copy of the v1-quota fixture, made at
// t0, and the copy's root.
func v1Sampler(t *testing.T) (s *CgroupSampler, root string, t0 time.Time) {
	t.Helper()
	root = copyTree(t, "v1-quota")
	t0 = time.Unix(1000, 0)
	s, err := newCgroupSampler(root, t0, limits(64, 64))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, root, t0
}

func TestCgroupSamplerV1(t *testing.T) {
	s, root, t0 := v1Sampler(t)
	if got, want := s.Source(), SourceCgroup1; got != want {
		t.Errorf("Source() = %q, want %q", got, want)
	}
	// 0.1 CPU-seconds (ns) in 250 ms against 0.5 CPU: 80%.
	write(t, root, v1Usage, "1100000000\n")
	r, err := s.sampleAt(t0.Add(250 * time.Millisecond))
	if err != nil || math.Abs(r.CPU-0.8) > 1e-12 {
		t.Errorf("sampleAt() = %v, %v, want CPU 0.8", r, err)
	}
	// More than the quota (a burst, or timer jitter) reads as 1.
	write(t, root, v1Usage, "1400000000\n")
	if r, err := s.sampleAt(t0.Add(500 * time.Millisecond)); err != nil || r.CPU != 1 {
		t.Errorf("sampleAt(over quota) = %v, %v, want CPU 1", r, err)
	}
	// A vanished counter file is no reading.
	if err := os.Remove(filepath.Join(root, v1Usage)); err != nil {
		t.Fatal(err)
	}
	s.Close() // drop the open file, as if the kernel had removed the cgroup
	if _, err := s.sampleAt(t0.Add(time.Second)); !errors.Is(err, ErrNoReading) {
		t.Errorf("sampleAt(missing file) error = %v, want ErrNoReading", err)
	}
}

func TestKeptFile(t *testing.T) {
	name := filepath.Join(t.TempDir(), "cpuset.cpus")
	long := strings.Repeat("0-1,", 300) + "2\n" // longer than the first buffer
	if err := os.WriteFile(name, []byte(long), 0o644); err != nil {
		t.Fatal(err)
	}
	k := kept{name: name}
	defer k.close()
	for range 2 { // the second read reuses the open file and the grown buffer
		b, err := k.read()
		if err != nil || string(b) != long {
			t.Fatalf("read() = %d bytes, %v, want the whole %d-byte file", len(b), err, len(long))
		}
	}
	if _, err := (&kept{name: name + ".missing"}).read(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("read(missing) error = %v, want fs.ErrNotExist", err)
	}
}
