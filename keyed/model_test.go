package keyed

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
)

// refBucket is the sequential reference model: one bucket in exact integer
// arithmetic, with the rate as the fraction num/den tokens per second. It
// shares no code with the Map.
type refBucket struct {
	tokens, last int64 // 1e-9 token units; ns
}

type refLimit struct {
	num, den int64 // rate = num/den tokens per second
	burst    int64
}

func (l refLimit) limit() floodgate.Limit {
	return floodgate.Limit{Rate: float64(l.num) / float64(l.den), Burst: int(l.burst)}
}

// wait returns ceil(need / rate) in ns, or -1 for never.
func (l refLimit) wait(need int64) int64 {
	if need <= 0 {
		return 0
	}
	if l.num == 0 {
		return -1
	}
	return (need*l.den + l.num - 1) / l.num
}

type refModel map[string]*refBucket

func (r refModel) take(key string, l refLimit, n int, now int64) (allowed bool, remaining int, retry, reset int64) {
	burst := l.burst * unit
	b := r[key]
	if b == nil {
		if n <= 0 || int64(n) > l.burst {
			tokens := burst
			if int64(n) > l.burst {
				return false, int(tokens / unit), -1, 0
			}
			return true, int(tokens / unit), 0, 0
		}
		b = &refBucket{tokens: burst, last: now}
		r[key] = b
	}
	tokens, at := b.tokens, b.last
	if now > at {
		tokens += (now - at) * l.num / l.den
		at = now
	}
	tokens = min(tokens, burst)
	need := int64(n) * unit
	switch {
	case n <= 0:
		allowed = true
	case int64(n) > l.burst:
		retry = -1
	case tokens >= need:
		tokens -= need
		b.tokens, b.last = tokens, at
		allowed = true
	default:
		retry = l.wait(need - tokens)
	}
	return allowed, int(max(tokens, 0) / unit), retry, l.wait(burst - tokens)
}

func ns(d time.Duration) int64 {
	if d == floodgate.Never {
		return -1
	}
	return int64(d)
}

// op is one step of a generated take sequence.
type op struct {
	key int
	dt  int64 // ns to advance before the take; negative steps test clock skew
	n   int
	lim int
}

// Limits with short binary fractions, so that the Map's float refill is
// exact and must agree with the integer model to the nanosecond.
var modelLimits = []refLimit{
	{10, 1, 5}, {1, 2, 1}, {1000, 1, 100}, {3, 4, 3}, {0, 1, 4}, {1_000_000, 1, 1000}, {7, 1, 1},
}

// runModel applies ops to a Map and to the reference and reports the first
// difference.
func runModel(t *testing.T, ops []op) {
	t.Helper()
	m := newMap(t, WithCapacity(1<<20))
	ref := refModel{}
	keys := []string{"a", "b", "c", "d"}
	now := int64(0)
	for i, o := range ops {
		now += o.dt
		now = max(now, 0)
		l := modelLimits[o.lim%len(modelLimits)]
		key := keys[o.key%len(keys)]
		got := takeAt(t, m, key, l.limit(), o.n, t0.Add(time.Duration(now)))
		wa, wr, wretry, wreset := ref.take(key, l, o.n, now)
		if got.Allowed != wa || got.Remaining != wr || ns(got.RetryAfter) != wretry || ns(got.ResetAfter) != wreset {
			t.Fatalf("op %d (key %s, t %dns, n %d, %v): Map = {%v %d retry %d reset %d}, model = {%v %d retry %d reset %d}",
				i, key, now, o.n, l.limit(), got.Allowed, got.Remaining, ns(got.RetryAfter), ns(got.ResetAfter),
				wa, wr, wretry, wreset)
		}
	}
}

func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for seq := 0; seq < 300; seq++ {
		ops := make([]op, 200)
		lim := rng.IntN(len(modelLimits))
		for i := range ops {
			dt := rng.Int64N(int64(300 * time.Millisecond))
			switch rng.IntN(10) {
			case 0:
				dt = -dt / 3 // a caller that read the clock early
			case 1:
				dt = 0
			}
			if rng.IntN(20) == 0 {
				lim = rng.IntN(len(modelLimits)) // a limit change, as a reload or the gate makes
			}
			ops[i] = op{key: rng.IntN(4), dt: dt, n: rng.IntN(7), lim: lim}
		}
		runModel(t, ops)
	}
}

// FuzzTake drives the Map and the reference model with arbitrary take
// sequences: 4 bytes an op.
func FuzzTake(f *testing.F) {
	f.Add([]byte{0, 10, 1, 0, 0, 0, 5, 0, 1, 200, 2, 3})
	f.Add([]byte{3, 255, 7, 5, 3, 0, 1, 5, 2, 128, 0, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		var ops []op
		for len(data) >= 4 {
			dt := int64(int8(data[1])) * int64(time.Millisecond) * 7
			ops = append(ops, op{key: int(data[0]), dt: dt, n: int(data[2] % 8), lim: int(data[3])})
			data = data[4:]
		}
		runModel(t, ops)
	})
}
