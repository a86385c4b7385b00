// Command callcost counts the instructions a gRPC server executes per unary
// call, with and without floodgate, and beside go-grpc-middleware's
// ratelimit: what floodgate adds to an admitted call, and what a rejection
// costs beside a health check on the same server.
//
// Each server runs in a process of its own under valgrind's callgrind; the
// calls come back to back, without deadlines, from this process over
// loopback TCP, outside the count. A case's figure is the server's user-space instructions over
// warm-up plus n calls, less those over the warm-up alone, divided by n:
// the start, the connection and the exit cancel out. The servers run with
// GOMAXPROCS=1 and GODEBUG=asyncpreemptoff=1, which callgrind needs. Each
// run measures every case once, in turn; the median of the runs is
// reported, with their range.
//
// Usage:
//
//	go run ./cmd/callcost [-n 5000] [-warm 300] [-runs 3]
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
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate/bench/internal/peers"
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
	bare          server = "bare"                // no interceptor
	limited       server = "floodgate"           // ServerOptions: the tap handle and the interceptors
	limitedCtl    server = "floodgate+ctl"       // the same with the overload controller
	limitedNoDet  server = "floodgate-nodetails" // the same as floodgate with WithDetails(false)
	ratelimitOpen server = "ratelimit"           // go-grpc-middleware's ratelimit, a limiter per peer IP, never limiting
	ratelimitShut server = "ratelimit-shut"      // the same, limiting every call
)

const (
	startupTimeout = time.Minute           // how long a server under callgrind may take to listen
	perCallTimeout = 50 * time.Millisecond // what a case's calls may take each, on average, under callgrind
)

// A call is what the driver sends.
type call string

const (
	get       call = "get"    // the open tenant's unary call
	getClosed call = "closed" // the closed tenant's, after its one call
	check     call = "health" // a health check, with the closed tenant's key
)

// A kase is one measured figure: calls of one kind on one server, each
// ending with code want and, for a rejection, details status details.
type kase struct {
	name    string
	server  server
	call    call
	want    codes.Code
	details int
}

// The cases' names that the ratios read.
const (
	caseBare        = "bare call"
	caseAdmitted    = "floodgate, admitted"
	caseCtl         = "floodgate with the overload controller, admitted"
	caseRLAdmitted  = "ratelimit, admitted"
	caseHealth      = "health check on floodgate's server"
	caseRejected    = "floodgate, rejected"
	caseNoDetails   = "floodgate WithDetails(false), rejected"
	caseBareHealth  = "health check on the bare server"
	caseRLRejected  = "ratelimit, rejected"
	floodgateDetail = 3 // ErrorInfo, RetryInfo, QuotaFailure
)

var cases = []kase{
	{caseBare, bare, get, codes.OK, 0},
	{caseAdmitted, limited, get, codes.OK, 0},
	{caseCtl, limitedCtl, get, codes.OK, 0},
	{caseRLAdmitted, ratelimitOpen, get, codes.OK, 0},
	{caseHealth, limited, check, codes.OK, 0},
	{caseRejected, limited, getClosed, codes.ResourceExhausted, floodgateDetail},
	{caseNoDetails, limitedNoDet, getClosed, codes.ResourceExhausted, 0},
	{caseBareHealth, bare, check, codes.OK, 0},
	{caseRLRejected, ratelimitShut, get, codes.ResourceExhausted, 0},
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
	warm := fs.Int("warm", 300, "warm-up calls per case, on the connection the measured calls use")
	runs := fs.Int("runs", 3, "runs; each measures every case once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *serve != "" {
		return serveUntilEOF(server(*serve), os.Stdin, os.Stdout)
	}
	if *n <= 0 || *warm <= 0 || *runs <= 0 {
		return fmt.Errorf("-n %d, -warm %d, -runs %d: want each > 0", *n, *warm, *runs)
	}
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		return errors.New("valgrind is not installed; install it with: apt-get install -y valgrind")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	per := map[string][]float64{}
	for range *runs {
		for _, c := range cases {
			base, err := count(vg, self, c, *warm, 0)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			all, err := count(vg, self, c, *warm, *n)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			per[c.name] = append(per[c.name], float64(all-base)/float64(*n))
		}
	}
	return report(w, per, *n)
}

// median returns the median of xs, which it sorts.
func median(xs []float64) float64 {
	slices.Sort(xs)
	m := len(xs) / 2
	if len(xs)%2 == 0 {
		return (xs[m-1] + xs[m]) / 2
	}
	return xs[m]
}

// report writes the table and the ratios that the pages cite, from every
// case's per-call figures; it fails if a case has none.
func report(w io.Writer, per map[string][]float64, n int) error {
	med := map[string]float64{}
	runs := 0
	for _, c := range cases {
		xs := per[c.name]
		if len(xs) == 0 {
			return fmt.Errorf("no figure for %q", c.name)
		}
		runs = len(xs)
		med[c.name] = median(slices.Clone(xs))
	}
	fmt.Fprintf(w, "server user-space instructions per unary call, back to back, callgrind, median of %d runs of %d calls\n\n", runs, n)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tinstructions\trange\tover the bare call\t")
	b := med[caseBare]
	for _, c := range cases {
		x := med[c.name]
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f–%.0f\t%+.0f (%+.1f%%)\t\n", c.name, x, slices.Min(per[c.name]), slices.Max(per[c.name]), x-b, 100*(x-b)/b)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nrejection / health check on the same server: floodgate %.3f, WithDetails(false) %.3f; ratelimit, which limits health checks too, / the bare server's %.3f\n",
		med[caseRejected]/med[caseHealth], med[caseNoDetails]/med[caseHealth], med[caseRLRejected]/med[caseBareHealth])
	return err
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
	// fail stops the server and returns err with what it wrote.
	fail := func(err error) (int64, error) {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 0, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	addr := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		addr <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var a string
	select {
	case a = <-addr:
	case <-time.After(startupTimeout):
	}
	if a == "" {
		return fail(errors.New("the server did not start"))
	}
	if err := drive(a, c, warm+n); err != nil {
		return fail(err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("%w\n%s", err, stderr.String())
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

// drive sends n calls of c's kind to addr on one connection (the closed
// tenant's first call before them), and checks that each ends as c says.
func drive(addr string, c kase, n int) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	key := openKey
	if c.call != get {
		key = closedKey
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
	// The calls carry no deadline, which would cost the server a timer
	// each; a server that stops answering ends them all at once.
	watchdog := time.AfterFunc(startupTimeout+time.Duration(n+1)*perCallTimeout, func() { cc.Close() })
	defer watchdog.Stop()
	do := func() error {
		if c.call == check {
			return cc.Invoke(ctx, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, new(healthpb.HealthCheckResponse))
		}
		return cc.Invoke(ctx, method, new(emptypb.Empty), new(emptypb.Empty))
	}
	if c.call == getClosed {
		if err := do(); err != nil {
			return fmt.Errorf("%s: the closed tenant's one call: %v, want OK", c.name, err)
		}
	}
	for i := range n {
		st := status.Convert(do())
		if st.Code() != c.want {
			return fmt.Errorf("%s: call %d ended %v, want %v", c.name, i, st.Code(), c.want)
		}
		if got := len(st.Details()); st.Code() != codes.OK && got != c.details {
			return fmt.Errorf("%s: call %d carried %d status details, want %d", c.name, i, got, c.details)
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
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(peers.RatelimitInterceptor(1e9, 1e6))}, nil
	case ratelimitShut:
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(peers.RatelimitInterceptor(1e-9, 0))}, nil
	}
	l, err := limiter(s)
	if err != nil {
		return nil, err
	}
	return l.ServerOptions(), nil
}

// limiter returns the Limiter of floodgate's server s: the open tenant and
// the closed one, in memory.
func limiter(s server) (*middleware.Limiter, error) {
	var opts []middleware.Option
	switch s {
	case limited:
	case limitedCtl:
		c, err := overload.New()
		if err != nil {
			return nil, err
		}
		opts = append(opts, middleware.WithOverload(c))
	case limitedNoDet:
		opts = append(opts, middleware.WithDetails(false))
	default:
		return nil, fmt.Errorf("unknown server %q", s)
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
	return middleware.New(store, middleware.Static(tbl), opts...)
}
