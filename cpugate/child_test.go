package cpugate

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	childEnv = "CPUGATE_CGROUP_CHILD"
	burnEnv  = "CPUGATE_CGROUP_BURN" // how long the child spins; 400ms unless set
)

// TestCgroupQuotaLive puts a child process in a fresh cgroup v1 with a quota
// of half a CPU, has it spin two goroutines, and checks that its cgroup
// sampler finds the quota and agrees with the child's own CPU time: the
// child is alone in the cgroup, so both count the same work. (Comparing
// with 100% would fail on a shared machine, where the child may get less
// than its quota.) It needs root
// and cgroup v1 cpu and cpuacct hierarchies (this project's CI machines);
// elsewhere it is skipped, and the fixtures cover the parsing.
func TestCgroupQuotaLive(t *testing.T) {
	got := runInCgroup(t, "50000", nil)
	if got.budget != 0.5 || got.source != SourceCgroup1 || !(got.cpu > 0 && got.cpu <= 1) || math.Abs(got.cpu-got.own) > 0.1 {
		t.Errorf("child in a 0.5-CPU cgroup: budget %v, cpu %v (own getrusage %v), source %q; want 0.5, within 0.1 of own, %q\n%s",
			got.budget, got.cpu, got.own, got.source, SourceCgroup1, got.out)
	}
	t.Logf("child: budget %v CPUs, cgroup reading %.3f, own getrusage %.3f", got.budget, got.cpu, got.own)
}

// TestCgroupPinnedLive runs a child in a cgroup allowed 2 CPUs, pinned to
// one CPU by taskset and with GOMAXPROCS=1, spinning for a second: it is
// saturated, and its cgroup sampler must say so (it read 0.50 when measured
// against the quota alone). Same needs as TestCgroupQuotaLive, and taskset.
func TestCgroupPinnedLive(t *testing.T) {
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("no taskset")
	}
	cpu := firstAllowedCPU(t)
	got := runInCgroup(t, "200000", []string{taskset, "-c", cpu}, "GOMAXPROCS=1", burnEnv+"=1s")
	if got.budget != 1 || got.source != SourceCgroup1 {
		t.Fatalf("child pinned to 1 CPU with GOMAXPROCS 1 in a 2-CPU cgroup: budget %v, source %q; want 1, %q\n%s",
			got.budget, got.source, SourceCgroup1, got.out)
	}
	// Other work on the machine may take part of the child's CPU: whatever
	// share of it the child got, the reading must be that share.
	if got.share >= 0.9 && !(got.cpu >= 0.85 && got.cpu <= 1) {
		t.Errorf("child saturating its CPU (%.3f of it by getrusage) read %v, want within [0.85, 1]\n%s", got.share, got.cpu, got.out)
	}
	if math.Abs(got.cpu-got.share) > 0.1 {
		t.Errorf("child read %v, want within 0.1 of the %.3f of its CPU it got by getrusage\n%s", got.cpu, got.share, got.out)
	}
	t.Logf("child on CPU %s: budget %v CPUs, cgroup reading %.3f, got %.3f of its CPU", cpu, got.budget, got.cpu, got.share)
}

// firstAllowedCPU returns the first CPU this process may run on, for
// taskset: CPU 0 need not be one of them.
func firstAllowedCPU(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	for line := range strings.Lines(string(b)) {
		if list, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			first, _, _ := strings.Cut(strings.TrimSpace(list), ",")
			first, _, _ = strings.Cut(first, "-")
			return first
		}
	}
	t.Skip("no Cpus_allowed_list in /proc/self/status")
	return ""
}

// childReading is what the child of a live cgroup test reports: its
// sampler's budget and reading, the reading its own getrusage gives against
// the same budget, its CPU time over wall time (share, whatever the
// budget), the reading's source, and its whole output.
type childReading struct {
	budget, cpu, own, share float64
	source                  string
	out                     []byte
}

// runInCgroup runs TestCgroupChildHelper in a fresh cgroup v1 whose CFS
// quota is quotaUs per 100 ms period, through the command wrap (such as
// taskset) if any, with env added to its environment. It skips unless root
// with cgroup v1 cpu and cpuacct hierarchies.
func runInCgroup(t *testing.T, quotaUs string, wrap []string, env ...string) childReading {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a cgroup")
	}
	name := "cpugate-test-" + strconv.Itoa(os.Getpid()) + "-" + t.Name()
	var dirs []string
	for _, ctrl := range []string{"cpu", "cpuacct"} {
		base := filepath.Join("/sys/fs/cgroup", ctrl)
		if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
			t.Skipf("no cgroup v1 %s hierarchy at %s", ctrl, base)
		}
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Skipf("cannot create a cgroup: %v", err)
		}
		t.Cleanup(func() { os.Remove(d) }) // after the child has exited
		dirs = append(dirs, d)
	}
	if err := os.WriteFile(filepath.Join(dirs[0], "cpu.cfs_period_us"), []byte("100000"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs[0], "cpu.cfs_quota_us"), []byte(quotaUs), 0o644); err != nil {
		t.Fatal(err)
	}

	args := slices.Concat(wrap, []string{os.Args[0], "-test.run=^TestCgroupChildHelper$", "-test.v", "-test.count=1"})
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A wrapper such as taskset execs the test binary in place: the pid
	// moved is the child's.
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal(err)
		}
	}
	stdin.Write([]byte("go\n"))
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.Bytes())
	}
	r := childReading{out: out.Bytes()}
	for line := range bytes.Lines(r.out) {
		if n, _ := fmt.Sscanf(string(line), "cgroup-child budget=%g cpu=%g own=%g share=%g source=%s",
			&r.budget, &r.cpu, &r.own, &r.share, &r.source); n == 5 {
			break
		}
	}
	return r
}

// TestCgroupChildHelper is the child of runInCgroup.
func TestCgroupChildHelper(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("runs only as the child of runInCgroup")
	}
	spin := 400 * time.Millisecond
	if v := os.Getenv(burnEnv); v != "" {
		var err error
		if spin, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the parent has moved this process into the cgroup.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// Both measures cover the same interval, from start to end, so the
	// readings differ only by the instants between the two counters' reads.
	start := time.Now()
	s, err := newCgroupSampler("/", start, liveLimits)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	own0, err := processCPUTime()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range min(2, runtime.NumCPU()) {
		wg.Go(func() { burn(spin) })
	}
	wg.Wait()
	end := time.Now()
	r, err := s.sampleAt(end)
	if err != nil {
		t.Fatal(err)
	}
	own1, err := processCPUTime()
	if err != nil {
		t.Fatal(err)
	}
	own := fraction(own1-own0, end.Sub(start), s.Budget())
	share := (own1 - own0).Seconds() / end.Sub(start).Seconds()
	fmt.Printf("cgroup-child budget=%g cpu=%g own=%g share=%g source=%s\n", s.Budget(), r.CPU, own, share, r.Source)
}
