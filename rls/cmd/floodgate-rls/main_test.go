package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/rls"
)

const config1 = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
const config2 = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"

// started runs the command in process with args and returns the addresses
// it printed, by listener name, and a function that stops it and returns
// run's error.
func started(t *testing.T, args []string, hup chan os.Signal) (map[string]string, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, args, pw, io.Discard, hup)
		pw.Close()
		done <- err
	}()
	addrs := map[string]string{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		// "floodgate-rls: grpc listening on 127.0.0.1:PORT"
		f := strings.Fields(sc.Text())
		if len(f) == 5 && f[2] == "listening" {
			addrs[f[1]] = f[4]
		}
		if addrs["grpc"] != "" {
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if addrs["grpc"] == "" {
		cancel()
		t.Fatalf("the command printed no grpc address: %v", <-done)
	}
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return addrs, stop
}

func TestCommand(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rl.yaml")
	if err := os.WriteFile(path, []byte(config1), 0o644); err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal) // unbuffered: a send returns once run has taken it
	addrs, stop := started(t, []string{"-config", path, "-addr", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-watch", "0", "-headers", "-pprof"}, hup)
	conn, err := grpc.NewClient(addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", h, err)
	}
	h, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rls.QuotaServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("RLQS health: %v, %v", h, err)
	}
	// RLQS on the same port, from the same config: 1 a minute is a token
	// bucket filled every 60 s.
	qstream, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bid := &rlqspb.BucketId{Bucket: map[string]string{"k": "v"}}
	if err := qstream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: bid, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	qr, err := qstream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	qa := qr.GetBucketAction()[0].GetQuotaAssignmentAction()
	if tb := qa.GetRateLimitStrategy().GetTokenBucket(); tb.GetFillInterval().AsDuration() != time.Minute ||
		tb.GetTokensPerFill().GetValue() < 1 || qa.GetAssignmentTimeToLive().AsDuration() != 12*time.Second {
		t.Errorf("RLQS assignment = %v, want a token bucket filled every minute, TTL 12s", qa)
	}
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	lr, err := rs.Recv()
	if err != nil || !strings.Contains(lr.String(), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("reflection lists %v (%v), want the rate-limit service", lr, err)
	}
	_ = rs.CloseSend()

	rl := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	decide := func() *pb.RateLimitResponse {
		r, err := rl.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	codes := func() string { return decide().GetOverallCode().String() }
	if got := codes() + " " + codes(); got != "OK OVER_LIMIT" {
		t.Errorf("two calls under 1 a minute: %s", got)
	}

	// SIGHUP reloads. The bucket keeps its state (empty), under the new
	// limit.
	if err := os.WriteFile(path, []byte(config2), 0o644); err != nil {
		t.Fatal(err)
	}
	hup <- syscall.SIGHUP
	hup <- syscall.SIGHUP // taken once the first reload is done
	if got := decide().GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 3 {
		t.Errorf("after SIGHUP the limit is %d a minute, want 3", got)
	}

	// The second SIGHUP is taken as the first reload ends; its own reload
	// may still be running: poll until it is counted.
	var body []byte
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + addrs["metrics"] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "floodgate_rls_config_loads_total{result=\"success\"} 3") || time.Now().After(deadline) {
			break
		}
	}
	for _, m := range []string{"floodgate_rls_requests_total", "floodgate_rls_config_loads_total{result=\"success\"} 3", "go_goroutines"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if resp, err := http.Get("http://" + addrs["metrics"] + "/debug/pprof/cmdline"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("-pprof: /debug/pprof/cmdline answered %v, %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
	if _, err := qstream.Recv(); status.Code(err) != grpccodes.Unavailable {
		t.Errorf("RLQS stream after stop: %v, want Unavailable", err)
	}
}

func TestCommandRedis(t *testing.T) {
	if !redistest.Installed() {
		t.Skip("redis-server is not installed; install it with: apt-get install -y redis-server")
	}
	srv := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "rl.yaml")
	if err := os.WriteFile(path, []byte(config1), 0o644); err != nil {
		t.Fatal(err)
	}
	// Two replicas on one Redis share the bucket, and divide its quota.
	var clients []pb.RateLimitServiceClient
	var quotas []rlqspb.RateLimitQuotaServiceClient
	var metrics string
	for range 2 {
		addrs, _ := started(t, []string{"-config", path, "-addr", "127.0.0.1:0", "-metrics", "127.0.0.1:0", "-redis", srv.Addr, "-lease", "on",
			"-rlqs-interval", "1s"}, nil)
		metrics = addrs["metrics"]
		conn, err := grpc.NewClient(addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, pb.NewRateLimitServiceClient(conn))
		quotas = append(quotas, rlqspb.NewRateLimitQuotaServiceClient(conn))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	var got []string
	for _, c := range clients {
		r, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.GetOverallCode().String())
	}
	if strings.Join(got, " ") != "OK OVER_LIMIT" {
		t.Errorf("one token a minute across two replicas: %v", got)
	}
	// Each replica answers a subscription with a token bucket, and takes
	// its rounds on Redis: the quota's hash there names both.
	for i, q := range quotas {
		qs, err := q.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := qs.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"k": "v"}}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1}}}); err != nil {
			t.Fatal(err)
		}
		qr, err := qs.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if tb := qr.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb == nil {
			t.Errorf("replica %d: RLQS answer %v, want a token bucket", i, qr)
		}
	}
	var members string
	for ctx.Err() == nil {
		keys, _ := redistest.Do(srv.Addr, "KEYS", "floodgate:{rlqs:*")
		if keys != "" {
			if members, _ = redistest.Do(srv.Addr, "HLEN", keys); members == "2" {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if members != "2" {
		t.Errorf("the quota's hash on Redis has %q members, want 2 replicas", members)
	}
	if resp, err := http.Get("http://" + metrics + "/debug/pprof/cmdline"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("without -pprof, /debug/pprof/cmdline answered %v, %v; want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"floodgate_redis_call_duration_seconds", "floodgate_redis_breaker_state{state=\"closed\"} 1"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-config is required"},
		{[]string{"-config", "x", "extra"}, "unexpected arguments"},
		{[]string{"-config", "x", "-pprof"}, "-pprof needs -metrics"},
		{[]string{"-config", "x", "-deny-cache", "-1"}, "-deny-cache -1"},
		{[]string{"-config", "x", "-rlqs-interval", "0s"}, "-rlqs-interval 0s"},
		{[]string{"-config", "x.yaml", "-redis", "127.0.0.1:1", "-prefix", "a{b"}, "WithPrefix(\"a{b\")"},
		{[]string{"-config", "/nonexistent.yaml"}, "/nonexistent.yaml"},
		{[]string{"-config", "x.yaml", "-redis", "127.0.0.1:1", "-lease", "sometimes"}, "-lease"},
	} {
		if tc.args != nil && tc.args[1] == "x.yaml" {
			p := filepath.Join(t.TempDir(), "x.yaml")
			if err := os.WriteFile(p, []byte(config1), 0o644); err != nil {
				t.Fatal(err)
			}
			tc.args[1] = p
		}
		err := run(context.Background(), tc.args, io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error holding %q", tc.args, err, tc.want)
		}
	}
	for v, want := range map[string]time.Duration{"off": 0, "on": defaultLease, "250ms": 250 * time.Millisecond} {
		if got, err := leaseTime(v); err != nil || got != want {
			t.Errorf("leaseTime(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
}

// TestCommandMergeDomains checks -merge-domains: two files of one domain
// are refused without it and served as one domain with it.
func TestCommandMergeDomains(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"a.yaml": config1,
		"b.yaml": "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := run(context.Background(), []string{"-config", dir, "-addr", "127.0.0.1:0"}, io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), `duplicate domain "d"`) {
		t.Fatalf("run without -merge-domains = %v, want a duplicate domain error", err)
	}
	addrs, stop := started(t, []string{"-config", dir, "-addr", "127.0.0.1:0", "-watch", "0", "-merge-domains"}, nil)
	conn, err := grpc.NewClient(addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for key, want := range map[string]uint32{"k": 1, "other": 2} {
		r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d",
			Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: key, Value: "v"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != want {
			t.Errorf("descriptor %s: limit %d a minute, want %d", key, got, want)
		}
	}
	if err := stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}
