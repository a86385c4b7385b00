package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The neighbour scenarios run a CPU-burning process beside the server: this
// program re-executed as "overload neighbour", a few goroutines spinning,
// each on a thread of its own (GOMAXPROCS is their number), pinned to the
// server's CPU and kept out of the server's cgroup. It is another tenant of
// the host, which the server's quota and the CPU accounting of the
// server's cgroup do not see, but which takes CPU time from the server and
// delays its goroutines. It stops when killed, when the load generator
// dies, and by itself after a bounded time.

// neighbourWorkers is the neighbour's default number of spinning threads.
// Where the server runs in its own cgroup, whose cpu.shares (8192) outweigh
// the four threads' 1024 each, the server still gets most of the CPU when
// both want it, up to its quota: the neighbour takes what the server
// leaves and delays the server's goroutines when it runs.
const neighbourWorkers = 4

// neighbourSlack is how long a neighbour outlives its scenario at most,
// should nothing kill it.
const neighbourSlack = 30 * time.Second

// rootCPUCgroup is cgroup v1's cpu hierarchy: the neighbour joins its root,
// where the host's other work runs, rather than the load generator's
// cgroup, which it would otherwise inherit.
const rootCPUCgroup = "/sys/fs/cgroup/cpu"

// burnSink keeps the spinning loops' work observable.
var burnSink atomic.Uint64

// neighbourMain is the neighbour process: it spins until SIGTERM or SIGINT,
// or until -max has passed.
func neighbourMain(args []string) error {
	fs := flag.NewFlagSet("overload neighbour", flag.ContinueOnError)
	workers := fs.Int("workers", neighbourWorkers, "spinning goroutines, each on a thread of its own")
	maxDur := fs.Duration("max", time.Minute, "stop after this long whatever happens")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *workers < 1 || *maxDur <= 0 {
		return fmt.Errorf("need -workers ≥ 1 and -max > 0, got %d and %v", *workers, *maxDur)
	}
	runtime.GOMAXPROCS(*workers)
	ctx, cancel := context.WithTimeout(context.Background(), *maxDur)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var halt atomic.Bool
	var wg sync.WaitGroup
	for i := range *workers {
		wg.Go(func() { spin(&halt, uint64(i)+1) })
	}
	fmt.Printf("READY %d\n", os.Getpid())
	<-ctx.Done()
	halt.Store(true)
	wg.Wait()
	return nil
}

// spin burns CPU until halt is set, looking at it every few microseconds.
func spin(halt *atomic.Bool, seed uint64) {
	x := seed
	for !halt.Load() {
		for range 4096 {
			// xorshift64: cheap work the compiler cannot drop.
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
	}
	burnSink.Add(x)
}

// NeighbourStat is what a scenario's neighbour did.
type NeighbourStat struct {
	Workers int     `json:"workers"`
	Pinned  string  `json:"pinned,omitempty"` // the CPU list it was pinned to, "" when unpinned
	Cgroup  string  `json:"cgroup,omitempty"` // the cpu cgroup it joined, "" when it stayed in the load generator's
	Secs    float64 `json:"secs"`             // from its start to its end
	CPU     float64 `json:"cpu"`              // CPUs it used on average over Secs
	// Killed tells that it was still running when the scenario ended (as
	// it should be) rather than gone by itself.
	Killed bool `json:"killed"`
}

// A neighbourProc is a running neighbour.
type neighbourProc struct {
	cmd            *exec.Cmd
	stat           NeighbourStat
	started, ended time.Time     // ended is set before done is closed
	done           chan struct{} // closed when the process has exited
}

// neighbourArgv returns the command that starts a neighbour: exe with
// "neighbour", under taskset on the server's CPU when pinning applies, and
// through a shell that moves it to the root cpu cgroup when the load
// generator runs in a cgroup of its own.
func neighbourArgv(iso *Isolation, exe []string, workers int, maxDur time.Duration) (argv []string, pinned, cgroup string) {
	argv = append(append([]string{}, exe...), "neighbour", "-workers", strconv.Itoa(workers), "-max", maxDur.String())
	if iso != nil && iso.Taskset != "" {
		pinned = strconv.Itoa(iso.ServerCPU)
		argv = append([]string{iso.Taskset, "-c", pinned}, argv...)
	}
	if iso != nil && iso.LoadCgroup != "" {
		cgroup = rootCPUCgroup
		argv = append([]string{"/bin/sh", "-c", `echo $$ > "$1/cgroup.procs" && shift && exec "$@"`, "sh", cgroup}, argv...)
	}
	return argv, pinned, cgroup
}

// startNeighbour starts a neighbour that stops by itself after maxDur, and
// returns once it spins.
func startNeighbour(ctx context.Context, iso *Isolation, exe []string, workers int, maxDur time.Duration) (*neighbourProc, error) {
	argv, pinned, cgroup := neighbourArgv(iso, exe, workers, maxDur)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	// The neighbour dies with the load generator, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	n := &neighbourProc{cmd: cmd, started: time.Now(), done: make(chan struct{}),
		stat: NeighbourStat{Workers: workers, Pinned: pinned, Cgroup: cgroup}}
	ready := make(chan bool, 1)
	go func() {
		r := bufio.NewReader(out)
		l, err := r.ReadString('\n')
		ready <- err == nil && strings.HasPrefix(l, "READY ")
		_, _ = io.Copy(io.Discard, r)
	}()
	go func() { _ = cmd.Wait(); n.ended = time.Now(); close(n.done) }()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case ok := <-ready:
		if !ok {
			n.stop()
			return nil, errors.New("the neighbour exited before it spun")
		}
		return n, nil
	case <-ctx.Done():
		n.stop()
		return nil, ctx.Err()
	case <-timer.C:
		n.stop()
		return nil, errors.New("the neighbour did not start within 10s")
	}
}

// running reports whether the neighbour has not exited yet.
func (n *neighbourProc) running() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// stop ends the neighbour (SIGTERM, then SIGKILL after a second) and
// returns what it did. It may be called more than once.
func (n *neighbourProc) stop() NeighbourStat {
	if n.running() {
		n.stat.Killed = true
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(time.Second):
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	}
	if n.stat.Secs == 0 {
		n.stat.Secs = n.ended.Sub(n.started).Seconds()
		if ps := n.cmd.ProcessState; ps != nil && n.stat.Secs > 0 {
			n.stat.CPU = (ps.UserTime() + ps.SystemTime()).Seconds() / n.stat.Secs
		}
	}
	return n.stat
}
