package rls_test

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/rls"
)

// remainingConfig is one descriptor of 5 requests a minute.
const remainingConfig = `
domain: remaining
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// As floodgate-rls configures redisstore by default (batching and the
// deny cache), and with -lease on (openStore in cmd/floodgate-rls).
var (
	rlsRedisOpts = []redisstore.Option{redisstore.WithBatching(128), redisstore.WithDenyCache(65536)}
	rlsLeaseOpts = append([]redisstore.Option{redisstore.WithLeases(time.Second, keyed.DefaultCapacity)}, rlsRedisOpts...)
)

// remainingStores are the stores floodgate-rls serves from; each returns a
// store on clock whose buckets are shared by every store it returns with
// the same prefix p.
var remainingStores = []struct {
	name  string
	store func(t *testing.T, clock floodgate.Clock, p string) floodgate.Reserver
}{
	{"memory", func(t *testing.T, clock floodgate.Clock, _ string) floodgate.Reserver {
		m, err := keyed.New(keyed.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}},
	{"redis", func(t *testing.T, clock floodgate.Clock, p string) floodgate.Reserver {
		st, _ := sharedStore(t, clock, append([]redisstore.Option{redisstore.WithPrefix(p)}, rlsRedisOpts...)...)
		return st
	}},
	{"redis leases", func(t *testing.T, clock floodgate.Clock, p string) floodgate.Reserver {
		st, _ := sharedStore(t, clock, append([]redisstore.Option{redisstore.WithPrefix(p)}, rlsLeaseOpts...)...)
		t.Cleanup(func() { st.Close() })
		return st
	}},
}

// TestLimitRemaining: a fresh descriptor of 5 a minute answers
// limit_remaining 4, 3, 2, 1, 0 after 1 to 5 hits, then OVER_LIMIT with
// 0, as envoyproxy/ratelimit does, whatever the store, through a real
// client on loopback TCP. The clock stands still: nothing refills.
func TestLimitRemaining(t *testing.T) {
	type hit struct {
		Code      string
		Remaining uint32
		Reset     time.Duration
	}
	// A token comes back every 12 s: k tokens taken, full in 12k s.
	want := []hit{
		{"OK", 4, 12 * time.Second},
		{"OK", 3, 24 * time.Second},
		{"OK", 2, 36 * time.Second},
		{"OK", 1, 48 * time.Second},
		{"OK", 0, 60 * time.Second},
		{"OVER_LIMIT", 0, 60 * time.Second},
		{"OVER_LIMIT", 0, 60 * time.Second}, // a cached denial, on redis
	}
	for _, s := range remainingStores {
		t.Run(s.name, func(t *testing.T) {
			svc, err := rls.New(s.store(t, newFakeClock(), prefix(t)), mustParse(t, remainingConfig))
			if err != nil {
				t.Fatal(err)
			}
			c := serve(t, svc)
			var got []hit
			for range want {
				st := call(t, c, request("remaining", 0, desc("user", "alice"))).GetStatuses()[0]
				if l := st.GetCurrentLimit(); l.GetRequestsPerUnit() != 5 || l.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
					t.Errorf("current_limit = %v, want 5 a minute", l)
				}
				got = append(got, hit{st.GetCode().String(), st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration().Round(time.Millisecond)})
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("hits 1 to %d (-want +got):\n%s", len(want), diff)
			}
		})
	}
}

// TestLimitRemainingReplicas: two replicas with leases on, sharing one
// prefix on one redis-server, take turns on a descriptor. A replica
// reports the whole bucket as it last saw it, never a part: what Redis
// held at its last round trip (less what is leased out) plus its own
// lease, less what it took since. So it reports at most the burst less
// what both had admitted by its last round trip and what it admitted
// since (the clock standing still), and together they admit at most the
// burst. A lease is at most an eighth of the burst, so 5 a minute never
// leases; 16 a minute does.
func TestLimitRemainingReplicas(t *testing.T) {
	const config = remainingConfig + `  - key: heavy
    rate_limit: {unit: minute, requests_per_unit: 16}
`
	clock := newFakeClock()
	p := prefix(t)
	var clients [2]pb.RateLimitServiceClient
	var stores [2]*redisstore.Store
	for i := range clients {
		st, _ := sharedStore(t, clock, append([]redisstore.Option{redisstore.WithPrefix(p)}, rlsLeaseOpts...)...)
		t.Cleanup(func() { st.Close() })
		svc, err := rls.New(st, mustParse(t, config))
		if err != nil {
			t.Fatal(err)
		}
		stores[i], clients[i] = st, serve(t, svc)
	}
	leased := func() uint64 { return stores[0].Stats().Lease + stores[1].Stats().Lease }
	cases := []struct {
		name   string
		key    string
		burst  int
		turns  string // the replicas' turns, repeated: a or b
		leases bool   // whether some decisions must come from a lease
	}{
		{"5 a minute, alternating from a", "user", 5, "ab", false},
		{"5 a minute, alternating from b", "user", 5, "ba", false},
		{"5 a minute, a twice then b twice", "user", 5, "aabb", false},
		{"16 a minute, leased, alternating from a", "heavy", 16, "ab", true},
	}
	for k, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			value := fmt.Sprintf("v%d", k) // a fresh bucket
			before := leased()
			admitted := 0
			var seen, since [2]int // all admitted at each replica's last round trip; its own since
			var trace []string
			for i := range tc.burst + 3 {
				r := int(tc.turns[i%len(tc.turns)] - 'a')
				trips := stores[r].Stats().Redis
				st := call(t, clients[r], request("remaining", 0, desc(tc.key, value))).GetStatuses()[0]
				ok := st.GetCode() == pb.RateLimitResponse_OK
				if ok {
					admitted++
				}
				if stores[r].Stats().Redis != trips { // this hit went to Redis
					seen[r], since[r] = admitted, 0
				} else if ok {
					since[r]++
				}
				trace = append(trace, fmt.Sprintf("%c:%s/%d", 'a'+r, st.GetCode(), st.GetLimitRemaining()))
				if bound := tc.burst - min(seen[r]+since[r], tc.burst); int(st.GetLimitRemaining()) > bound {
					t.Errorf("hit %d on replica %c: limit_remaining = %d, want at most %d (burst %d less %d admitted by its last round trip and %d since)",
						i+1, 'a'+r, st.GetLimitRemaining(), bound, tc.burst, seen[r], since[r])
				}
			}
			if admitted > tc.burst {
				t.Errorf("the replicas admitted %d of %d hits, want at most %d", admitted, tc.burst+3, tc.burst)
			}
			if n := leased() - before; tc.leases && n == 0 {
				t.Errorf("no decision from a lease: the case checks nothing of leases")
			}
			t.Logf("hits (replica:code/limit_remaining) %v; %d decided from leases", trace, leased()-before)
		})
	}
}
