package floodgatetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
)

// DefaultMethod is the method served when Config.Methods is empty.
const DefaultMethod = "/floodgatetest.Service/Call"

// Epoch is the simulated time at which every Harness starts.
var Epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// proxyAddr is where every simulated connection comes from: a trusted
// proxy, so that each Caller's address travels in x-forwarded-for.
var proxyAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}

// Config describes the server under test.
type Config struct {
	// Tables is the tenant config under test: middleware.Static of a
	// compiled table, or a *tenant.Registry. Required.
	Tables middleware.Tables
	// Methods are the full method names the server serves, such as
	// "/inventory.v1.Inventory/Get". Each is a unary method taking and
	// returning google.protobuf.Empty. Default: DefaultMethod.
	Methods []string
	// Policy, when set, adds a CPU gate with this policy, driven by the
	// readings SetCPU scripts. Without it limits are never scaled.
	Policy cpugate.Policy
	// Capacity is the store's capacity (keyed.WithCapacity); 0 means the
	// keyed default. A capacity also makes the store one shard, so that
	// which new callers share its overflow bucket repeats from run to run.
	Capacity int
	// Options are added to the Limiter's options after the harness's own
	// (its clock, its gate, and the trusted proxy through which callers'
	// addresses arrive), so they may add to or replace them.
	Options []middleware.Option
	// Interceptors run after the Limiter, before the handler.
	Interceptors []grpc.UnaryServerInterceptor
	// NoTap leaves the tap handle out of the server.
	NoTap bool
}

// A Harness is a gRPC server with a Limiter in front of a handler that
// always succeeds, and a client connected to it in memory. Time is
// simulated: the store, the Limiter and the gate read the harness's clock,
// which moves only by Advance and Run. CPU is scripted: SetCPU.
//
// Calls are real gRPC calls through the real interceptor chain, made one
// at a time; the client does not retry, so every Count is one attempt.
// A Harness is safe for use by one goroutine at a time.
type Harness struct {
	clock   *clock
	store   *keyed.Map
	gate    *cpugate.Gate
	limiter *middleware.Limiter
	srv     *grpc.Server
	cc      *grpc.ClientConn
	done    chan struct{}
	methods map[string]bool

	mu  sync.Mutex
	cpu float64
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// New starts a Harness for a test and stops it at the test's cleanup.
// It fails the test if cfg is invalid.
func New(tb testing.TB, cfg Config) *Harness {
	tb.Helper()
	h, err := Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Close)
	return h
}

// Start starts a Harness; Close stops it. Use New in tests.
func Start(cfg Config) (*Harness, error) {
	if cfg.Tables == nil {
		return nil, errors.New("floodgatetest: Config.Tables is required")
	}
	if cfg.Capacity < 0 {
		return nil, errors.New("floodgatetest: Config.Capacity is negative")
	}
	methods := cfg.Methods
	if len(methods) == 0 {
		methods = []string{DefaultMethod}
	}
	h := &Harness{clock: &clock{now: Epoch}, methods: map[string]bool{}, done: make(chan struct{})}
	kopts := []keyed.Option{keyed.WithClock(h.clock)}
	if cfg.Capacity > 0 {
		// One shard: with several, which new callers share an overflow
		// bucket would depend on the store's random hash seed, and a
		// run would not repeat.
		kopts = append(kopts, keyed.WithCapacity(cfg.Capacity), keyed.WithShards(1))
	}
	store, err := keyed.New(kopts...)
	if err != nil {
		return nil, err
	}
	h.store = store
	mopts := []middleware.Option{
		middleware.WithClock(h.clock),
		middleware.WithTrustedProxies(netip.MustParsePrefix("127.0.0.1/32")),
	}
	if cfg.Policy != nil {
		g, err := cpugate.New(cpugate.SamplerFunc(h.sample), cpugate.WithPolicy(cfg.Policy))
		if err != nil {
			return nil, err
		}
		h.gate = g
		mopts = append(mopts, middleware.WithGate(g))
	}
	l, err := middleware.New(store, cfg.Tables, append(mopts, cfg.Options...)...)
	if err != nil {
		return nil, err
	}
	h.limiter = l

	descs, err := serviceDescs(methods)
	if err != nil {
		return nil, err
	}
	for _, m := range methods {
		h.methods[m] = true
	}
	sopts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{l.UnaryServerInterceptor()}, cfg.Interceptors...)...)}
	if !cfg.NoTap {
		sopts = append(sopts, grpc.InTapHandle(l.TapHandle))
	}
	h.srv = grpc.NewServer(sopts...)
	for _, d := range descs {
		h.srv.RegisterService(d, struct{}{})
	}
	lis := bufconn.Listen(1 << 20)
	go func() {
		defer close(h.done)
		_ = h.srv.Serve(proxyListener{lis})
	}()
	h.cc, err = grpc.NewClient("passthrough:///floodgatetest",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	)
	if err != nil {
		h.srv.Stop()
		<-h.done
		return nil, err
	}
	return h, nil
}

// Close stops the server and closes the client. It is idempotent.
func (h *Harness) Close() {
	_ = h.cc.Close()
	h.srv.Stop()
	<-h.done
}

// serviceDescs builds one service per service name, with an always
// succeeding unary handler per method.
func serviceDescs(methods []string) ([]*grpc.ServiceDesc, error) {
	byService := map[string]*grpc.ServiceDesc{}
	for _, m := range methods {
		i := strings.LastIndexByte(m, '/')
		if !strings.HasPrefix(m, "/") || i <= 1 || i == len(m)-1 {
			return nil, errors.New("floodgatetest: method " + m + " is not of the form /pkg.Service/Method")
		}
		svc, name := m[1:i], m[i+1:]
		d := byService[svc]
		if d == nil {
			d = &grpc.ServiceDesc{ServiceName: svc, HandlerType: (*any)(nil)}
			byService[svc] = d
		}
		full := m
		d.Methods = append(d.Methods, grpc.MethodDesc{
			MethodName: name,
			Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(emptypb.Empty)
				if err := dec(in); err != nil {
					return nil, err
				}
				ok := func(context.Context, any) (any, error) { return &emptypb.Empty{}, nil }
				if icpt == nil {
					return ok(ctx, in)
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, ok)
			},
		})
	}
	names := make([]string, 0, len(byService))
	for n := range byService {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*grpc.ServiceDesc, len(names))
	for i, n := range names {
		out[i] = byService[n]
	}
	return out, nil
}

type proxyListener struct{ *bufconn.Listener }

func (l proxyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return proxyConn{c}, nil
}

// proxyConn presents the in-memory connection as coming from the trusted
// proxy address, so the Limiter reads each caller's x-forwarded-for.
type proxyConn struct{ net.Conn }

func (proxyConn) RemoteAddr() net.Addr { return proxyAddr }

// Now returns the simulated time.
func (h *Harness) Now() time.Time { return h.clock.Now() }

// Advance moves the simulated time forward by d (d ≥ 0).
func (h *Harness) Advance(d time.Duration) {
	if d < 0 {
		panic("floodgatetest: Advance with a negative duration")
	}
	h.clock.mu.Lock()
	h.clock.now = h.clock.now.Add(d)
	h.clock.mu.Unlock()
}

// SetCPU sets the CPU fraction the scripted sampler reports from now on,
// and has the gate take a reading at once. Run takes one more reading per
// step. Without a Config.Policy it does nothing.
func (h *Harness) SetCPU(frac float64) {
	h.mu.Lock()
	h.cpu = frac
	h.mu.Unlock()
	h.Sample()
}

// Sample has the gate read the scripted CPU at the current simulated time,
// as a gate's Run loop would at each interval.
func (h *Harness) Sample() {
	if h.gate != nil {
		_ = h.gate.SampleAt(h.Now())
	}
}

func (h *Harness) sample() (cpugate.Reading, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return cpugate.Reading{CPU: h.cpu, Source: "script"}, nil
}

// Gate returns the CPU gate, or nil without a Config.Policy.
func (h *Harness) Gate() *cpugate.Gate { return h.gate }

// Limiter returns the Limiter under test.
func (h *Harness) Limiter() *middleware.Limiter { return h.limiter }

// Store returns the bucket store.
func (h *Harness) Store() *keyed.Map { return h.store }

// Conn returns the client connection, for calls of your own; add
// x-forwarded-for to their metadata to choose the caller's address.
func (h *Harness) Conn() *grpc.ClientConn { return h.cc }

// A Caller is a simulated client: an address and, optionally, an API key.
type Caller struct {
	h    *Harness
	addr string
	key  string
	md   []string
}

// Tenant returns a caller presenting apiKey in x-api-key, from address
// 192.0.2.1.
func (h *Harness) Tenant(apiKey string) *Caller {
	return &Caller{h: h, addr: "192.0.2.1", key: apiKey}
}

// Anonymous returns a caller without credentials from address addr, an
// IPv4 or IPv6 address such as "198.51.100.7". It panics on anything else:
// the Limiter would key such a caller by the harness's proxy, with every
// other malformed one.
func (h *Harness) Anonymous(addr string) *Caller {
	mustAddr("Anonymous", addr)
	return &Caller{h: h, addr: addr}
}

// From returns a copy of c calling from address addr, which must be an
// IPv4 or IPv6 address.
func (c *Caller) From(addr string) *Caller {
	mustAddr("From", addr)
	d := *c
	d.addr = addr
	return &d
}

func mustAddr(fn, addr string) {
	// A zone names an interface of the proxy, not a client: the Limiter
	// refuses it in forwarding headers.
	if a, err := netip.ParseAddr(addr); err != nil || a.Zone() != "" {
		panic(fmt.Sprintf("floodgatetest: %s(%q): not an IP address without a zone", fn, addr))
	}
}

// WithMetadata returns a copy of c that also sends the given key-value
// pairs, as for metadata.Pairs.
func (c *Caller) WithMetadata(kv ...string) *Caller {
	d := *c
	d.md = append(append([]string(nil), c.md...), kv...)
	return &d
}

// Call makes one call to method and returns its error: nil when admitted,
// else a status error (RESOURCE_EXHAUSTED, UNAVAILABLE, …).
func (c *Caller) Call(method string) error {
	if !c.h.methods[method] {
		return status.Error(codes.Unimplemented, "floodgatetest: method "+method+" is not in Config.Methods")
	}
	kv := append([]string{"x-forwarded-for", c.addr}, c.md...)
	if c.key != "" {
		kv = append(kv, "x-api-key", c.key)
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), metadata.Pairs(kv...)), time.Minute)
	defer cancel()
	return c.h.cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
}

// CallN makes n calls to method at the current simulated time.
func (c *Caller) CallN(method string, n int) Counts {
	var k Counts
	for range n {
		k.add(c.Call(method))
	}
	return k
}

// Counts tallies calls by outcome.
type Counts struct {
	// OK counts admitted calls.
	OK int
	// ResourceExhausted and Unavailable count the two rejection codes.
	ResourceExhausted, Unavailable int
	// Other counts any other error.
	Other int
}

func (k *Counts) add(err error) {
	switch status.Code(err) {
	case codes.OK:
		k.OK++
	case codes.ResourceExhausted:
		k.ResourceExhausted++
	case codes.Unavailable:
		k.Unavailable++
	default:
		k.Other++
	}
}

// Total returns the number of calls counted.
func (k Counts) Total() int { return k.OK + k.Rejected() }

// Rejected returns the number of calls not admitted.
func (k Counts) Rejected() int { return k.ResourceExhausted + k.Unavailable + k.Other }

// Plus returns the sum of k and o.
func (k Counts) Plus(o Counts) Counts {
	return Counts{k.OK + o.OK, k.ResourceExhausted + o.ResourceExhausted, k.Unavailable + o.Unavailable, k.Other + o.Other}
}

// A Load is a caller calling a method at a steady rate.
type Load struct {
	// Caller is the simulated client that makes the calls.
	Caller *Caller
	// Method is the full method name called, one of Config.Methods.
	Method string
	// Rate is in calls per second of simulated time.
	Rate float64
}

// Run simulates d of time in steps of step: at each step every load makes
// the calls its rate has accrued (loads interleaved, one call each in
// turn), then the gate takes a reading of the scripted CPU, then the clock
// advances by step. It returns the counts of each load, in order. It panics
// on a step that is not positive or does not divide d, and on a load whose
// caller is nil or from another Harness or whose method is not one of
// Config.Methods: such a run could not mean what it seems to.
func (h *Harness) Run(d, step time.Duration, loads ...Load) []Counts {
	if step <= 0 || d%step != 0 {
		panic(fmt.Sprintf("floodgatetest: Run(%v, %v): the step must be positive and divide the duration", d, step))
	}
	for i, ld := range loads {
		switch {
		case ld.Caller == nil:
			panic(fmt.Sprintf("floodgatetest: Run: load %d has no caller", i))
		case ld.Caller.h != h:
			panic(fmt.Sprintf("floodgatetest: Run: load %d's caller belongs to another Harness", i))
		case !h.methods[ld.Method]:
			panic(fmt.Sprintf("floodgatetest: Run: load %d calls %q, which is not one of Config.Methods", i, ld.Method))
		}
	}
	counts := make([]Counts, len(loads))
	due := make([]float64, len(loads))
	for elapsed := time.Duration(0); elapsed < d; elapsed += step {
		for i, ld := range loads {
			due[i] += ld.Rate * step.Seconds()
		}
		for more := true; more; {
			more = false
			for i, ld := range loads {
				if due[i] >= 1-1e-9 {
					counts[i].add(ld.Caller.Call(ld.Method))
					due[i]--
					more = true
				}
			}
		}
		h.Sample()
		h.Advance(step)
	}
	return counts
}
