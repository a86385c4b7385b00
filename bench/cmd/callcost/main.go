// Command callcost counts the instructions a gRPC server executes per unary
// call, with and without floodgate, and beside go-grpc-middleware's
// ratelimit: what floodgate adds to an admitted call, and what a rejection
// costs beside a health check on the same server.
//
// Each server runs in a process of its own under valgrind's callgrind,
// which counts instructions, not seconds: the figures repeat to within a
// few hundred instructions whatever else the machine is doing, where CPU
// times of a ~100 µs call vary by more than floodgate's whole share. The
// calls come from this process over loopback TCP, outside the count. A
// case's figure is the server's instructions over warm-up plus n calls,
// less those over the warm-up alone, divided by n: the start, the
// connection and the exit cancel out. The median of -runs is reported.
//
// The server runs with GOMAXPROCS=1 and GODEBUG=asyncpreemptoff=1:
// callgrind runs one thread at a time anyway, and it cannot follow the
// signals of Go's asynchronous preemption.
//
// Usage:
//
//	go run ./cmd/callcost [-n 5000] [-runs 3]
//
// It needs valgrind (apt-get install -y valgrind).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	ratelimit "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// The servers' API keys: the open tenant is never limited, the closed one
// is allowed one call in a very long time.
const (
	openKey   = "open-key-0123456789"
	closedKey = "closed-key-0123456789"
	method    = "/bench.v1.Svc/Get"
)

// A server is what a case's server process runs.
type server string

const (
	bare          server = "bare"           // no interceptor
	limited       server = "floodgate"      // ServerOptions: the tap handle and the interceptors
	limitedCtl    server = "floodgate+ctl"  // the same with the overload controller
	limitedBare   server = "floodgate-bare" // the same with WithDetails(false)
	ratelimitOpen server = "ratelimit"      // go-grpc-middleware's ratelimit, x/time/rate per peer IP, never limiting
	ratelimitShut server = "ratelimit-shut" // the same, limiting every call
)

// A call is what the driver sends.
type call string

const (
	get       call = "get"    // the open tenant's unary call
	getClosed call = "closed" // the closed tenant's
	check     call = "health" // a health check
)

// A kase is one measured figure: calls of one kind on one server.
type kase struct {
	name   string
	server server
	call   call
	want   codes.Code
}

var cases = []kase{
	{"bare call", bare, get, codes.OK},
	{"floodgate, admitted", limited, get, codes.OK},
	{"floodgate with the overload controller, admitted", limitedCtl, get, codes.OK},
	{"ratelimit, admitted", ratelimitOpen, get, codes.OK},
	{"health check on floodgate's server", limited, check, codes.OK},
	{"floodgate, rejected", limited, getClosed, codes.ResourceExhausted},
	{"floodgate WithDetails(false), rejected", limitedBare, getClosed, codes.ResourceExhausted},
	{"health check on the bare server", bare, check, codes.OK},
	{"ratelimit, rejected", ratelimitShut, get, codes.ResourceExhausted},
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "callcost:", err)
		os.Exit(1)
	}
}

func run(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("callcost", flag.ContinueOnError)
	serve := fs.String("serve", "", "internal: serve this server kind until stdin closes")
	n := fs.Int("n", 5000, "measured calls per case")
	warm := fs.Int("warm", 300, "warm-up calls per case")
	runs := fs.Int("runs", 3, "runs per case; the median is reported")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *serve != "" {
		return serveUntilEOF(server(*serve), os.Stdin, os.Stdout)
	}
	if *n <= 0 || *warm < 0 || *runs <= 0 {
		return fmt.Errorf("-n %d, -warm %d, -runs %d: want n > 0, warm ≥ 0, runs > 0", *n, *warm, *runs)
	}
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		return errors.New("valgrind is not installed; install it with: apt-get install -y valgrind")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	per := map[string]float64{}
	for _, c := range cases {
		var xs []float64
		for range *runs {
			base, err := count(vg, self, c, *warm, 0)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			all, err := count(vg, self, c, *warm, *n)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			xs = append(xs, float64(all-base)/float64(*n))
		}
		slices.Sort(xs)
		per[c.name] = xs[len(xs)/2]
	}
	report(w, per, *n, *runs)
	return nil
}

// report writes the table and the ratios that the page cites.
func report(w io.Writer, per map[string]float64, n, runs int) {
	fmt.Fprintf(w, "server instructions per unary call, callgrind, median of %d runs of %d calls\n\n", runs, n)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tinstructions\tover the bare call\t")
	b := per[cases[0].name]
	for _, c := range cases {
		fmt.Fprintf(tw, "%s\t%.0f\t%+.0f (%+.1f%%)\t\n", c.name, per[c.name], per[c.name]-b, 100*(per[c.name]-b)/b)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nrejection / health check on the same server: floodgate %.3f, WithDetails(false) %.3f; ratelimit, which limits health checks too, / the bare server's %.3f\n",
		per["floodgate, rejected"]/per["health check on floodgate's server"],
		per["floodgate WithDetails(false), rejected"]/per["health check on floodgate's server"],
		per["ratelimit, rejected"]/per["health check on the bare server"])
}

// collected is callgrind's total of instructions executed.
var collected = regexp.MustCompile(`(?m)^==\d+== Collected : (\d+)$`)

// count starts c's server under callgrind, sends it warm + n calls of c's
// kind on one connection, stops it and returns the instructions it ran.
func count(vg, self string, c kase, warm, n int) (int64, error) {
	cmd := exec.Command(vg, "--tool=callgrind", "--callgrind-out-file=/dev/null", self, "-serve", string(c.server))
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "GODEBUG=asyncpreemptoff=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Process.Kill()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("the server did not start: %v\n%s", err, stderr.String())
	}
	if err := drive(strings.TrimSpace(addr), c, warm+n); err != nil {
		return 0, err
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("%v\n%s", err, stderr.String())
	}
	return parseCollected(stderr.String())
}

func parseCollected(out string) (int64, error) {
	m := collected.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no instruction count in callgrind's output:\n%s", out)
	}
	return strconv.ParseInt(m[1], 10, 64)
}

// drive sends n calls of c's kind to addr on one connection, and checks
// that each ends with c's code.
func drive(addr string, c kase, n int) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	key := openKey
	if c.call == getClosed {
		key = closedKey
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
	do := func() error { return cc.Invoke(ctx, method, new(emptypb.Empty), new(emptypb.Empty)) }
	if c.call == check {
		do = func() error {
			return cc.Invoke(ctx, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, new(healthpb.HealthCheckResponse))
		}
	}
	if c.call == getClosed {
		_ = do() // the closed tenant's one call
	}
	for i := range n {
		if got := status.Code(do()); got != c.want {
			return fmt.Errorf("%s: call %d ended %v, want %v", c.name, i, got, c.want)
		}
	}
	return nil
}

// serveUntilEOF serves s on a loopback port, writes the address to w, and
// stops when r reaches its end.
func serveUntilEOF(s server, r io.Reader, w io.Writer) error {
	opts, err := serverOptions(s)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := newServer(opts)
	go func() { _ = srv.Serve(lis) }()
	fmt.Fprintln(w, lis.Addr())
	_, _ = io.Copy(io.Discard, r)
	srv.Stop()
	return nil
}

var svc = grpc.ServiceDesc{
	ServiceName: "bench.v1.Svc",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Get", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(emptypb.Empty)
		if err := dec(in); err != nil {
			return nil, err
		}
		if icpt == nil {
			return in, nil
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: method}, func(_ context.Context, req any) (any, error) { return req, nil })
	}}},
}

func newServer(opts []grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&svc, struct{}{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv
}

// serverOptions returns s's server options.
func serverOptions(s server) ([]grpc.ServerOption, error) {
	switch s {
	case bare:
		return nil, nil
	case ratelimitOpen:
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(newIPLimiter(1e9, 1e6)))}, nil
	case ratelimitShut:
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(newIPLimiter(1e-9, 0)))}, nil
	case limited, limitedCtl, limitedBare:
	default:
		return nil, fmt.Errorf("unknown server %q", s)
	}
	var opts []middleware.Option
	switch s {
	case limitedCtl:
		c, err := overload.New()
		if err != nil {
			return nil, err
		}
		opts = append(opts, middleware.WithOverload(c))
	case limitedBare:
		opts = append(opts, middleware.WithDetails(false))
	}
	open, err1 := tenant.HashKey(openKey)
	closed, err2 := tenant.HashKey(closedKey)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	tbl, err := tenant.Compile(&tenant.Config{
		Tenants: map[string]tenant.TenantSpec{
			"open":   {Default: &tenant.LimitSpec{Rate: 1e9, Burst: 1e9}, Keys: []string{open}},
			"closed": {Default: &tenant.LimitSpec{Rate: 1e-6, Burst: 1}, Keys: []string{closed}},
		},
	})
	if err != nil {
		return nil, err
	}
	store, err := keyed.New()
	if err != nil {
		return nil, err
	}
	l, err := middleware.New(store, middleware.Static(tbl), opts...)
	if err != nil {
		return nil, err
	}
	return l.ServerOptions(), nil
}

// ipLimiter is ratelimit's Limiter over one x/time/rate limiter per peer
// IP, as its README suggests.
type ipLimiter struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	limit rate.Limit
	burst int
}

func newIPLimiter(r float64, burst int) *ipLimiter {
	return &ipLimiter{m: map[string]*rate.Limiter{}, limit: rate.Limit(r), burst: burst}
}

var errLimited = errors.New("rate limited")

func (l *ipLimiter) Limit(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return errors.New("no peer")
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return err
	}
	l.mu.Lock()
	lim, ok := l.m[host]
	if !ok {
		lim = rate.NewLimiter(l.limit, l.burst)
		l.m[host] = lim
	}
	l.mu.Unlock()
	if !lim.AllowN(time.Now(), 1) {
		return errLimited
	}
	return nil
}
