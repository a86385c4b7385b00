package rls_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/rls"
)

// TestShareThreshold: values matching a share_threshold wildcard share one
// bucket; without it each value has its own.
func TestShareThreshold(t *testing.T) {
	_, c, _ := memoryService(t, `
domain: d
descriptors:
  - key: shared
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: own
    value: files/*
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	var got []string
	for _, v := range []string{"files/a", "files/b", "files/c"} {
		got = append(got, call(t, c, request("d", 0, desc("shared", v))).GetOverallCode().String(),
			call(t, c, request("d", 0, desc("own", v))).GetOverallCode().String())
	}
	want := []string{"OK", "OK", "OK", "OK", "OVER_LIMIT", "OK"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("codes (-want +got):\n%s", diff)
	}
}

// TestLimitOverride: a descriptor that carries its own limit is limited by
// it, whatever the config says.
func TestLimitOverride(t *testing.T) {
	_, c, _ := memoryService(t, compatConfig)
	d := desc("big", "o")
	d.Limit = &rlpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typepb.RateLimitUnit_HOUR}
	want := []outcome{{"OK", []string{"OK"}, []uint32{1}}, {"OK", []string{"OK"}, []uint32{0}}, {"OVER_LIMIT", []string{"OVER_LIMIT"}, []uint32{0}}}
	for i, w := range want {
		r := call(t, c, request("test-domain", 0, d))
		if diff := cmp.Diff(w, outcomeOf(r)); diff != "" {
			t.Errorf("call %d (-want +got):\n%s", i, diff)
		}
		if got := r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 2 {
			t.Errorf("call %d: current_limit %d, want the override's 2", i, got)
		}
	}
}

// TestReservationsExpire: a reservation the service no longer holds is
// not settled; the second call is taken as a first.
func TestReservationsExpire(t *testing.T) {
	clock := newFakeClock()
	m, err := keyed.New(keyed.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rls.New(m, mustParse(t, compatConfig), rls.WithClock(clock), rls.WithReservations(1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, svc)
	d := func(id string, hits uint64) *rlpbDescriptor {
		return withHits(desc("big", "e", rls.ReservationKey, id), hits)
	}
	steps := []struct {
		name    string
		d       *rlpbDescriptor
		advance time.Duration
		want    uint32
	}{
		{"reserve a", d("a", 4), 0, 6},
		{"reserve b pushes a out", d("b", 1), 0, 5},
		{"a is charged anew", d("a", 1), 0, 4},
		{"b is gone too: the table holds one", d("b", 0), 0, 4},
		{"reserve c", d("c", 2), 0, 2},
		{"c expires", d("c", 0), 2 * time.Minute, 2 + 10}, // the clock refilled the bucket; c is a new take of 0
	}
	for _, s := range steps {
		clock.Advance(s.advance)
		r := call(t, c, request("test-domain", 0, s.d))
		if got := r.GetStatuses()[0].GetLimitRemaining(); got != min(s.want, 10) {
			t.Errorf("%s: remaining %d, want %d", s.name, got, min(s.want, 10))
		}
	}
}

// TestWatch: a change to the file is loaded; a broken one is reported and
// leaves the config in force.
func TestWatch(t *testing.T) {
	p := writeConfig(t, "", "rl.yaml", "domain: a\n")
	m, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	type load struct {
		domains []string
		failed  bool
	}
	loads := make(chan load, 16)
	svc, err := rls.New(m, nil, rls.WithOnReload(func(_ string, cfg *rls.Config, err error) {
		if err != nil {
			loads <- load{failed: true}
			return
		}
		loads <- load{domains: cfg.Domains()}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Load(p); err != nil {
		t.Fatal(err)
	}
	<-loads
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- svc.Watch(ctx, p, time.Millisecond) }()
	defer func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	}()
	writeConfig(t, filepath.Dir(p), "rl.yaml", "domain: bb\n")
	if got := <-loads; !cmp.Equal(got.domains, []string{"bb"}) {
		t.Errorf("after the first change: %+v, want domain bb", got)
	}
	writeConfig(t, filepath.Dir(p), "rl.yaml", "domain: [broken\n")
	if got := <-loads; !got.failed {
		t.Errorf("after a broken change: %+v, want a failed load", got)
	}
	if got := svc.Config().Domains(); !cmp.Equal(got, []string{"bb"}) {
		t.Errorf("after a broken change the domains are %v, want [bb]", got)
	}
}

// TestLeasesAllOrNothing: with leases on, a refused request gives back the
// leased tokens it took, on Redis: what the bucket and the replica's lease
// hold together is what it was.
func TestLeasesAllOrNothing(t *testing.T) {
	st, _, cl := sharedService(t, hotCold, redisstore.WithLeases(time.Second, 16))
	// Two decisions make the key hot: the second leases rate × 1 s more.
	call(t, cl, request("d", 0, desc("hot", "k")))
	call(t, cl, request("d", 0, desc("hot", "k")))
	before := st.Stats().Lease
	call(t, cl, request("d", 0, desc("hot", "k"))) // from the lease
	if st.Stats().Lease == before {
		t.Fatalf("no decision from a lease: %+v", st.Stats())
	}
	call(t, cl, request("d", 0, desc("cold", "k")))
	// The hot take comes from the lease, the cold one refuses: the hot
	// token goes back to the shared bucket.
	shared, leased := hotRemaining(t, st), st.Stats().Lease
	if got := call(t, cl, request("d", 0, desc("hot", "k"), desc("cold", "k"))).GetOverallCode().String(); got != "OVER_LIMIT" {
		t.Fatalf("hot and cold: %s, want OVER_LIMIT", got)
	}
	if st.Stats().Lease != leased+1 {
		t.Fatalf("the hot take was not from the lease: %+v", st.Stats())
	}
	if got := hotRemaining(t, st); got != shared {
		t.Errorf("the bucket and the lease hold %d after the refusal, want %d: the leased token given back", got, shared)
	}
}

// TestDenyCacheTakesNothing: on a batched store with a deny cache, a
// request that one descriptor's cached denial refuses takes nothing from
// the others, and reports their buckets as they are.
func TestDenyCacheTakesNothing(t *testing.T) {
	st, c, cl := sharedService(t, hotCold, redisstore.WithBatching(16), redisstore.WithDenyCache(16))
	call(t, cl, request("d", 0, desc("cold", "k")))
	if got := call(t, cl, request("d", 0, desc("cold", "k"))).GetOverallCode().String(); got != "OVER_LIMIT" {
		t.Fatalf("cold twice: %s, want OVER_LIMIT", got)
	}
	before, cached := hotRemaining(t, st), st.Stats().Cache
	scripts := scriptCalls(t, c)
	resp := call(t, cl, request("d", 0, desc("hot", "k"), desc("cold", "k")))
	// One script call, the peek of the hot bucket: no take to give back.
	if n := scriptCalls(t, c) - scripts; n != 1 {
		t.Errorf("the refused request made %d script calls, want 1 (a peek)", n)
	}
	if got := outcomeOf(resp); got.Overall != "OVER_LIMIT" || got.Codes[0] != "OK" || got.Codes[1] != "OVER_LIMIT" || got.Remaining[0] != 100 {
		t.Errorf("hot and cold: %+v, want OVER_LIMIT with hot OK at 100 left and cold OVER_LIMIT", got)
	}
	if st.Stats().Cache == cached {
		t.Errorf("the cold descriptor was not refused from the deny cache: %+v", st.Stats())
	}
	if got := hotRemaining(t, st); got != before {
		t.Errorf("the hot bucket holds %d after the refusal, want %d: nothing taken", got, before)
	}
}

// TestDenyCacheRequests: on a batched store with a deny cache, a request
// refused from the cache reports the first descriptor that refuses, and a
// request carrying a refund still applies it.
func TestDenyCacheRequests(t *testing.T) {
	// A cache of one: b's denial pushes a's out.
	st, _, cl := sharedService(t, hotCold, redisstore.WithBatching(16), redisstore.WithDenyCache(1))
	for _, v := range []string{"a", "b"} {
		call(t, cl, request("d", 0, desc("cold", v)))
		call(t, cl, request("d", 0, desc("cold", v))) // refused by Redis, cached
	}
	got := outcomeOf(call(t, cl, request("d", 0, desc("cold", "a"), desc("cold", "b"))))
	if want := (outcome{"OVER_LIMIT", []string{"OVER_LIMIT", "OVER_LIMIT"}, []uint32{0, 0}}); !cmp.Equal(got, want) {
		t.Errorf("two empty buckets, the second cached: %+v, want %+v", got, want)
	}

	call(t, cl, request("d", 5, desc("hot", "k")))
	before := hotRemaining(t, st)
	resp := call(t, cl, &pb.RateLimitRequest{Domain: "d", HitsAddend: 3,
		Descriptors: []*rlpbDescriptor{negative(desc("hot", "k")), withHits(desc("cold", "b"), 1)}})
	if resp.GetOverallCode().String() != "OVER_LIMIT" {
		t.Errorf("a refund beside a cached denial: %s, want OVER_LIMIT", resp.GetOverallCode())
	}
	if got := hotRemaining(t, st); got != before+3 {
		t.Errorf("the hot bucket holds %d after a refund of 3, want %d", got, before+3)
	}
}

// scriptCalls returns the script calls (EVALSHA and EVAL) Redis has run.
func scriptCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(bg, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		v, _, _ := strings.Cut(rest, ",")
		k, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += k
	}
	return n
}

// TestBatchedRequestSharesRoundTrips: on a batched store, a request's
// descriptors are decided at once and share round trips, where one at a
// time they would take one each.
func TestBatchedRequestSharesRoundTrips(t *testing.T) {
	_, c, cl := sharedService(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 100}
`, redisstore.WithBatching(16))
	req := request("d", 0, desc("a", "k"), desc("b", "k"), desc("c", "k"))
	call(t, cl, req) // loads the script
	for range 5 {
		before := scriptCalls(t, c)
		if got := call(t, cl, req).GetOverallCode().String(); got != "OK" {
			t.Fatalf("three descriptors under their limits: %s", got)
		}
		// The first decision leads its batch after the others are
		// queued; on a loaded machine one may miss it and go next.
		if n := scriptCalls(t, c) - before; n > 2 {
			t.Errorf("a request of three descriptors made %d script calls, want at most 2", n)
		}
	}
}

// hotCold is the config of the tests of one hot and one cold descriptor.
const hotCold = `
domain: d
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: cold
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// hotRemaining returns the tokens left in hotCold's bucket hot=k.
func hotRemaining(t *testing.T, st *redisstore.Store) int {
	t.Helper()
	// The service's key of the bucket of domain d, entry hot=k.
	r, err := st.Peek(bg, "1:d|3:hot=1:k", floodgate.PerSecond(100, 100))
	if err != nil {
		t.Fatal(err)
	}
	return r.Remaining
}
