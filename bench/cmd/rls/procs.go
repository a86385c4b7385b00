package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
	"github.com/floodgate-go/floodgate/internal/redistest"
)

// CPUs of the pinned run: the servers and redis-server on one, the driver
// on the other, so that what the driver spends never counts as theirs nor
// slows them.
const (
	serverCPU = 0
	driverCPU = 1
)

// Isolation is what the run could apply to keep the servers and the
// driver apart, detected at run time.
type Isolation struct {
	// Taskset is the taskset binary when pinning applies, else "".
	Taskset   string   `json:"taskset"`
	ServerCPU int      `json:"server_cpu"`
	DriverCPU int      `json:"driver_cpu"`
	Notes     []string `json:"notes,omitempty"`
}

// pinnedEnv marks a driver that has already re-executed itself under
// taskset.
const pinnedEnv = "FLOODGATE_RLS_PINNED"

// onlineCPUs counts the machine's online CPUs, whatever this process's
// affinity.
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, ok := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if ok {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil {
			return runtime.NumCPU()
		}
		n += z - a + 1
	}
	return n
}

// pinSelf re-executes the process under taskset on cpu, once. It returns
// only when pinning does not apply (or has already been done).
func pinSelf(cpu int) {
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
	args := append([]string{"taskset", "-c", strconv.Itoa(cpu), exe}, os.Args[1:]...)
	_ = syscall.Exec(ts, args, env) // returns only on failure: run unpinned
}

// detectIsolation decides whether pinning applies: taskset exists, the
// machine has two CPUs or more, and the driver could pin itself.
func detectIsolation(pin bool) Isolation {
	iso := Isolation{ServerCPU: serverCPU, DriverCPU: driverCPU}
	switch {
	case !pin:
		iso.Notes = append(iso.Notes, "pinning off (-pin=false): servers, redis-server and the driver share every CPU")
	case onlineCPUs() < 2:
		iso.Notes = append(iso.Notes, fmt.Sprintf("%d CPU: nothing to pin apart", onlineCPUs()))
	default:
		if ts, err := exec.LookPath("taskset"); err != nil {
			iso.Notes = append(iso.Notes, "no taskset: unpinned")
		} else if os.Getenv(pinnedEnv) == "" {
			iso.Notes = append(iso.Notes, "the driver could not pin itself: unpinned")
		} else {
			iso.Taskset = ts
		}
	}
	return iso
}

// pin puts every thread of process pid on the servers' CPU, when pinning
// applies.
func (iso Isolation) pin(pid int) error {
	if iso.Taskset == "" {
		return nil
	}
	out, err := exec.Command(iso.Taskset, "-a", "-p", "-c", strconv.Itoa(iso.ServerCPU), strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("taskset -p %d: %v: %s", pid, err, bytes.TrimSpace(out))
	}
	return nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go supports but alpha.
const clockTicks = 100

// cpuSeconds returns the user+system CPU time of process pid, all its
// threads, from /proc/PID/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return s, nil
}

// parseStat returns utime+stime, in seconds, of a /proc/PID/stat line.
func parseStat(b []byte) (float64, error) {
	// The command name, in parentheses, may hold spaces and parentheses:
	// the fields counted from 3 start after the last closing one.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name", len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("utime %q, stime %q", f[11], f[12])
	}
	return float64(utime+stime) / clockTicks, nil
}

// cpuOf sums cpuSeconds over pids.
func cpuOf(pids []int) (float64, error) {
	var sum float64
	for _, pid := range pids {
		s, err := cpuSeconds(pid)
		if err != nil {
			return 0, err
		}
		sum += s
	}
	return sum, nil
}

// A proc is one running server process.
type proc struct {
	*rlsproc.Proc
	addr string // its gRPC address
	// metrics is its Prometheus endpoint's address (floodgate-rls), or "".
	metrics string
}

// startProc starts argv with env (nil: this process's environment), pinned
// to the servers' CPU where that applies, and waits until it serves the
// gRPC health service called health at addr.
func startProc(ctx context.Context, iso Isolation, name string, argv, env []string, addr, health string) (*proc, error) {
	if iso.Taskset != "" {
		// taskset execs the server, which keeps its PID.
		argv = append([]string{iso.Taskset, "-c", strconv.Itoa(iso.ServerCPU)}, argv...)
	}
	rp, err := rlsproc.Start(name, argv, env)
	if err != nil {
		return nil, err
	}
	p := &proc{Proc: rp, addr: addr}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = p.WaitServing(wctx, conn, health)
		cancel()
		conn.Close()
	}
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// stop ends the server: SIGTERM, then SIGKILL after two seconds.
func (p *proc) stop() { p.Stop(2 * time.Second) }

// fallbackMetric counts floodgate-rls's decisions that its store could not
// make (Redis down, slow or its breaker open), which the failure policy
// made instead: a run that has any did not measure Redis.
const fallbackMetric = "floodgate_rls_store_fallback_total"

// fallbacks returns the sum of fallbackMetric's series at p's metrics
// endpoint; 0 for a server without one.
func (p *proc) fallbacks() (int64, error) {
	if p.metrics == "" {
		return 0, nil
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return sumMetric(b, fallbackMetric), nil
}

// sumMetric sums the samples of the counter name in a Prometheus text
// exposition.
func sumMetric(b []byte, name string) int64 {
	var n float64
	for _, l := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			n += v
		}
	}
	return int64(n)
}

// probe checks that the servers at addrs, replicas of one variant, have
// loaded the configuration and, for more than one, share their buckets: a
// value of the probe descriptor, whose limit is one request a day, is
// admitted by the first and refused by each of the others.
func probe(ctx context.Context, addrs []string, value string) error {
	req := &rlsv3.RateLimitRequest{Domain: domainProbe, Descriptors: []*rlv3.RateLimitDescriptor{
		descriptor(entry("probe", value)),
	}}
	want := rlsv3.RateLimitResponse_OK
	for i, a := range append([]string{addrs[0]}, addrs...) {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, req)
		cancel()
		conn.Close()
		if err != nil {
			return fmt.Errorf("probe %s: %w", a, err)
		}
		if resp.OverallCode != want {
			what := "has not loaded the configuration"
			if i > 1 {
				what = "does not share the first replica's buckets"
			}
			return fmt.Errorf("probe %s: %v, want %v: the server %s", a, resp.OverallCode, want, what)
		}
		want = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return nil
}

// A redisProc is the run's redis-server.
type redisProc struct {
	*redistest.Server
	pid     int
	version string
}

// startRedis starts a redis-server on a free loopback port, pinned with
// the servers, and reads its PID and version.
func startRedis(iso Isolation) (*redisProc, error) {
	s, err := redistest.Launch()
	if err != nil {
		return nil, err
	}
	r := &redisProc{Server: s}
	info, err := redistest.Do(s.Addr, "INFO", "server")
	if err != nil {
		s.Close()
		return nil, err
	}
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(l, "process_id:"); ok {
			r.pid, _ = strconv.Atoi(v)
		}
		if v, ok := strings.CutPrefix(l, "redis_version:"); ok {
			r.version = v
		}
	}
	if r.pid == 0 {
		s.Close()
		return nil, errors.New("redis-server: no process_id in INFO server")
	}
	if err := iso.pin(r.pid); err != nil {
		s.Close()
		return nil, err
	}
	return r, nil
}
