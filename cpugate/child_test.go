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
	"strconv"
	"sync"
	"testing"
	"time"
)

const childEnv = "CPUGATE_CGROUP_CHILD"

// TestCgroupQuotaLive puts a child process in a fresh cgroup v1 with a quota
// of half a CPU, has it spin two goroutines, and checks that its cgroup
// sampler finds the quota and agrees with the child's own CPU time: the
// child is alone in the cgroup, so both count the same work. (Comparing
// with 100% would fail on a shared machine, where the child may get less
// than its quota.) It needs root
// and cgroup v1 cpu and cpuacct hierarchies (this project's CI machines);
// elsewhere it is skipped, and the fixtures cover the parsing.
func TestCgroupQuotaLive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a cgroup")
	}
	name := "cpugate-test-" + strconv.Itoa(os.Getpid())
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
	if err := os.WriteFile(filepath.Join(dirs[0], "cpu.cfs_quota_us"), []byte("50000"), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestCgroupChildHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
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
	var budget, cpu, own float64
	var source string
	for line := range bytes.Lines(out.Bytes()) {
		if n, _ := fmt.Sscanf(string(line), "cgroup-child budget=%g cpu=%g own=%g source=%s", &budget, &cpu, &own, &source); n == 4 {
			break
		}
	}
	if budget != 0.5 || source != SourceCgroup1 || !(cpu > 0 && cpu <= 1) || math.Abs(cpu-own) > 0.1 {
		t.Errorf("child in a 0.5-CPU cgroup: budget %v, cpu %v (own getrusage %v), source %q; want 0.5, within 0.1 of own, %q\n%s",
			budget, cpu, own, source, SourceCgroup1, out.Bytes())
	}
	t.Logf("child: budget %v CPUs, cgroup reading %.3f, own getrusage %.3f", budget, cpu, own)
}

// TestCgroupChildHelper is the child of TestCgroupQuotaLive.
func TestCgroupChildHelper(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("runs only as the child of TestCgroupQuotaLive")
	}
	// Wait until the parent has moved this process into the cgroup.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// Both measures cover the same interval, from start to end, so the
	// readings differ only by the instants between the two counters' reads.
	start := time.Now()
	s, err := newCgroupSampler("/", start)
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
		wg.Go(func() { burn(400 * time.Millisecond) })
	}
	wg.Wait()
	end := time.Now()
	r, err := s.SampleAt(end)
	if err != nil {
		t.Fatal(err)
	}
	own1, err := processCPUTime()
	if err != nil {
		t.Fatal(err)
	}
	own := fraction(own1-own0, end.Sub(start), s.Budget())
	fmt.Printf("cgroup-child budget=%g cpu=%g own=%g source=%s\n", s.Budget(), r.CPU, own, r.Source)
}
