package keyed

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/google/go-cmp/cmp"
)

// TestCapacityBound: ten times the capacity in distinct keys never holds
// more than the capacity.
func TestCapacityBound(t *testing.T) {
	for _, p := range []Pressure{Protect, Evict} {
		m := newMap(t, WithCapacity(1000), WithShards(8), WithPressure(p))
		lim := floodgate.PerSecond(1000, 10)
		for i := 0; i < 10_000; i++ {
			// Each key drains a little, then time passes: half the old
			// buckets are full again when new keys arrive.
			takeAt(t, m, strconv.Itoa(i), lim, 1, t0.Add(time.Duration(i)*100*time.Microsecond))
			if n := m.Len(); n > 1000 {
				t.Fatalf("pressure %d: Len() = %d after %d keys, want ≤ 1000", p, n, i+1)
			}
		}
		if n := m.Len(); n != 1000 {
			t.Errorf("pressure %d: Len() = %d, want 1000 (a full map stays full)", p, n)
		}
		if st := m.Stats(); st.Evictions == 0 {
			t.Errorf("pressure %d: no evictions after 10× capacity: %+v", p, st)
		}
	}
}

// keysInShard returns n keys that m places in shard 0.
func keysInShard(m *Map, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := "k" + strconv.Itoa(i)
		if s, _ := m.hash(k); s == &m.shards[0] {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestUnevenShards: a total capacity of N holds N keys even when they all
// land in one shard.
func TestUnevenShards(t *testing.T) {
	m := newMap(t, WithCapacity(256), WithShards(16))
	lim := floodgate.PerSecond(1, 5)
	keys := keysInShard(m, 256)
	for _, k := range keys {
		takeAt(t, m, k, lim, 1, t0)
	}
	if got := m.Len(); got != 256 {
		t.Fatalf("Len() = %d, want 256", got)
	}
	for _, k := range keys {
		if got := m.TokensAt(k, lim, t0); got != 4 {
			t.Fatalf("TokensAt(%s) = %v, want 4: the bucket was lost", k, got)
		}
	}
	if st := m.Stats(); st.Evictions+st.Overflowed != 0 {
		t.Errorf("Stats = %+v, want no evictions and no overflow", st)
	}
}

// TestFloodProtectsActiveKeys: a client that drained its bucket cannot get
// a fresh burst by making the Map forget it with made-up keys.
func TestFloodProtectsActiveKeys(t *testing.T) {
	m := newMap(t, WithCapacity(100), WithShards(4))
	lim := floodgate.PerSecond(1, 10) // slow refill: drained buckets stay drained
	if r := takeAt(t, m, "victim", lim, 10, t0); !r.Allowed {
		t.Fatal("drain rejected")
	}
	for i := 0; i < 10_000; i++ {
		at := t0.Add(time.Duration(i) * time.Millisecond) // 10 s in all
		takeAt(t, m, "made-up-"+strconv.Itoa(i), lim, 1, at)
	}
	at := t0.Add(5 * time.Second)
	if got := m.TokensAt("victim", lim, at); got != 5 {
		t.Errorf("victim's tokens after the flood = %v, want 5 (no amnesty)", got)
	}
	st := m.Stats()
	if st.EvictedNotFull != 0 {
		t.Errorf("EvictedNotFull = %d under Protect, want 0", st.EvictedNotFull)
	}
	if st.Overflowed == 0 {
		t.Errorf("Overflowed = 0, want the flood counted: %+v", st)
	}
	if m.Len() > 100 {
		t.Errorf("Len() = %d, want ≤ 100", m.Len())
	}
}

// TestOverflowIsShared: new keys that find no room share their shard's
// overflow bucket, so cycling made-up keys buys no extra admissions.
func TestOverflowIsShared(t *testing.T) {
	m := newMap(t, WithCapacity(1), WithShards(1))
	lim := floodgate.PerSecond(1, 3)
	takeAt(t, m, "resident", lim, 1, t0) // not full: protected
	admitted := 0
	for i := 0; i < 100; i++ {
		if takeAt(t, m, "new-"+strconv.Itoa(i), lim, 1, t0).Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("admitted %d of 100 overflow takes, want the overflow burst of 3", admitted)
	}
}

// TestEvictAccounting checks the counters and the callback under Evict.
func TestEvictAccounting(t *testing.T) {
	var got []Eviction
	m := newMap(t, WithCapacity(2), WithShards(1), WithPressure(Evict),
		WithOnEvict(func(e Eviction) { got = append(got, e) }))
	lim := floodgate.PerSecond(1, 2)
	takeAt(t, m, "a", lim, 1, t0)                  // a: 1 token, full at +1s
	takeAt(t, m, "b", lim, 2, t0)                  // b: 0 tokens, full at +2s
	takeAt(t, m, "c", lim, 1, t0.Add(time.Second)) // a is full again: evicted harmlessly
	takeAt(t, m, "d", lim, 1, t0.Add(time.Second)) // b and c not full: one must go
	_, a := m.hash("a")
	want := []Eviction{{Hash: a, Full: true}}
	if len(got) < 1 || !cmp.Equal(got[0], want[0]) {
		t.Fatalf("first eviction = %+v, want %+v", got, want)
	}
	if len(got) != 2 || got[1].Full {
		t.Fatalf("evictions = %+v, want a second, not-full eviction", got)
	}
	// b and c are both full again at +2s, so either is the victim.
	st := m.Stats()
	if diff := cmp.Diff(Stats{Evictions: 2, EvictedNotFull: 1}, st); diff != "" {
		t.Errorf("Stats mismatch (-want +got):\n%s", diff)
	}
	if m.Len() != 2 {
		t.Errorf("Len() = %d, want 2", m.Len())
	}
}

// tracks reports whether m holds a bucket for key, leaving its reference bit
// as it was.
func tracks(m *Map, key string) bool {
	s, k := m.hash(key)
	b, _, _ := m.lock(s, k, false, floodgate.Limit{}, 0)
	if b.st != nil {
		b.unlock()
	}
	return b.st != nil
}

// TestEvictPrefersIdle: under pressure, a full bucket not used since the
// last scan goes before a full bucket in use.
func TestEvictPrefersIdle(t *testing.T) {
	m := newMap(t, WithCapacity(3), WithShards(1))
	lim := floodgate.PerSecond(100, 1)
	for _, k := range []string{"x", "y", "z"} {
		takeAt(t, m, k, lim, 1, t0)
	}
	at := t0.Add(time.Second) // all full again
	takeAt(t, m, "new1", lim, 1, at)
	// The scan cleared every reference bit and evicted one; now touch two
	// of the remaining residents and add a key: the untouched one goes.
	var resident []string
	for _, k := range []string{"x", "y", "z"} {
		if tracks(m, k) {
			resident = append(resident, k)
		}
	}
	if len(resident) != 2 {
		t.Fatalf("residents after one eviction = %v, want 2", resident)
	}
	at = at.Add(time.Second)
	takeAt(t, m, resident[0], lim, 1, at.Add(-500*time.Millisecond)) // used, full again by at
	takeAt(t, m, "new1", lim, 1, at.Add(-500*time.Millisecond))
	takeAt(t, m, "new2", lim, 1, at)
	if tracks(m, resident[1]) {
		t.Errorf("idle %q survived while a used bucket was evicted", resident[1])
	}
}

// TestLenNeverExceedsCapacity: while new keys race into a full Map, Len
// never reports more keys than the capacity.
func TestLenNeverExceedsCapacity(t *testing.T) {
	const capacity = 64
	m := newMap(t, WithCapacity(capacity), WithShards(16))
	lim := floodgate.PerSecond(0.001, 1)
	for i := 0; m.Len() < capacity; i++ {
		takeAt(t, m, "fill"+strconv.Itoa(i), lim, 1, t0) // drained: protected
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				takeAt(t, m, "new"+strconv.Itoa(g)+"-"+strconv.Itoa(i), lim, 1, t0)
			}
		})
	}
	most := 0
	for range 1_000_000 {
		most = max(most, m.Len())
	}
	stop.Store(true)
	wg.Wait()
	if most > capacity {
		t.Errorf("Len() reported %d, capacity %d", most, capacity)
	}
}

// TestFarTimes: times further from the Map's base than an int64 of
// nanoseconds spans (time.Time{} is two thousand years back) must not
// break a bucket.
func TestFarTimes(t *testing.T) {
	m := newMap(t)
	lim := floodgate.PerSecond(10, 5)
	takeAt(t, m, "k", lim, 5, time.Time{})
	if res := takeAt(t, m, "k", lim, 1, t0); !res.Allowed || res.Remaining != 4 {
		t.Errorf("take today on a bucket drained in year 1 = %+v, want allowed with 4 left", res)
	}
	far := t0.AddDate(500, 0, 0)
	if res := takeAt(t, m, "k", lim, 5, far); !res.Allowed {
		t.Errorf("take in 500 years = %+v, want allowed", res)
	}
}

// TestEvictFromOtherShards: a new key whose shard holds less than its share
// of the capacity makes room in another shard, under either policy, and
// still never evicts a bucket that is not full under Protect.
func TestEvictFromOtherShards(t *testing.T) {
	otherShard := func(m *Map, of string, n int) []string {
		home, _ := m.hash(of)
		var keys []string
		for i := 0; len(keys) < n; i++ {
			k := "b" + strconv.Itoa(i)
			if s, _ := m.hash(k); s != home {
				keys = append(keys, k)
			}
		}
		return keys
	}
	lim := floodgate.PerSecond(1, 1)
	later := t0.Add(time.Hour)
	for _, p := range []Pressure{Protect, Evict} {
		m := newMap(t, WithCapacity(1), WithShards(2), WithPressure(p))
		takeAt(t, m, "a", lim, 1, t0) // full again by later
		b := otherShard(m, "a", 1)[0]
		takeAt(t, m, b, lim, 1, later)
		if res := takeAt(t, m, b, lim, 1, later); res.Allowed || !tracks(m, b) || tracks(m, "a") {
			t.Errorf("%v: a new key beside a full bucket in another shard: tracked %v, second take %+v; want its own bucket, drained",
				p, tracks(m, b), res)
		}
		if st := m.Stats(); st.Overflowed != 0 || st.Evictions != 1 || m.Len() != 1 {
			t.Errorf("%v: Stats = %+v, Len %d; want one eviction, no overflow", p, st, m.Len())
		}
	}
	// Under Protect a drained bucket stays, wherever the new key falls.
	m := newMap(t, WithCapacity(1), WithShards(2))
	takeAt(t, m, "a", lim, 1, t0)
	for _, b := range otherShard(m, "a", 3) {
		takeAt(t, m, b, lim, 1, t0)
	}
	if !tracks(m, "a") {
		t.Error("Protect evicted a drained bucket from another shard")
	}
}
