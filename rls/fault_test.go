package rls_test

import (
	"context"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/rls"
)

// recoveryTimeout bounds how long after Redis answers again the service
// may take to decide on Redis before the test fails: far more than the
// breaker's cooldown (500 ms), so that only a service that does not
// recover fails. The time it took is logged; the package doc of
// redisstore says what bounds it.
const recoveryTimeout = 10 * time.Second

// storeDeadline is the store's deadline per decision: ten times its
// default, so that on two shared cores under the race detector a decision
// with Redis healthy is Redis's, and a fallback means Redis is away.
const storeDeadline = 500 * time.Millisecond

// callDeadline is each call's deadline: four times the store's, so that a
// call that misses it waited on a dead Redis rather than on a busy
// machine.
const callDeadline = 4 * storeDeadline

// TestRedisKilledAndRestarted kills Redis mid-run and starts it again,
// with the store's breaker defaults (5 failures, 500 ms): no call waits past its deadline, every decision of the outage
// is counted as a fallback and follows its domain's policy, and once Redis
// answers again decisions return to it.
// On a Cluster every master is killed and restarted.
func TestRedisKilledAndRestarted(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		skipWithoutRedis(t)
		srv := redistest.Start(t)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { client.Close() })
		killAndRestart(t, client, srv.Kill, srv.Restart)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { client.Close() })
		kill := func() {
			for _, s := range c.Servers {
				s.Kill()
			}
		}
		restart := func() error {
			last := len(c.Servers) - 1
			for _, s := range c.Servers[:last] {
				if err := s.Restart(); err != nil {
					return err
				}
			}
			return c.Restart(c.Servers[last]) // waits until the cluster serves every slot
		}
		killAndRestart(t, client, kill, restart)
	})
}

func killAndRestart(t *testing.T, client redis.UniversalClient, kill func(), restart func() error) {
	store, err := redisstore.New(client, redisstore.WithPrefix(prefix(t)), redisstore.WithBatching(16),
		redisstore.WithDeadline(storeDeadline))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	const limit = "    rate_limit: {unit: second, requests_per_unit: 100000}\n"
	cfg := mustParseDir(t, map[string]string{
		"open.yaml":   "domain: open\nfailure_policy: open\ndescriptors:\n  - key: k\n" + limit,
		"closed.yaml": "domain: closed\nfailure_policy: closed\ndescriptors:\n  - key: k\n" + limit,
		"local.yaml":  "domain: local\ndescriptors:\n  - key: k\n" + limit,
	})
	svc, err := rls.New(store, cfg, rls.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, svc)
	domains := []string{"open", "closed", "local"}
	decide := func(domain string) (pb.RateLimitResponse_Code, error) {
		ctx, cancel := context.WithTimeout(bg, callDeadline)
		defer cancel()
		r, err := c.ShouldRateLimit(ctx, request(domain, 0, desc("k", "v")))
		return r.GetOverallCode(), err
	}
	fallbacks := func() map[string]float64 {
		got := gather(t, reg)
		out := map[string]float64{}
		for _, d := range domains {
			// Each domain is named after its policy.
			out[d] = got["floodgate_rls_store_fallback_total{domain="+d+",policy="+d+"}"]
		}
		return out
	}

	for range 20 {
		for _, d := range domains {
			if code, err := decide(d); err != nil || code != pb.RateLimitResponse_OK {
				t.Fatalf("before the fault, domain %s: %v, %v", d, code, err)
			}
		}
	}
	if got := fallbacks(); got["open"]+got["closed"]+got["local"] != 0 {
		t.Fatalf("fallbacks before the fault: %v", got)
	}

	kill()
	const outage = 100
	want := map[string]pb.RateLimitResponse_Code{"open": pb.RateLimitResponse_OK,
		"closed": pb.RateLimitResponse_OVER_LIMIT, "local": pb.RateLimitResponse_OK}
	for i := range outage {
		for _, d := range domains {
			code, err := decide(d)
			if err != nil {
				t.Fatalf("during the outage, call %d of domain %s: %v (%v)", i, d, err, status.Code(err))
			}
			// The local fallback starts empty when Redis goes away and
			// refills at the limit (100,000/s here): its first call may
			// find nothing yet.
			if code != want[d] && !(d == "local" && i == 0) {
				t.Errorf("during the outage, call %d of domain %s: %v, want %v", i, d, code, want[d])
			}
		}
	}
	got := fallbacks()
	for _, d := range domains {
		if got[d] != outage {
			t.Errorf("fallbacks of domain %s during the outage: %v, want %d (every decision)", d, got[d], outage)
		}
	}

	if err := restart(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	calls := 0
	for {
		// The closed domain refuses while the store cannot decide, so its
		// first OK is Redis's.
		code, err := decide("closed")
		if err != nil {
			t.Fatalf("after the restart: %v", err)
		}
		calls++
		if code == pb.RateLimitResponse_OK {
			break
		}
		if time.Since(start) > recoveryTimeout {
			t.Fatalf("no decision by Redis %v after it answered again (%d calls)", recoveryTimeout, calls)
		}
	}
	t.Logf("Redis decided again %v after it answered again, at call %d", time.Since(start), calls)
	before := fallbacks()
	for range 20 {
		for _, d := range domains {
			if code, err := decide(d); err != nil || code != pb.RateLimitResponse_OK {
				t.Errorf("after recovery, domain %s: %v, %v", d, code, err)
			}
		}
	}
	if after := fallbacks(); after["open"] != before["open"] || after["closed"] != before["closed"] || after["local"] != before["local"] {
		t.Errorf("fallbacks after recovery: %v, then %v; want no more", before, after)
	}
	if s := store.Stats(); s.Redis == 0 || s.Trips == 0 {
		t.Errorf("store stats %+v: want decisions by Redis and a breaker trip", s)
	}
}
