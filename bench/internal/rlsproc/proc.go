package rlsproc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A Proc is one server process, started by Start; the zero Proc is not
// one. Its methods may be called from any goroutine.
type Proc struct {
	// Name names the process in errors.
	Name string
	cmd  *exec.Cmd
	out  *tail
	done chan struct{} // closed once the process is reaped
}

// Start starts argv with env (nil: this process's environment) as the
// leader of a new process group, which the kernel kills with SIGKILL if
// the driver dies. The process's stdout and stderr are kept for Output. A
// goroutine waits for the process and ends with it; Done says when.
func Start(name string, argv, env []string) (*Proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	p := &Proc{Name: name, cmd: cmd, out: &tail{addr: make(chan string, 1)}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pid returns the process's ID, which is also its process group's.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done returns a channel closed once the process has exited and been
// reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Output returns the last 4 KiB the process wrote to stdout and stderr,
// trimmed of surrounding space.
func (p *Proc) Output() string { return p.out.String() }

// Listening returns the gRPC address floodgate-rls prints once it
// listens, for one started on port 0. Only the first call gets it. It
// returns an error, with the end of the output, if the process exits or
// ctx ends first.
func (p *Proc) Listening(ctx context.Context) (string, error) {
	select {
	case addr := <-p.out.addr:
		return addr, nil
	case <-p.done:
		return "", fmt.Errorf("%s exited at start: %s", p.Name, p.out)
	case <-ctx.Done():
		return "", fmt.Errorf("%s printed no address: %w: %s", p.Name, ctx.Err(), p.out)
	}
}

// WaitServing asks the gRPC health service named service over conn,
// every 20 ms, until it reports SERVING. It returns an error, with the
// end of the output, if the process exits or ctx ends first.
func (p *Proc) WaitServing(ctx context.Context, conn grpc.ClientConnInterface, service string) error {
	hc := healthpb.NewHealthClient(conn)
	for {
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("health %q: %v", service, r.Status)
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited at start: %s", p.Name, p.out)
		case <-ctx.Done():
			return fmt.Errorf("%s not serving (%v): %w: %s", p.Name, err, ctx.Err(), p.out)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends the process as an orchestrator would: SIGTERM to its group,
// then Kill if it has not exited within grace. It returns once the
// process has exited; a repeated call does nothing more.
func (p *Proc) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill sends SIGKILL to the process's group and returns once the process
// has exited; a repeated call does nothing more.
func (p *Proc) Kill() {
	select {
	case <-p.done: // reaped: its group ID may be another's by now
	default:
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.done
	}
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// RatelimitEnv returns envoyproxy/ratelimit's settings (its
// src/settings/settings.go) for a server that reads its configuration
// from root/subdir/config, keeps its buckets in the Redis at redisAddr
// over TCP and listens on loopback at the ports of grpcAddr, httpAddr and
// debugAddr, with no statsd, and health that waits for the configuration.
// Everything else keeps its default, as users run it: a pool of 10 Redis
// connections, no pipelining window, no local cache. The result holds
// only these settings, in this order.
func RatelimitEnv(root, subdir, redisAddr, grpcAddr, httpAddr, debugAddr string) []string {
	return []string{
		"USE_STATSD=false",
		"LOG_LEVEL=warn",
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=" + subdir,
		"RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redisAddr,
		"HOST=127.0.0.1", "PORT=" + port(httpAddr),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(grpcAddr),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(debugAddr),
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true",
	}
}

// tail keeps the last tailMax bytes written to it, for the error that
// says why a process stopped, and sends to addr, once, the address
// floodgate-rls prints when it listens.
type tail struct {
	mu   sync.Mutex
	buf  []byte
	addr chan string // buffered: Write never blocks on it
	seen bool
}

const (
	tailMax   = 4 << 10
	listening = "floodgate-rls: grpc listening on "
)

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if i := bytes.Index(t.buf, []byte(listening)); !t.seen && i >= 0 {
		// Only a whole line: a partial write must not yield half a port.
		if j := bytes.IndexByte(t.buf[i:], '\n'); j >= 0 {
			t.seen = true
			t.addr <- strings.TrimSpace(string(t.buf[i+len(listening) : i+j]))
		}
	}
	if len(t.buf) > tailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}
