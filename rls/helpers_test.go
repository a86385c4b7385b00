package rls_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/rls"
)

// fakeClock is the tests' controlled clock.
type fakeClock = fakeclock.Clock

var bg = context.Background()

func newFakeClock() *fakeClock { return fakeclock.New(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) }

// A backend makes the store of one test run on a clock the test drives.
type backend struct {
	name  string
	store func(t *testing.T, clock floodgate.Clock) floodgate.Reserver
}

var (
	sharedOnce sync.Once
	shared     *redistest.Server
	sharedErr  error

	clusterOnce sync.Once
	cluster     *redistest.Cluster
	clusterErr  error

	prefixes atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	if cluster != nil {
		cluster.Close()
	}
	os.Exit(code)
}

func skipWithoutRedis(t *testing.T) {
	t.Helper()
	if !redistest.Installed() {
		t.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
	}
}

func prefix(t *testing.T) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("t%d_%s", prefixes.Add(1), name)
}

func redisStore(t *testing.T, c redis.UniversalClient, clock floodgate.Clock, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	// A long deadline: these tests check semantics, and a loaded machine
	// under the race detector can take tens of ms to dial.
	opts = append([]redisstore.Option{redisstore.WithPrefix(prefix(t)), redisstore.WithDeadline(5 * time.Second),
		redisstore.WithClientClock(clock)}, opts...)
	s, err := redisstore.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var backends = []backend{
	{"memory", func(t *testing.T, clock floodgate.Clock) floodgate.Reserver {
		m, err := keyed.New(keyed.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}},
	{"redis", func(t *testing.T, clock floodgate.Clock) floodgate.Reserver {
		s, _ := sharedStore(t, clock, redisstore.WithBatching(16))
		return s
	}},
	{"redis-deny-cache", func(t *testing.T, clock floodgate.Clock) floodgate.Reserver {
		s, _ := sharedStore(t, clock, redisstore.WithBatching(16), redisstore.WithDenyCache(64))
		return s
	}},
	{"cluster", func(t *testing.T, clock floodgate.Clock) floodgate.Reserver {
		skipWithoutRedis(t)
		clusterOnce.Do(func() { cluster, clusterErr = redistest.LaunchCluster(3) })
		if clusterErr != nil {
			t.Fatal(clusterErr)
		}
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return redisStore(t, c, clock)
	}},
}

// sharedStore returns a store on the package's shared redis-server, which
// it starts once, and its client.
func sharedStore(t *testing.T, clock floodgate.Clock, opts ...redisstore.Option) (*redisstore.Store, *redis.Client) {
	t.Helper()
	skipWithoutRedis(t)
	sharedOnce.Do(func() { shared, sharedErr = redistest.Launch() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	c := redis.NewClient(&redis.Options{Addr: shared.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return redisStore(t, c, clock, opts...), c
}

// sharedService serves config from a store on the shared redis-server
// with opts, and returns the store, its client and a client of the
// service.
func sharedService(t *testing.T, config string, opts ...redisstore.Option) (*redisstore.Store, *redis.Client, pb.RateLimitServiceClient) {
	t.Helper()
	st, c := sharedStore(t, newFakeClock(), opts...)
	svc, err := rls.New(st, mustParse(t, config))
	if err != nil {
		t.Fatal(err)
	}
	return st, c, serve(t, svc)
}

// serve starts svc on loopback TCP and returns a real client of it.
func serve(t *testing.T, svc *rls.Service) pb.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

// writeConfig writes a config file named name into dir (a new temporary
// directory when dir is "") and returns its path.
func writeConfig(t *testing.T, dir, name, text string) string {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustParse(t *testing.T, text string) *rls.Config {
	t.Helper()
	cfg, err := rls.ParseConfig("test.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlpb.RateLimitDescriptor {
	d := &rlpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withHits(d *rlpb.RateLimitDescriptor, n uint64) *rlpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func request(domain string, hits uint32, ds ...*rlpb.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

func call(t *testing.T, c pb.RateLimitServiceClient, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("ShouldRateLimit: %d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

// outcome is a response's codes and remaining tokens, for comparisons.
type outcome struct {
	Overall   string
	Codes     []string
	Remaining []uint32
}

func outcomeOf(r *pb.RateLimitResponse) outcome {
	o := outcome{Overall: r.GetOverallCode().String()}
	for _, s := range r.GetStatuses() {
		o.Codes = append(o.Codes, s.GetCode().String())
		o.Remaining = append(o.Remaining, s.GetLimitRemaining())
	}
	return o
}

type rlpbDescriptor = rlpb.RateLimitDescriptor

func negative(d *rlpb.RateLimitDescriptor) *rlpb.RateLimitDescriptor {
	d.IsNegativeHits = true
	return d
}
