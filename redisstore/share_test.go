package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/floodgate-go/floodgate/remote"
)

// TestShare: members' grants on one key never sum above the limit; a
// member gets what it wants of what the others leave, sees what they
// published, gets more as they give theirs back, and loses its grant when
// its hold passes without a round.
func TestShare(t *testing.T) {
	clock := newFakeClock()
	c := newClient(t, sharedServer(t).Addr)
	s := newStore(t, c, redisstore.WithClientClock(clock))
	round := func(member string, want float64, hold time.Duration, demands ...float64) remote.ShareReply {
		t.Helper()
		r, err := s.Share(bg, "quota", remote.ShareRequest{Member: member, Limit: 100, Want: want, Hold: hold,
			Held: 1, Demands: demands})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	hold := 10 * time.Second
	if r := round("a", 70, hold, 30, 40); r.Granted != 70 || len(r.Others) != 0 {
		t.Errorf("first member: %+v, want 70 granted and no others", r)
	}
	r := round("b", 50, hold, 50)
	if r.Granted != 30 {
		t.Errorf("second member wanting 50 of the 30 left: granted %v", r.Granted)
	}
	if diff := cmp.Diff([]remote.ShareMember{{Granted: 70, Held: 1, Demands: []float64{30, 40}}}, r.Others); diff != "" {
		t.Errorf("the second member's view of the first (-want +got):\n%s", diff)
	}
	// a gives 20 back; b gets it on its next round.
	if r := round("a", 50, hold, 30, 20); r.Granted != 50 {
		t.Errorf("a lowering its want to 50: granted %v", r.Granted)
	}
	if r := round("b", 50, hold, 50); r.Granted != 50 {
		t.Errorf("b after a gave 20 back: granted %v, want 50", r.Granted)
	}
	// A third member finds nothing left.
	if r := round("c", 10, hold); r.Granted != 0 || len(r.Others) != 2 {
		t.Errorf("c with the limit taken: %+v, want 0 granted and 2 others", r)
	}
	// a stops; past its hold its 50 are free.
	clock.Advance(hold - time.Millisecond)
	round("b", 50, hold, 50)
	if r := round("c", 60, hold); r.Granted != 0 {
		t.Errorf("c before a's hold passed: granted %v, want 0", r.Granted)
	}
	clock.Advance(time.Millisecond)
	if r := round("c", 60, hold); r.Granted != 50 || len(r.Others) != 1 {
		t.Errorf("c once a's hold passed: %+v, want 50 granted and one other", r)
	}
	// Hold 0 gives a grant back at once.
	if r := round("c", 0, 0); r.Granted != 0 {
		t.Errorf("c giving back: granted %v, want 0", r.Granted)
	}
	if r := round("b", 100, hold, 50); r.Granted != 100 || len(r.Others) != 0 {
		t.Errorf("b alone: %+v, want 100 and no others", r)
	}
	// The hash expires with its last member.
	if ttl := c.PTTL(bg, s.Key("quota")).Val(); ttl <= 0 || ttl > hold {
		t.Errorf("the key's TTL is %v, want within (0, %v]", ttl, hold)
	}
}

// TestShareLimitChange: when the limit falls, a member's round gets only
// what the others leave under the new limit, and each member comes down to
// its want under it as it comes round.
func TestShareLimitChange(t *testing.T) {
	s := newStore(t, newClient(t, sharedServer(t).Addr))
	share := func(member string, limit, want float64) float64 {
		t.Helper()
		r, err := s.Share(bg, "q", remote.ShareRequest{Member: member, Limit: limit, Want: want, Hold: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return r.Granted
	}
	share("a", 100, 50)
	share("b", 100, 50)
	if g := share("a", 60, 30); g != 10 {
		t.Errorf("a under a limit of 60 with b holding 50: granted %v, want 10", g)
	}
	if g := share("b", 60, 30); g != 30 {
		t.Errorf("b coming down to 30: granted %v", g)
	}
	if g := share("a", 60, 30); g != 30 {
		t.Errorf("a's next round: granted %v, want 30", g)
	}
}

// TestShareConcurrent: members racing on one key, each asking for a random
// rate, never hold more than the limit together.
func TestShareConcurrent(t *testing.T) {
	c := newClient(t, sharedServer(t).Addr)
	s := newStore(t, c)
	const limit, members, rounds = 1000.0, 8, 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := map[string]float64{}
	worst := 0.0
	for m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprint("m", m)
			for range rounds {
				r, err := s.Share(bg, "race", remote.ShareRequest{Member: name, Limit: limit, Want: rand.Float64() * 400, Hold: time.Minute})
				if err != nil {
					t.Error(err)
					return
				}
				// The sum Redis let members hold just after this round:
				// this grant plus the others' as this round saw them.
				sum := r.Granted
				for _, o := range r.Others {
					sum += o.Granted
				}
				mu.Lock()
				held[name] = r.Granted
				worst = max(worst, sum)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if worst > limit*(1+1e-12) {
		t.Errorf("members held %v together at some round, over the limit %v", worst, limit)
	}
	if worst < limit/2 {
		t.Errorf("members never held more than %v of %v: the test shared nothing", worst, limit)
	}
}

// TestShareCluster: keys of a 3-master Cluster, each on the slot of its
// hash tag, with flushed script caches.
func TestShareCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	if err := c.ForEachMaster(bg, func(ctx context.Context, m *redis.Client) error { return m.ScriptFlush(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, c)
	nodes := map[string]bool{}
	for i := range 30 {
		key := fmt.Sprint("group", i)
		for _, m := range []string{"a", "b"} {
			r, err := s.Share(bg, key, remote.ShareRequest{Member: m, Limit: 10, Want: 6, Hold: time.Minute, Demands: []float64{6}})
			if err != nil {
				t.Fatal(err)
			}
			if want := map[string]float64{"a": 6, "b": 4}[m]; r.Granted != want {
				t.Errorf("%s: member %s granted %v, want %v", key, m, r.Granted, want)
			}
		}
		node, err := c.MasterForKey(bg, s.Key(key))
		if err != nil {
			t.Fatal(err)
		}
		nodes[node.Options().Addr] = true
	}
	if len(nodes) != 3 {
		t.Errorf("30 keys on %d masters, want 3", len(nodes))
	}
}

// TestShareErrors: a bad request is refused before any call, naming what is
// wrong; Redis down is ErrUnavailable.
func TestShareErrors(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, newClient(t, srv.Addr), redisstore.WithDeadline(50*time.Millisecond))
	ok := remote.ShareRequest{Member: "m", Limit: 1, Want: 1, Hold: time.Second}
	for _, tc := range []struct {
		key  string
		mod  func(*remote.ShareRequest)
		want string
	}{
		{"", func(*remote.ShareRequest) {}, "empty key"},
		{"k", func(r *remote.ShareRequest) { r.Member = "" }, "empty Member"},
		{"k", func(r *remote.ShareRequest) { r.Limit = math.NaN() }, "Limit NaN"},
		{"k", func(r *remote.ShareRequest) { r.Want = -1 }, "Want -1"},
		{"k", func(r *remote.ShareRequest) { r.Held = math.Inf(1) }, "Held +Inf"},
		{"k", func(r *remote.ShareRequest) { r.Claim = -1 }, "Claim -1"},
		{"k", func(r *remote.ShareRequest) { r.Hold = -time.Second }, "Hold -1s"},
		{"k", func(r *remote.ShareRequest) { r.Demands = []float64{1, -2} }, "Demands[1] -2"},
		{"k", func(r *remote.ShareRequest) { r.Demands = make([]float64, remote.MaxShareDemands+1) }, "65537 Demands"},
		{strings.Repeat("k", redisstore.MaxKeyLen+1), func(*remote.ShareRequest) {}, "more than"},
	} {
		req := ok
		tc.mod(&req)
		_, err := s.Share(bg, tc.key, req)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, redisstore.ErrUnavailable) {
			t.Errorf("Share(%.10q, %+v) = %v, want an error saying %q", tc.key, req.Member, err, tc.want)
		}
	}
	if _, err := s.Share(bg, "k", ok); err != nil {
		t.Fatalf("a good request: %v", err)
	}
	srv.Kill()
	ctx, cancel := context.WithTimeout(bg, time.Second)
	defer cancel()
	if _, err := s.Share(ctx, "k", ok); !errors.Is(err, redisstore.ErrUnavailable) {
		t.Errorf("Share with Redis down = %v, want ErrUnavailable", err)
	}
}

// TestShareDrainClaim: a draining member's grant stays held, and others
// claim it: what they claim leaves it and is room for their grants, never
// more than it holds, and a member that is not draining is never claimed
// from.
func TestShareDrainClaim(t *testing.T) {
	s := newStore(t, newClient(t, sharedServer(t).Addr))
	share := func(req remote.ShareRequest) remote.ShareReply {
		t.Helper()
		req.Limit, req.Hold = 100, time.Minute
		r, err := s.Share(bg, "d", req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	share(remote.ShareRequest{Member: "old", Want: 60})
	share(remote.ShareRequest{Member: "live", Want: 40})
	if r := share(remote.ShareRequest{Member: "new", Want: 30, Claim: 30}); r.Granted != 0 || r.Claimed != 0 {
		t.Errorf("claiming with no member draining: %+v, want nothing granted or claimed", r)
	}
	r := share(remote.ShareRequest{Member: "old", Want: 60, Draining: true})
	if r.Granted != 60 {
		t.Errorf("the draining round: granted %v, want its 60 kept", r.Granted)
	}
	r = share(remote.ShareRequest{Member: "new", Want: 30, Claim: 25})
	if r.Claimed != 25 || r.Granted != 25 {
		t.Errorf("claiming 25 of the draining 60: %+v, want 25 claimed and granted", r)
	}
	var old remote.ShareMember
	for _, o := range r.Others {
		if o.Draining {
			old = o
		}
	}
	if old.Granted != 35 {
		t.Errorf("the draining member after the claim: %+v, want 35 granted", old)
	}
	r = share(remote.ShareRequest{Member: "new", Want: 100, Claim: 80})
	if r.Claimed != 35 || r.Granted != 60 {
		t.Errorf("claiming 80 of the draining 35: %+v, want 35 claimed, 60 granted (the live member holds 40)", r)
	}
	r = share(remote.ShareRequest{Member: "live", Want: 40})
	for _, o := range r.Others {
		if o.Draining && o.Granted != 0 {
			t.Errorf("the drained member still holds %v", o.Granted)
		}
	}
	if r.Granted != 40 {
		t.Errorf("the live member: granted %v, want its 40, never claimed", r.Granted)
	}
}
