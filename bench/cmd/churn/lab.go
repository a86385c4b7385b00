package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate-go/floodgate/internal/redistest"
)

// The binaries are found or built as bench/cmd/rls does (its binaries.go),
// into the same cache directory, so that either experiment reuses what the
// other built; copied, to keep that package untouched.

const (
	ratelimitMod     = "github.com/envoyproxy/ratelimit"
	ratelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36" // bench/cmd/rls's pin
)

// cachedRatelimit is where ratelimitBinary installs service_cmd.
func cachedRatelimit() string {
	d, _ := os.UserCacheDir()
	return filepath.Join(d, "floodgate-bench", "ratelimit-"+ratelimitVersion, "service_cmd")
}

// ratelimitBinary returns path, or the cached service_cmd, installing it
// with go install when missing (half a minute to a minute on two CPUs).
func ratelimitBinary(ctx context.Context, path string, logf func(string, ...any)) (string, error) {
	if path == "" {
		path = cachedRatelimit()
		if _, err := os.Stat(path); err != nil {
			logf("installing envoyproxy/ratelimit into %s", filepath.Dir(path))
			if err := goCmd(ctx, "", "GOBIN="+filepath.Dir(path), "install", ratelimitMod+"/src/service_cmd@"+ratelimitVersion); err != nil {
				return "", err
			}
		}
	}
	_, err := os.Stat(path)
	return path, err
}

// floodgateBinary returns path, or floodgate-rls built from the working
// tree's rls module: the point is to measure the store as it is edited.
func floodgateBinary(ctx context.Context, path string, logf func(string, ...any)) (string, error) {
	if path != "" {
		_, err := os.Stat(path)
		return path, err
	}
	root, err := output("git", "rev-parse", "--show-toplevel")
	if err != nil {
		return "", fmt.Errorf("not in floodgate's repository: %w", err)
	}
	cache, _ := os.UserCacheDir()
	path = filepath.Join(cache, "floodgate-bench", "floodgate-rls-churn")
	logf("building floodgate-rls from %s", filepath.Join(root, "rls"))
	return path, goCmd(ctx, filepath.Join(root, "rls"), "", "build", "-o", path, "./cmd/floodgate-rls")
}

// goCmd runs the go command in dir, without the caller's workspace or
// flags, which would change what it builds.
func goCmd(ctx context.Context, dir, env string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOBIN=")
	}), "GOWORK=off", "GOFLAGS=", env)
	if out, err := cmd.CombinedOutput(); err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return fmt.Errorf("go %s: %v: %s", strings.Join(args, " "), err, strings.Join(lines[max(0, len(lines)-10):], "\n"))
	}
	return nil
}

func output(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return strings.TrimSpace(string(out)), err
}

// The configuration both servers read, in envoyproxy/ratelimit's runtime
// layout (RUNTIME_ROOT/ratelimit/config/*.yaml); floodgate-rls is given
// the innermost directory.
const (
	domain   = "churn"
	descKey  = "churn"
	descVal  = "hot"
	rate     = 200 // per second; floodgate's bucket holds one second of it
	burst    = rate
	confText = "domain: churn\ndescriptors:\n  - key: churn\n    value: hot\n    rate_limit:\n      unit: second\n      requests_per_unit: 200\n"
)

// A lab is the processes of an experiment: one redis-server, every
// replica ever started, and the binaries. close ends them all.
type lab struct {
	redis      *redistest.Server
	root       string
	floodgate  string
	ratelimit  string
	mu         sync.Mutex
	replicas   []*replica
	closeOnce  sync.Once
	startLimit time.Duration
}

func newLab(floodgateBin, ratelimitBin string) (*lab, error) {
	root, err := os.MkdirTemp("", "floodgate-churn-")
	if err != nil {
		return nil, err
	}
	l := &lab{root: root, floodgate: floodgateBin, ratelimit: ratelimitBin, startLimit: 20 * time.Second}
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err == nil {
		err = os.WriteFile(filepath.Join(dir, domain+".yaml"), []byte(confText), 0o644)
	}
	if err == nil {
		l.redis, err = redistest.Launch()
	}
	if err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// close kills every process group the lab started, then redis-server. It
// is idempotent.
func (l *lab) close() {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		rs := slices.Clone(l.replicas)
		l.mu.Unlock()
		for _, r := range rs {
			r.kill()
		}
		if l.redis != nil {
			l.redis.Close()
		}
		os.RemoveAll(l.root)
	})
}

// A replica is one server process, leader of its own process group so
// that a kill reaches whatever it started.
type replica struct {
	name string
	cmd  *exec.Cmd
	addr string
	out  *tail
	done chan struct{}
	conn *grpc.ClientConn
	stub rlsv3.RateLimitServiceClient
}

// start starts one replica of variant, with the fleet's prefix, and
// returns it once it answers health checks as SERVING.
func (l *lab) start(ctx context.Context, variant, prefix, name string) (*replica, error) {
	var argv, env []string
	var addr, health string
	switch variant {
	case "floodgate":
		// -share and -credit keep their defaults: they are on their way out.
		argv = []string{l.floodgate, "-config", filepath.Join(l.root, "ratelimit", "config"), "-addr", "127.0.0.1:0",
			"-redis", l.redis.Addr, "-lease", "on", "-prefix", prefix, "-watch", "0"}
	case "ratelimit":
		var ports [3]string
		for i := range ports {
			a, err := freeAddr()
			if err != nil {
				return nil, err
			}
			_, ports[i], _ = net.SplitHostPort(a)
		}
		addr, health, argv = "127.0.0.1:"+ports[0], "ratelimit", []string{l.ratelimit}
		// bench/cmd/rls's ratelimitEnv: defaults but for ports, Redis and
		// no statsd, and health that waits for the configuration.
		env = append(os.Environ(), "USE_STATSD=false", "LOG_LEVEL=warn", "RUNTIME_ROOT="+l.root,
			"RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "REDIS_SOCKET_TYPE=tcp",
			"REDIS_URL="+l.redis.Addr, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true",
			"GRPC_HOST=127.0.0.1", "GRPC_PORT="+ports[0], "HOST=127.0.0.1", "PORT="+ports[1],
			"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+ports[2])
	default:
		return nil, fmt.Errorf("unknown variant %q", variant)
	}
	r := &replica{name: name, out: &tail{found: make(chan string, 1)}, done: make(chan struct{})}
	r.cmd = exec.Command(argv[0], argv[1:]...)
	r.cmd.Env = env
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.replicas = append(l.replicas, r)
	l.mu.Unlock()
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	fail := func(err error) (*replica, error) {
		r.kill()
		return nil, fmt.Errorf("%s: %w: %s", name, err, r.out)
	}
	ctx, cancel := context.WithTimeout(ctx, l.startLimit)
	defer cancel()
	if addr == "" { // floodgate-rls on port 0 says which it got
		select {
		case addr = <-r.out.found:
		case <-r.done:
			return fail(errors.New("exited at start"))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	r.addr = addr
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	r.conn, r.stub = conn, rlsv3.NewRateLimitServiceClient(conn)
	hc := healthpb.NewHealthClient(conn)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
		h, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: health})
		ccancel()
		if err == nil && h.Status == healthpb.HealthCheckResponse_SERVING {
			return r, nil
		}
		select {
		case <-r.done:
			return fail(errors.New("exited at start"))
		case <-ctx.Done():
			return fail(fmt.Errorf("not serving: %v", err))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// term stops r as an orchestrator would: SIGTERM, then SIGKILL if it has
// not drained within five seconds.
func (r *replica) term() {
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-r.done:
		r.conn.Close()
	case <-time.After(5 * time.Second):
		r.kill()
	}
}

func (r *replica) kill() {
	select {
	case <-r.done: // reaped: its group id may be another's by now
	default:
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
	if r.conn != nil {
		r.conn.Close()
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// tail keeps a replica's last output, for the error that says why it
// stopped, and reports floodgate-rls's gRPC address once printed.
type tail struct {
	mu    sync.Mutex
	buf   []byte
	found chan string
	seen  bool
}

const listening = "floodgate-rls: grpc listening on "

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if i := bytes.Index(t.buf, []byte(listening)); !t.seen && i >= 0 {
		// Only a whole line: a partial write must not yield half a port.
		if j := bytes.IndexByte(t.buf[i:], '\n'); j >= 0 {
			t.seen = true
			t.found <- strings.TrimSpace(string(t.buf[i+len(listening) : i+j]))
		}
	}
	if len(t.buf) > 64<<10 {
		t.buf = slices.Clone(t.buf[len(t.buf)-4<<10:])
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}
