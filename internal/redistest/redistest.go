// Package redistest starts real redis-server processes on free loopback ports
// for tests and examples: a standalone server that tests can kill, hang
// (SIGSTOP, or DEBUG SLEEP with the server's cooperation), restart and flush
// the script cache of, and a small Redis Cluster of masters only.
//
// Nothing here mocks Redis. When redis-server is not installed, the testing
// helpers skip the test with a message that says how to install it.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrNotInstalled is returned when redis-server (or redis-cli, for a
// Cluster) is not on PATH.
var ErrNotInstalled = errors.New("redistest: redis-server is not installed (apt-get install -y redis-server)")

// Installed reports whether redis-server and redis-cli are on PATH.
func Installed() bool {
	_, err1 := exec.LookPath("redis-server")
	_, err2 := exec.LookPath("redis-cli")
	return err1 == nil && err2 == nil
}

// A Server is one redis-server process listening on 127.0.0.1.
// Its methods are safe for concurrent use.
type Server struct {
	// Addr is host:port of the server.
	Addr string
	// Port is its TCP port.
	Port int

	dir   string
	extra []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
}

// Launch starts a redis-server with no persistence on a free loopback port
// and waits until it answers PING. extra arguments are appended to the
// command line (for example "--cluster-enabled", "yes"). The caller must
// call Close.
func Launch(extra ...string) (*Server, error) {
	if !Installed() {
		return nil, ErrNotInstalled
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	var last error
	for range 10 {
		port, err := freePort(len(extra) > 0 && contains(extra, "--cluster-enabled"))
		if err != nil {
			last = err
			continue
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir, extra: extra}
		if err := s.start(); err != nil {
			last = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: cannot start redis-server: %w", last)
}

// Start is Launch for tests: it skips t when redis-server is not installed,
// fails it when the server does not start, and closes the server in
// t.Cleanup.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	if !Installed() {
		t.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
	}
	s, err := Launch(extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// freePort returns a port that was free a moment ago. For a cluster node the
// bus port (port+10000) must be free too.
func freePort(cluster bool) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !cluster {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		lb, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		lb.Close()
		return port, nil
	}
	return 0, errors.New("redistest: no free port")
}

func (s *Server) start() error {
	args := []string{
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--dir", s.dir,
		"--logfile", "",
		"--loglevel", "warning",
		// DEBUG SLEEP blocks the server as a slow command would; allowed
		// from loopback only (every test server listens there).
		"--enable-debug-command", "local",
	}
	args = append(args, s.extra...)
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout = nil
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		return err
	}
	// A production Redis has its own CPUs; here it shares two with the
	// tests that load it, and a test spinning on both would starve it and
	// measure its own load as Redis's slowness. Raise its priority where
	// allowed (as root); elsewhere it keeps the default.
	syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, -10)
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := Do(s.Addr, "PING"); err == nil {
			break
		}
		select {
		case <-exited:
			return errors.New("redistest: redis-server exited at start (port taken?)")
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return errors.New("redistest: redis-server did not answer PING within 5s")
		}
	}
	s.mu.Lock()
	s.cmd, s.exited, s.stopped = cmd, exited, false
	s.mu.Unlock()
	return nil
}

// Kill sends SIGKILL and waits for the process to exit. The server's data
// is lost.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd, s.stopped = nil, false
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Stop sends SIGSTOP and waits until the process is stopped: the server
// keeps its sockets open but answers nothing, like a hung host. A signal
// is delivered asynchronously, and a running server may answer a few more
// commands after kill(2) returns, so Stop waits for /proc to show the
// process stopped (state T), sending SIGSTOP again every 50 ms meanwhile.
// It returns an error, naming the pid and the state /proc last showed, if
// the process is not stopped within 5 s: a test that goes on would count a
// running server's answers as decisions made during a hang. Where /proc is
// not there (not Linux) it returns once the signal is sent.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.stopped {
		return nil
	}
	s.stopped = true
	pid := s.cmd.Process.Pid
	last := byte('?')
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return fmt.Errorf("redistest: SIGSTOP to redis-server (pid %d): %w", pid, err)
		}
		for next := time.Now().Add(50 * time.Millisecond); time.Now().Before(next); time.Sleep(time.Millisecond) {
			st, ok := procState(pid)
			if !ok || st == 'T' {
				return nil
			}
			last = st
		}
	}
	return fmt.Errorf("redistest: redis-server (pid %d) not stopped 5 s after SIGSTOP: /proc shows state %c", pid, last)
}

// procState returns pid's state letter in /proc/PID/stat, and false if it
// cannot be read (not Linux, or the process is gone).
func procState(pid int) (byte, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// pid (comm) state ...: comm may hold spaces, so look after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0, false
	}
	return b[i+2], true
}

// Answers reports whether the server answers a PING, on a fresh
// connection, within d: false while it is stopped, hung or down.
func (s *Server) Answers(d time.Duration) bool {
	c, err := net.DialTimeout("tcp", s.Addr, d)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// Cont sends SIGCONT to a server stopped by Stop.
func (s *Server) Cont() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.stopped {
		s.cmd.Process.Signal(syscall.SIGCONT)
		s.stopped = false
	}
}

// Sleep blocks the server for d with DEBUG SLEEP, as a slow command or a
// long fork would: it answers nothing meanwhile but keeps its connections.
// Sleep returns once the command is sent, so that a caller whose goroutines
// are slow to run still knows when the sleep began; the channel receives
// the command's outcome when the server answers again (d is at most 4 s).
func (s *Server) Sleep(d time.Duration) (<-chan error, error) {
	c, err := send(s.Addr, "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		defer c.Close()
		_, err := readReply(bufio.NewReader(c))
		done <- err
	}()
	return done, nil
}

// FlushScripts empties the server's script cache (SCRIPT FLUSH), as a
// restart or a failover does.
func (s *Server) FlushScripts() error {
	_, err := Do(s.Addr, "SCRIPT", "FLUSH")
	return err
}

// Restart starts a killed server again on the same port, empty.
func (s *Server) Restart() error {
	s.Kill()
	var err error
	for range 20 { // the port may linger briefly after the kill
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// Close kills the server and removes its directory. It is idempotent.
func (s *Server) Close() {
	s.Kill()
	os.RemoveAll(s.dir)
}

// Do sends one command in RESP to addr on a fresh connection and returns the
// reply as text: a status or bulk string as is, an integer in decimal, an
// array as its elements joined by newlines. A Redis error reply is returned
// as an error.
func Do(addr string, args ...string) (string, error) {
	c, err := send(addr, args...)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return readReply(bufio.NewReader(c))
}

// send writes one command to addr on a fresh connection, which it returns
// with a deadline 5 s away for the reply.
func send(addr string, args ...string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("redistest: empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, max(n, 0))
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redistest: unexpected reply %q", line)
}

// A Cluster is a Redis Cluster of masters without replicas, all on
// loopback.
type Cluster struct {
	// Addrs are the masters' host:port addresses.
	Addrs   []string
	Servers []*Server
}

// LaunchCluster starts masters redis-server processes in cluster mode,
// joins them with redis-cli --cluster create (slots split evenly) and waits
// until every node reports cluster_state:ok. The caller must call Close.
func LaunchCluster(masters int) (*Cluster, error) {
	if masters < 3 {
		return nil, errors.New("redistest: a cluster needs at least 3 masters")
	}
	c := &Cluster{}
	for range masters {
		s, err := Launch("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %v: %s", err, out)
	}
	for _, s := range c.Servers {
		if err := waitClusterOK(s, 20*time.Second); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// waitClusterOK waits until s reports cluster_state:ok.
func waitClusterOK(s *Server, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		info, err := Do(s.Addr, "CLUSTER", "INFO")
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: %s did not reach cluster_state:ok within %v", s.Addr, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Restart starts node s of the cluster again after a Kill, on the same port
// and with its cluster configuration (so with its slots, but no keys), and
// waits until it serves them: until it reports cluster_state:ok. Until then
// it answers CLUSTERDOWN.
func (c *Cluster) Restart(s *Server) error {
	if err := s.Restart(); err != nil {
		return err
	}
	return waitClusterOK(s, 20*time.Second)
}

// StartCluster is LaunchCluster for tests: it skips t when redis-server is
// not installed and closes the cluster in t.Cleanup.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if !Installed() {
		t.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
	}
	c, err := LaunchCluster(masters)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Close kills every node. It is idempotent.
func (c *Cluster) Close() {
	for _, s := range c.Servers {
		s.Close()
	}
}
