package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
	"github.com/floodgate-go/floodgate/internal/redistest"
)

// ratelimitBinary returns path, or the service_cmd rlsproc installs in its
// cache directory.
func ratelimitBinary(ctx context.Context, path string, logf func(string, ...any)) (string, error) {
	if path == "" {
		return rlsproc.RatelimitBinary(ctx, logf)
	}
	_, err := os.Stat(path)
	return path, err
}

// floodgateBinary returns path, or floodgate-rls built from the working
// tree's rls module: the point is to measure the store as it is edited.
// version is path, or the repository's commit.
func floodgateBinary(ctx context.Context, path string, logf func(string, ...any)) (bin, version string, err error) {
	if path == "" {
		return rlsproc.FloodgateBinary(ctx, "floodgate-rls-churn", logf)
	}
	_, err = os.Stat(path)
	return path, path, err
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

// A replica is one server process, with the connection the callers use.
type replica struct {
	*rlsproc.Proc
	addr string
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
		argv = []string{l.floodgate, "-config", filepath.Join(l.root, "ratelimit", "config"), "-addr", "127.0.0.1:0",
			"-redis", l.redis.Addr, "-lease", "on", "-prefix", prefix, "-watch", "0"}
	case "ratelimit":
		var addrs [3]string
		for i := range addrs {
			a, err := rlsproc.FreeAddr()
			if err != nil {
				return nil, err
			}
			addrs[i] = a
		}
		addr, health, argv = addrs[0], "ratelimit", []string{l.ratelimit}
		env = append(os.Environ(), rlsproc.RatelimitEnv(l.root, "ratelimit", l.redis.Addr, addrs[0], addrs[1], addrs[2])...)
	default:
		return nil, fmt.Errorf("unknown variant %q", variant)
	}
	p, err := rlsproc.Start(name, argv, env)
	if err != nil {
		return nil, err
	}
	r := &replica{Proc: p}
	l.mu.Lock()
	l.replicas = append(l.replicas, r)
	l.mu.Unlock()
	fail := func(err error) (*replica, error) {
		r.kill()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.startLimit)
	defer cancel()
	if addr == "" { // floodgate-rls on port 0 says which it got
		if addr, err = p.Listening(ctx); err != nil {
			return fail(err)
		}
	}
	r.addr = addr
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(fmt.Errorf("%s: %w", name, err))
	}
	r.conn, r.stub = conn, rlsv3.NewRateLimitServiceClient(conn)
	if err := p.WaitServing(ctx, conn, health); err != nil {
		return fail(err)
	}
	return r, nil
}

// term stops r as an orchestrator would: SIGTERM, then SIGKILL if it has
// not drained within five seconds.
func (r *replica) term() {
	r.Stop(5 * time.Second)
	r.conn.Close()
}

func (r *replica) kill() {
	r.Kill()
	if r.conn != nil {
		r.conn.Close()
	}
}
