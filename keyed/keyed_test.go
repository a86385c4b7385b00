package keyed

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/vectors"
	"github.com/google/go-cmp/cmp"
)

// t0 is an arbitrary start for tests that pass explicit times.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newMap(t testing.TB, opts ...Option) *Map {
	t.Helper()
	m, err := New(append([]Option{WithClock(floodgate.ClockFunc(func() time.Time { return t0 }))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	m.base = t0 // times in tests are offsets from t0
	return m
}

// takeAt is m.TakeAt for takes that are valid, though they may exceed the
// burst: it reports any other error.
func takeAt(t testing.TB, m *Map, key string, lim floodgate.Limit, n int, at time.Time) floodgate.Result {
	t.Helper()
	res, err := m.TakeAt(key, lim, n, at)
	if err != nil && !errors.Is(err, floodgate.ErrExceedsBurst) {
		t.Errorf("TakeAt(%q, %v, %d) error = %v", key, lim, n, err)
	}
	return res
}

// TestSizes: the memory per key rests on 32-byte slots, and the shards'
// layout on 128-byte shards.
func TestSizes(t *testing.T) {
	if got, want := reflect.TypeFor[slot]().Size(), uintptr(32); got != want {
		t.Errorf("sizeof(slot) = %d, want %d (two slots per cache line)", got, want)
	}
	if got, want := reflect.TypeFor[shard]().Size(), uintptr(128); got != want {
		t.Errorf("sizeof(shard) = %d, want %d (two cache lines, no sharing)", got, want)
	}
}

// TestVectors runs the decisions every store must reproduce
// (testdata/vectors/bucket.json, shared with redisstore).
func TestVectors(t *testing.T) {
	cases, err := vectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			m := newMap(t)
			lim := c.Limit.Limit()
			for i, s := range c.Steps {
				if s.Limit != nil {
					lim = s.Limit.Limit()
				}
				got, err := m.TakeAt("k", lim, s.N, t0.Add(time.Duration(s.AtUS)*time.Microsecond))
				if wantErr := s.N > lim.Burst && lim.Burst > 0 && !lim.IsInf(); wantErr != errors.Is(err, floodgate.ErrExceedsBurst) || !wantErr && err != nil {
					t.Errorf("step %d: TakeAt(at %dus, n %d) error = %v, want ErrExceedsBurst: %v", i, s.AtUS, s.N, err, wantErr)
				}
				type view struct {
					Allowed                  bool
					Remaining                int
					RetryAfterUS, ResetAfter int64
				}
				g := view{got.Allowed, got.Remaining, vectors.Micros(got.RetryAfter), vectors.Micros(got.ResetAfter)}
				w := view{s.Allowed, s.Remaining, s.RetryAfterUS, s.ResetAfterUS}
				if diff := cmp.Diff(w, g); diff != "" {
					t.Errorf("step %d: TakeAt(at %dus, n %d) mismatch (-want +got):\n%s", i, s.AtUS, s.N, diff)
				}
			}
		})
	}
}

// TestTakeSteps walks buckets step by step, x/time/rate style: each step is
// a time offset, a key, n, and the expected decision.
func TestTakeSteps(t *testing.T) {
	type step struct {
		at      time.Duration
		key     string
		n       int
		allowed bool
		remain  int
	}
	cases := []struct {
		name  string
		lim   floodgate.Limit
		steps []step
	}{
		{"keys are independent", floodgate.PerSecond(1, 1), []step{
			{0, "a", 1, true, 0},
			{0, "a", 1, false, 0},
			{0, "b", 1, true, 0},
			{0, "", 1, true, 0}, // the empty key is a key
			{0, "", 1, false, 0},
			{time.Second, "a", 1, true, 0},
		}},
		{"every 100ms", floodgate.Every(100*time.Millisecond, 2), []step{
			{0, "k", 2, true, 0},
			{99 * time.Millisecond, "k", 1, false, 0},
			{100 * time.Millisecond, "k", 1, true, 0},
			{time.Hour, "k", 2, true, 0},
		}},
		{"inf allows all", floodgate.Inf, []step{
			{0, "k", 1 << 20, true, 0},
			{0, "k", 1 << 20, true, 0},
		}},
		{"scaled to a fifth", floodgate.PerSecond(100, 10).Scale(0.2), []step{
			{0, "k", 2, true, 0},
			{0, "k", 1, false, 0},
			{50 * time.Millisecond, "k", 1, true, 0},
		}},
		{"a scaled burst is at least one", floodgate.PerSecond(1, 2).Scale(0.1), []step{
			{0, "k", 1, true, 0},
			{time.Second, "k", 1, false, 0},
			{10 * time.Second, "k", 1, true, 0},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMap(t)
			for i, s := range c.steps {
				got := takeAt(t, m, s.key, c.lim, s.n, t0.Add(s.at))
				if got.Allowed != s.allowed || got.Remaining != s.remain && !c.lim.IsInf() {
					t.Errorf("step %d: TakeAt(%q, %v, %d, +%v) = allowed %v remaining %d, want %v %d",
						i, s.key, c.lim, s.n, s.at, got.Allowed, got.Remaining, s.allowed, s.remain)
				}
			}
		})
	}
}

func TestTakeNErrors(t *testing.T) {
	m := newMap(t)
	ctx := context.Background()
	for _, c := range []struct {
		lim  floodgate.Limit
		n    int
		want error
	}{
		{floodgate.PerSecond(1, 1), -1, floodgate.ErrNegativeN},
		{floodgate.PerSecond(math.NaN(), 1), 1, floodgate.ErrInvalidLimit},
		{floodgate.PerSecond(-1, 1), 1, floodgate.ErrInvalidLimit},
		{floodgate.PerSecond(1, -1), 1, floodgate.ErrInvalidLimit},
		{floodgate.PerSecond(1, floodgate.MaxBurst+1), 1, floodgate.ErrInvalidLimit},
		{floodgate.PerSecond(5, 0), 1, floodgate.ErrInvalidLimit}, // as Limit.Validate and redisstore say
		{floodgate.Limit{}, 1, nil},                               // the zero Limit: admits nothing, validly
	} {
		if _, err := m.TakeN(ctx, "k", c.lim, c.n); !errors.Is(err, c.want) {
			t.Errorf("TakeN(%v, %d) error = %v, want %v", c.lim, c.n, err, c.want)
		}
		if _, err := m.TakeAt("k", c.lim, c.n, t0); !errors.Is(err, c.want) {
			t.Errorf("TakeAt(%v, %d) error = %v, want %v", c.lim, c.n, err, c.want)
		}
	}
	if m.Len() != 0 {
		t.Errorf("Len() = %d after invalid takes, want 0", m.Len())
	}
}

// TestTakeNExceedsBurst: a take of more than a positive burst fails with
// ErrExceedsBurst and a refusal for good, taking nothing, from TakeN and
// TakeAt alike; the zero Limit refuses without an error (floodgate.Store's
// contract).
func TestTakeNExceedsBurst(t *testing.T) {
	m := newMap(t)
	ctx := context.Background()
	lim := floodgate.PerSecond(10, 5)
	if _, err := m.TakeN(ctx, "k", lim, 2); err != nil {
		t.Fatal(err)
	}
	res, err := m.TakeN(ctx, "k", lim, 6)
	if !errors.Is(err, floodgate.ErrExceedsBurst) || res.Allowed || res.RetryAfter != floodgate.Never || res.Remaining != 3 {
		t.Errorf("TakeN(n 6 > burst 5) = %+v, %v; want refused for good, 3 left, ErrExceedsBurst", res, err)
	}
	res, err = m.TakeAt("new", lim, 6, t0)
	if !errors.Is(err, floodgate.ErrExceedsBurst) || res.Allowed || res.RetryAfter != floodgate.Never || res.Remaining != 5 || m.Len() != 1 {
		t.Errorf("TakeAt(new key, n 6 > burst 5) = %+v, %v, Len %d; want refused for good, 5 left, ErrExceedsBurst, no bucket", res, err, m.Len())
	}
	res, err = m.TakeN(ctx, "zero", floodgate.Limit{}, 1)
	if err != nil || res.Allowed || res.RetryAfter != floodgate.Never {
		t.Errorf("TakeN(zero Limit, 1) = %+v, %v; want refused for good, no error", res, err)
	}
	if res, err := m.TakeN(ctx, "inf", floodgate.Inf, 1<<40); err != nil || !res.Allowed {
		t.Errorf("TakeN(Inf, 2^40) = %+v, %v; want allowed", res, err)
	}
}

func TestNewErrors(t *testing.T) {
	for _, c := range []struct {
		opt  Option
		name string // the option the error must name, with its value
	}{
		{WithCapacity(0), "WithCapacity(0)"},
		{WithCapacity(-5), "WithCapacity(-5)"},
		{WithShards(3), "WithShards(3)"},
		{WithShards(2048), "WithShards(2048)"},
		{WithShards(-2), "WithShards(-2)"},
		{WithPressure(Pressure(7)), "WithPressure(7)"},
	} {
		_, err := New(c.opt)
		if !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("New(%s) error = %v, want floodgate.ErrInvalidOption naming %s", c.name, err, c.name)
		}
	}
}

func TestPeekAndTokens(t *testing.T) {
	m := newMap(t)
	lim := floodgate.PerSecond(10, 10)
	if got, err := m.Peek(context.Background(), "k", lim); err != nil || !got.Allowed || got.Remaining != 10 {
		t.Errorf("Peek(untracked) = %+v, want a full bucket", got)
	}
	if m.Len() != 0 {
		t.Errorf("Peek created a bucket: Len() = %d", m.Len())
	}
	takeAt(t, m, "k", lim, 4, t0)
	if got, want := m.TokensAt("k", lim, t0.Add(50*time.Millisecond)), 6.5; got != want {
		t.Errorf("TokensAt(+50ms) = %v, want %v", got, want)
	}
	if got, _ := m.Peek(context.Background(), "k", lim); got.Remaining != 6 || got.ResetAfter != 400*time.Millisecond {
		t.Errorf("Peek = %+v, want remaining 6, reset 400ms", got)
	}
	if err := m.Reset(context.Background(), "k"); err != nil || m.Len() != 0 {
		t.Errorf("Reset = %v with Len() = %d after, want nil and 0", err, m.Len())
	}
	if err := m.Reset(context.Background(), "k"); err != nil {
		t.Errorf("Reset(untracked) = %v, want nil", err)
	}
	if _, err := m.Peek(context.Background(), "k", floodgate.Limit{Rate: -1, Burst: 1}); !errors.Is(err, floodgate.ErrInvalidLimit) {
		t.Errorf("Peek(invalid limit) error = %v, want ErrInvalidLimit", err)
	}
	if got := m.TokensAt("k", lim, t0); got != 10 {
		t.Errorf("TokensAt after Reset = %v, want 10", got)
	}
}

func TestZeroAllocs(t *testing.T) {
	m, err := New(WithCapacity(1000))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim := floodgate.PerSecond(1e9, 1e6)
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = "client-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		m.TakeN(ctx, keys[i], lim, 1)
	}
	i := 0
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"TakeN on an existing key", func() { m.TakeN(ctx, keys[i%len(keys)], lim, 1) }},
		{"Peek", func() { m.Peek(ctx, keys[i%len(keys)], lim) }},
		{"TakeN above the burst on a new key", func() { m.TakeN(ctx, "new", lim, 2e6) }},
	} {
		if allocs := testing.AllocsPerRun(1000, func() { c.f(); i++ }); allocs != 0 {
			t.Errorf("%s: %v allocs/op, want 0", c.name, allocs)
		}
	}
}

// TestInfKeepsNoState: takes under Inf are allowed and create no bucket.
func TestInfKeepsNoState(t *testing.T) {
	m := newMap(t)
	for _, n := range []int{1, 0, 1 << 40} {
		if res, err := m.TakeN(context.Background(), "k", floodgate.Inf, n); err != nil || !res.Allowed {
			t.Errorf("TakeN(Inf, %d) = %+v, %v; want allowed", n, res, err)
		}
	}
	if m.Len() != 0 {
		t.Errorf("Len() = %d, want 0: Inf keeps no state", m.Len())
	}
}
