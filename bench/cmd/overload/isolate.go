package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Isolation is what the run could apply to keep the server and the load
// generator apart, detected at run time.
type Isolation struct {
	// Taskset is the taskset binary when pinning applies, else "".
	Taskset   string `json:"taskset"`
	ServerCPU int    `json:"server_cpu"`
	LoadCPU   int    `json:"load_cpu"`
	// CgroupCPU and CgroupAcct are the server's cgroup v1 directories
	// (cpu for the quota, cpuacct for the accounting the gate reads), when
	// a writable cgroup applies, else "".
	CgroupCPU  string  `json:"cgroup_cpu"`
	CgroupAcct string  `json:"cgroup_acct"`
	Quota      float64 `json:"quota_cpus"` // the CFS quota in CPUs, 0 without a cgroup
	PeriodUs   int     `json:"period_us"`
	Shares     int     `json:"shares,omitempty"` // cpu.shares of the server's cgroup
	// LoadCgroup is the load generator's own cgroup v1 cpu directory, with
	// the same cpu.shares and no quota, when it applies.
	LoadCgroup string `json:"load_cgroup,omitempty"`
	// Notes say what did not apply and why.
	Notes []string `json:"notes"`
}

// cgroupShares is the server cgroup's cpu.shares, 8× the default.
const cgroupShares = 8192

// onlineCPUs counts the machine's online CPUs, whatever this process's
// affinity.
func onlineCPUs() int {
	if b, err := os.ReadFile("/sys/devices/system/cpu/online"); err == nil {
		if n := countCPUList(strings.TrimSpace(string(b))); n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
}

// pinnedEnv marks a load generator that has already re-executed itself
// under taskset.
const pinnedEnv = "FLOODGATE_OVERLOAD_PINNED"

// pinSelf re-executes the process under taskset on loadCPU, once. It
// returns only when pinning does not apply (or has already been done).
func pinSelf(loadCPU int) {
	if os.Getenv(pinnedEnv) != "" || onlineCPUs() < 2 {
		return
	}
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	env := append(os.Environ(), pinnedEnv+"=1")
	args := append([]string{"taskset", "-c", strconv.Itoa(loadCPU), exe}, os.Args[1:]...)
	_ = syscall.Exec(ts, args, env) // returns only on failure: run unpinned
}

// detectIsolation decides what applies: pinning when taskset exists and the
// machine has two CPUs or more (and the load generator could pin itself),
// and a cgroup with a CPU quota when cgroup v1's cpu and cpuacct
// hierarchies are writable.
func detectIsolation(pin, cgroup bool, quota float64) *Isolation {
	iso := &Isolation{ServerCPU: 0, LoadCPU: 1}
	switch {
	case !pin:
		iso.Notes = append(iso.Notes, "pinning off (-pin=false)")
	case onlineCPUs() < 2:
		iso.Notes = append(iso.Notes, fmt.Sprintf("%d CPU: nothing to pin apart", onlineCPUs()))
	default:
		if ts, err := exec.LookPath("taskset"); err != nil {
			iso.Notes = append(iso.Notes, "no taskset: unpinned")
		} else if os.Getenv(pinnedEnv) == "" {
			iso.Notes = append(iso.Notes, "the load generator could not pin itself: unpinned")
		} else {
			iso.Taskset = ts
		}
	}
	if !cgroup {
		iso.Notes = append(iso.Notes, "cgroup off (-cgroup=false)")
		return iso
	}
	if quota <= 0 {
		iso.Notes = append(iso.Notes, "no CPU quota asked (-quota 0): no cgroup")
		return iso
	}
	name := fmt.Sprintf("floodgate-overload-%d", os.Getpid())
	cpuDir := filepath.Join("/sys/fs/cgroup/cpu", name)
	acctDir := filepath.Join("/sys/fs/cgroup/cpuacct", name)
	const period = 50000
	err := func() error {
		if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err != nil {
			return errors.New("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
		}
		if _, err := os.Stat("/sys/fs/cgroup/cpuacct/cpuacct.usage"); err != nil {
			return errors.New("no cgroup v1 cpuacct controller at /sys/fs/cgroup/cpuacct")
		}
		if err := os.Mkdir(cpuDir, 0o755); err != nil {
			return err
		}
		iso.CgroupCPU = cpuDir
		if err := os.Mkdir(acctDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		iso.CgroupAcct = acctDir
		if err := os.WriteFile(filepath.Join(cpuDir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0o644); err != nil {
			return err
		}
		q := int(quota * period)
		if err := os.WriteFile(filepath.Join(cpuDir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(q)), 0o644); err != nil {
			return err
		}
		// On a shared machine the server's cgroup would otherwise get one
		// task's share of its CPU against every busy task outside it; the
		// quota still caps what it takes.
		if err := os.WriteFile(filepath.Join(cpuDir, "cpu.shares"), []byte(strconv.Itoa(cgroupShares)), 0o644); err == nil {
			iso.Shares = cgroupShares
		}
		return nil
	}()
	if err != nil {
		iso.removeCgroups()
		iso.Notes = append(iso.Notes, "no writable cgroup ("+err.Error()+"): the server runs without a quota")
		return iso
	}
	iso.Quota, iso.PeriodUs = quota, period
	// The load generator gets the same weight against the machine's other
	// work, so that its own scheduling delays stay out of the latencies.
	loadDir := cpuDir + "-load"
	if err := os.Mkdir(loadDir, 0o755); err == nil {
		iso.LoadCgroup = loadDir
		self := []byte(strconv.Itoa(os.Getpid()))
		if os.WriteFile(filepath.Join(loadDir, "cpu.shares"), []byte(strconv.Itoa(cgroupShares)), 0o644) != nil ||
			os.WriteFile(filepath.Join(loadDir, "cgroup.procs"), self, 0o644) != nil {
			iso.Notes = append(iso.Notes, "the load generator could not join its own cgroup")
			_ = os.Remove(loadDir)
			iso.LoadCgroup = ""
		}
	}
	return iso
}

// setQuota sets the server cgroup's CFS quota to cpus CPUs, or lifts it
// when cpus is not positive. The servers of a run share the cgroup, one
// at a time: the scenario matrix gives each placement its own quota.
func (iso *Isolation) setQuota(cpus float64) error {
	if iso.CgroupCPU == "" {
		return errors.New("no cgroup")
	}
	q := -1
	if cpus > 0 {
		q = int(cpus * float64(iso.PeriodUs))
	}
	if err := os.WriteFile(filepath.Join(iso.CgroupCPU, "cpu.cfs_quota_us"), []byte(strconv.Itoa(q)), 0o644); err != nil {
		return err
	}
	iso.Quota = max(cpus, 0)
	return nil
}

// removeCgroups removes the cgroups, which must be empty by then: the load
// generator moves itself back to the root cgroup first.
func (iso *Isolation) removeCgroups() {
	if iso.LoadCgroup != "" {
		_ = os.WriteFile("/sys/fs/cgroup/cpu/cgroup.procs", []byte(strconv.Itoa(os.Getpid())), 0o644)
	}
	for _, d := range []*string{&iso.CgroupCPU, &iso.CgroupAcct, &iso.LoadCgroup} {
		if *d == "" {
			continue
		}
		// A process just killed may take a moment to leave its cgroup.
		for range 50 {
			if err := os.Remove(*d); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		*d = ""
	}
}

// A serverProc is one running server process.
type serverProc struct {
	cmd   *exec.Cmd
	ready serverReady
	done  chan struct{} // closed when the process has exited
}

// startServer starts a server process: itself with "server" and args, in
// the cgroup and pinned when those apply, with env added to its
// environment. It returns once the server serves.
func startServer(ctx context.Context, iso *Isolation, exe []string, args []string, env ...string) (*serverProc, error) {
	argv := append(append([]string{}, exe...), append([]string{"server"}, args...)...)
	if iso.Taskset != "" {
		argv = append([]string{iso.Taskset, "-c", strconv.Itoa(iso.ServerCPU)}, argv...)
	}
	if iso.CgroupCPU != "" {
		// The shell joins the cgroups and then becomes the server, so the
		// server's first look at /proc/self/cgroup already finds them.
		script := `echo $$ > "$CG_CPU/cgroup.procs" && echo $$ > "$CG_ACCT/cgroup.procs" && exec "$@"`
		argv = append([]string{"/bin/sh", "-c", script, "sh"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), "CG_CPU="+iso.CgroupCPU, "CG_ACCT="+iso.CgroupAcct), env...)
	cmd.Stderr = os.Stderr
	// The server dies with the load generator, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &serverProc{cmd: cmd, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		for {
			l, err := r.ReadString('\n')
			if strings.HasPrefix(l, "READY ") {
				lines <- strings.TrimPrefix(strings.TrimSpace(l), "READY ")
				_, _ = io.Copy(io.Discard, r)
				return
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case l, ok := <-lines:
		if !ok {
			p.stop()
			return nil, errors.New("the server exited before it was ready")
		}
		if err := json.Unmarshal([]byte(l), &p.ready); err != nil {
			p.stop()
			return nil, fmt.Errorf("server ready line: %w", err)
		}
		return p, nil
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	case <-timer.C:
		p.stop()
		return nil, errors.New("the server did not start within 30s")
	}
}

// signal sends sig to the server.
func (p *serverProc) signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// stop ends the server: SIGTERM, then SIGKILL after a second.
func (p *serverProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
