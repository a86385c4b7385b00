package redisstore_test

import (
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/redistest"
	"github.com/floodgate-go/floodgate/redisstore"
)

// TestInstancesCounted: stores with one prefix and name count each other on
// Redis (others do not count), the Local fallback divides the limit by that
// count (or by WithLocalDivisor when larger), and the count holds through a
// Redis restart that loses it.
func TestInstancesCounted(t *testing.T) {
	t.Cleanup(redisstore.SetInstancePeriod(20 * time.Millisecond))
	srv := redistest.Start(t)
	pfx := prefix(t)
	var stores []*redisstore.Store
	var rec recorder // the first store's observer
	for i := range 3 {
		opts := []redisstore.Option{redisstore.WithPrefix(pfx), redisstore.WithDeadline(300 * time.Millisecond), redisstore.WithBreaker(1, time.Minute)}
		if i == 0 {
			opts = append(opts, redisstore.WithObserver(&rec))
		}
		s, err := redisstore.New(newClient(t, srv.Addr), opts...)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	other, err := redisstore.New(newClient(t, srv.Addr), redisstore.WithPrefix(pfx), redisstore.WithName("other"),
		redisstore.WithDeadline(300*time.Millisecond), redisstore.WithBreaker(1, time.Minute), redisstore.WithLocalDivisor(5))
	if err != nil {
		t.Fatal(err)
	}
	lim := floodgate.PerSecond(60, 60)
	if st := stores[0].Stats(); st.Instances != 0 {
		t.Errorf("Stats().Instances before any call = %d, want 0", st.Instances)
	}
	all := append(stores[:len(stores):len(stores)], other)
	for end := time.Now().Add(5 * time.Second); ; {
		done := true
		for i, s := range all {
			if res, err := s.TakeN(bg, "k", lim, 1); err != nil || res.Source != floodgate.SourceRedis {
				t.Fatalf("TakeN = %+v, %v", res, err)
			}
			n := s.Stats().Instances
			done = done && (n == 3 || i == len(stores) && n == 1)
		}
		if done {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the stores did not count each other within 5s: %+v, %+v", stores[0].Stats(), other.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, s := range stores {
		if got := s.Stats().Instances; got != 3 {
			t.Errorf("store %d counts %d instances, want 3", i, got)
		}
	}
	if got := other.Stats().Instances; got != 1 {
		t.Errorf("the store with another name counts %d instances, want 1", got)
	}
	// The observer saw the counts, ending at the Stats' 3.
	rec.mu.Lock()
	if n := len(rec.instances); n == 0 || rec.instances[n-1] != 3 {
		t.Errorf("ObserveInstances got %v, want counts ending at 3", rec.instances)
	}
	rec.mu.Unlock()

	// Redis restarts empty: the first count after it is 1, but the
	// divisor holds at 3 until that count is instanceTTL old.
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		stores[0].TakeN(bg, "k", lim, 1)
		time.Sleep(5 * time.Millisecond)
	}
	if got := stores[0].Stats().Instances; got != 3 {
		t.Errorf("after a restart of Redis the store counts %d instances, want still 3", got)
	}

	// With Redis gone, the Local fallback takes a third of the limit; the
	// store with another name, which counted itself only, its divisor.
	srv.Kill()
	for _, tc := range []struct {
		s    *redisstore.Store
		want floodgate.Limit
	}{{stores[0], lim.Scale(1.0 / 3)}, {other, lim.Scale(1.0 / 5)}} {
		var res floodgate.Result
		for range 2 { // the first fails, the second finds the breaker open
			res, _ = tc.s.TakeN(bg, "k", lim, 1)
		}
		if res.Source != floodgate.SourceFallback || res.Limit != tc.want {
			t.Errorf("TakeN with Redis gone = %+v, want decided by the fallback under %v", res, tc.want)
		}
	}
}
