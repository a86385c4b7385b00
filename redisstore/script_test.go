package redisstore_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/vectors"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/redisstore"
)

func closeUS(got, want int64) bool {
	if got < 0 || want < 0 {
		return got == want
	}
	return got-want <= 1 && want-got <= 1
}

// TestVectors runs the shared bucket vectors in client-clock mode with a
// controlled clock, in per-request and batched mode.
func TestVectors(t *testing.T) {
	cases, err := vectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	for _, mode := range []struct {
		name string
		opts []redisstore.Option
	}{{"single", nil}, {"batched", []redisstore.Option{redisstore.WithBatching(8)}}} {
		clock := newFakeClock()
		s := newStore(t, c, append(mode.opts, redisstore.WithClientClock(clock))...)
		for _, tc := range cases {
			t.Run(mode.name+"/"+tc.Name, func(t *testing.T) {
				start := clock.Now().Add(time.Hour)
				lim := floodgate.PerSecond(tc.Limit.Rate, tc.Limit.Burst)
				for i, st := range tc.Steps {
					if st.Limit != nil {
						lim = floodgate.PerSecond(st.Limit.Rate, st.Limit.Burst)
					}
					clock.Set(start.Add(time.Duration(st.AtUS) * time.Microsecond))
					res, err := s.TakeN(bg, tc.Name, lim, st.N)
					if st.N > lim.Burst && lim.Burst > 0 {
						// Refused without a call, with an error; the bucket,
						// untouched, must be as the vector says.
						if !errors.Is(err, floodgate.ErrExceedsBurst) || res.Allowed || res.RetryAfter != floodgate.Never {
							t.Fatalf("step %d: TakeN(%v, %d) = %+v, %v; want refused for good with ErrExceedsBurst", i, lim, st.N, res, err)
						}
						peek, err := s.Peek(bg, tc.Name, lim)
						if err != nil {
							t.Fatal(err)
						}
						res.Remaining, res.ResetAfter = peek.Remaining, peek.ResetAfter
					} else if err != nil {
						t.Fatalf("step %d: TakeN(%v, %d) error %v", i, lim, st.N, err)
					}
					if res.Allowed != st.Allowed || res.Remaining != st.Remaining ||
						!closeUS(vectors.Micros(res.RetryAfter), st.RetryAfterUS) ||
						!closeUS(vectors.Micros(res.ResetAfter), st.ResetAfterUS) {
						t.Errorf("step %d: TakeN(%v, %d) at %dµs = allowed %v remaining %d retry %dµs reset %dµs, want %v %d %dµs %dµs",
							i, lim, st.N, st.AtUS, res.Allowed, res.Remaining, vectors.Micros(res.RetryAfter), vectors.Micros(res.ResetAfter),
							st.Allowed, st.Remaining, st.RetryAfterUS, st.ResetAfterUS)
					}
					if res.Source != floodgate.SourceRedis {
						t.Errorf("step %d: Source = %v, want redis", i, res.Source)
					}
				}
			})
		}
	}
}

// model is the script's arithmetic in Go: micro-tokens and µs in float64,
// as Lua computes them. It is the reference for random sequences.
type model struct {
	tokens, at float64
	exists     bool
}

func (m *model) take(lim floodgate.Limit, n int, now float64) (allowed bool, tokens float64) {
	burst := float64(lim.Burst) * 1e6
	tokens, at := burst, now
	if m.exists {
		tokens, at = m.tokens, m.at
		if now > at {
			if tokens < burst && lim.Rate > 0 {
				add := (now - at) * lim.Rate
				if add >= burst-tokens {
					tokens = burst
				} else {
					tokens += math.Floor(add)
				}
			}
			at = now
		}
		tokens = math.Min(tokens, burst)
	}
	need := float64(n) * 1e6
	if n > 0 && n <= lim.Burst && tokens >= need {
		tokens -= need
		m.tokens, m.at, m.exists = tokens, at, true
		return true, tokens
	}
	return n == 0, tokens
}

// TestRandomSequences checks the script against the Go model over random
// limits, times (including ones that go backwards) and counts, and, where
// both fixed-point schemes are exact (integer rates), against keyed.
func TestRandomSequences(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	clock := newFakeClock()
	s := newStore(t, c, redisstore.WithClientClock(clock))
	ref, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rates := []float64{0, 0.5, 1, 3, 7.3, 10, 1000, 1e6, 1.0 / 3}
	for seq := range 40 {
		key := "seq" + string(rune('A'+seq%26)) + string(rune('a'+seq/26))
		lim := floodgate.PerSecond(rates[rng.IntN(len(rates))], 1+rng.IntN(20))
		exactKeyed := lim.Rate == math.Trunc(lim.Rate)
		var m model
		base := clock.Now().Add(time.Duration(seq) * time.Hour)
		nowUS := int64(0)
		for step := range 40 {
			switch rng.IntN(4) {
			case 0: // same instant
			case 1:
				nowUS += rng.Int64N(1000)
			case 2:
				nowUS += rng.Int64N(2_000_000)
			case 3:
				nowUS -= rng.Int64N(1000) // a client clock that is behind
			}
			if rng.IntN(10) == 0 { // the limit changes
				lim = floodgate.PerSecond(rates[rng.IntN(len(rates))], 1+rng.IntN(20))
				exactKeyed = false
			}
			n := rng.IntN(lim.Burst + 2)
			at := base.Add(time.Duration(nowUS) * time.Microsecond)
			clock.Set(at)
			res, err := s.TakeN(bg, key, lim, n)
			if n > lim.Burst {
				if !errors.Is(err, floodgate.ErrExceedsBurst) || res.Allowed {
					t.Fatalf("TakeN(%v, %d) = %+v, %v; want ErrExceedsBurst", lim, n, res, err)
				}
				continue // nothing taken, no call: the model does not move
			}
			if err != nil {
				t.Fatal(err)
			}
			wantAllowed, wantTokens := m.take(lim, n, float64(at.UnixMicro()))
			if res.Allowed != wantAllowed || res.Remaining != int(wantTokens/1e6) {
				t.Fatalf("seq %d step %d: TakeN(%v, %d) = allowed %v remaining %d, want %v %d",
					seq, step, lim, n, res.Allowed, res.Remaining, wantAllowed, int(wantTokens/1e6))
			}
			if exactKeyed && nowUS >= 0 {
				kr, err := ref.TakeAt(key, lim, n, at)
				if err != nil {
					t.Fatal(err)
				}
				if kr.Allowed != res.Allowed || kr.Remaining != res.Remaining ||
					!closeUS(vectors.Micros(kr.RetryAfter), vectors.Micros(res.RetryAfter)) ||
					!closeUS(vectors.Micros(kr.ResetAfter), vectors.Micros(res.ResetAfter)) {
					t.Fatalf("seq %d step %d: TakeN(%v, %d) = %+v, keyed says %+v", seq, step, lim, n, res, kr)
				}
			}
		}
	}
}

func TestInfAndErrors(t *testing.T) {
	srv := sharedServer(t)
	c := newClient(t, srv.Addr)
	s := newStore(t, c)
	res, err := s.TakeN(bg, "k", floodgate.Inf, 1000)
	if err != nil || !res.Allowed || res.Source != floodgate.SourceRedis {
		t.Errorf("TakeN(Inf) = %+v, %v, want allowed", res, err)
	}
	if n, _ := c.Exists(bg, s.Key("k")).Result(); n != 0 {
		t.Errorf("TakeN(Inf) wrote %s", s.Key("k"))
	}
	if _, err := s.TakeN(bg, "k", floodgate.PerSecond(1, 1), -1); !errors.Is(err, floodgate.ErrNegativeN) {
		t.Errorf("TakeN(n=-1) error = %v, want ErrNegativeN", err)
	}
	_, err = s.TakeN(bg, "k", floodgate.PerSecond(math.NaN(), 1), 1)
	if err == nil || err.Error()[:12] != "redisstore: " {
		t.Errorf("TakeN(NaN rate) error = %v, want a redisstore error", err)
	}
}
