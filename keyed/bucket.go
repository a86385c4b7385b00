package keyed

import (
	"math"
	"time"

	"github.com/floodgate-go/floodgate"
)

// unit is the number of fixed-point token units in one token. Tokens are
// kept as integers so that concurrent takes add and subtract exactly; refill
// rounds down, so a bucket loses less than 1e-9 token per refill and never
// gains.
const unit = 1_000_000_000

// never is the fullAt of a bucket that will not refill (rate 0, not full).
const never = math.MaxInt64

// less returns a − b, or math.MaxInt64 when that does not fit: with bursts
// near MaxBurst, a bucket deep in WaitN debt is further below its burst than
// an int64 counts, and such a gap is as good as endless.
func less(a, b int64) int64 {
	if b < 0 && a > math.MaxInt64+b {
		return math.MaxInt64
	}
	return a - b
}

// state is one bucket: 24 bytes, no pointers. Times are nanoseconds on the
// Map's monotonic clock.
type state struct {
	tokens int64 // in units of 1e-9 token; negative while the bucket owes tokens (settles, WaitN)
	last   int64 // when tokens was counted
	fullAt int64 // when the bucket is full again under the last limit that touched it
}

// refill returns the bucket's tokens at now under lim, capped at the burst,
// and the time they are counted at (never earlier than last: a caller that
// read the clock before another caller locked the bucket must not move the
// bucket's time backwards).
func (s *state) refill(lim floodgate.Limit, now int64) (tokens, at int64) {
	burst := int64(lim.Burst) * unit
	tokens, at = s.tokens, s.last
	if now > at {
		if tokens < burst && lim.Rate > 0 {
			// now−at fits: Map.at keeps times within ±2^62.
			add := float64(now-at) * lim.Rate
			if add >= float64(burst)-float64(tokens) {
				tokens = burst
			} else {
				tokens += int64(add)
			}
		}
		at = now
	}
	if tokens > burst { // the limit was lowered since the last take
		tokens = burst
	}
	return tokens, at
}

// fullState is a new bucket: full at now.
func fullState(lim floodgate.Limit, now int64) state {
	return state{tokens: int64(lim.Burst) * unit, last: now, fullAt: now}
}

// waitFor returns how long lim takes to add need units, rounded up so that
// a retry after exactly that long succeeds, or never.
func waitFor(lim floodgate.Limit, need int64) int64 {
	if need <= 0 {
		return 0
	}
	if !(lim.Rate > 0) {
		return never
	}
	f := math.Ceil(float64(need) / lim.Rate)
	if f >= float64(never) {
		return never
	}
	ns := int64(f)
	if float64(ns)*lim.Rate < float64(need) { // float rounding went the wrong way
		ns++
	}
	return ns
}

func toDuration(ns int64) time.Duration {
	if ns == never {
		return floodgate.Never
	}
	return time.Duration(ns)
}

// take decides a take of n ≥ 1 tokens on s at now into res and updates s
// when it succeeds. It writes nothing on rejection (refill is linear, so a
// bucket that is left alone computes the same tokens later), except to
// keep a bucket in debt from eviction for as long as lim takes to refill
// it (see owing). The result is written through a pointer because a Result
// is several words: returning it by value through the call chain cost more
// than the decision.
func (s *state) take(res *floodgate.Result, lim floodgate.Limit, n int, now int64) {
	tokens, at := s.refill(lim, now)
	res.Limit = lim
	burst := int64(lim.Burst) * unit
	need := int64(n) * unit
	switch {
	case n <= lim.Burst && tokens >= need:
		tokens -= need
		res.Allowed = true
		res.ResetAfter = toDuration(s.set(lim, tokens, at))
	case n > lim.Burst:
		res.RetryAfter = floodgate.Never
		res.ResetAfter = toDuration(waitFor(lim, less(burst, tokens)))
	default:
		reset := waitFor(lim, less(burst, tokens))
		res.RetryAfter = toDuration(waitFor(lim, less(need, tokens)))
		res.ResetAfter = toDuration(reset)
		if tokens < 0 {
			s.owing(reset, at)
		}
	}
	count(res, tokens)
}

// owing keeps a bucket that owes tokens from counting as full before the
// limit in force, which refills it in reset from at, has refilled it: a
// limit whose rate was lowered since the settle that charged the debt
// would otherwise let the eviction scan drop the bucket, and its debt,
// early. It only ever delays fullAt.
func (s *state) owing(reset, at int64) {
	if reset == never || at > 0 && reset > never-at { // or past the end of the clock
		s.fullAt = never
	} else if full := at + reset; full > s.fullAt {
		s.fullAt = full
	}
}

// count writes tokens, in units, into res: the whole tokens Remaining, or
// the tokens Owed, rounded up, while the bucket is below zero.
func count(res *floodgate.Result, tokens int64) {
	if tokens > 0 {
		res.Remaining = int(tokens / unit)
	} else if tokens < 0 {
		// −tokens would overflow at math.MinInt64.
		res.Owed = int(-(tokens+1)/unit + 1)
	}
}

// settle applies a settle to s at now under lim: it refunds −delta tokens
// (delta < 0), never above the burst, or charges delta tokens (delta > 0),
// below zero down to lim's debt limit, in whole tokens. It writes the
// bucket into res and returns the tokens of the charge that did not fit.
func (s *state) settle(res *floodgate.Result, lim floodgate.Limit, delta int, now int64) (uncharged int) {
	tokens, at := s.refill(lim, now)
	burst := int64(lim.Burst) * unit
	switch {
	case delta < 0:
		// delta is a difference of two ints ≥ 0: −delta fits. gap is
		// the whole tokens that fit below the burst, counted without
		// burst − tokens, which overflows deep in debt (a refund capped
		// there would fill the bucket). Below it, refund × unit may
		// overflow, but the sum, between tokens and the burst, fits, and
		// wrapping arithmetic gets it right.
		refund, gap := int64(-delta), (burst-tokens)/unit
		if tokens < 0 {
			gap = int64(lim.Burst) - tokens/unit // ⌊−tokens/unit⌋ = −(tokens/unit)
		}
		if refund > gap {
			tokens = burst
		} else {
			tokens += refund * unit
		}
	case delta > 0:
		// room is the whole tokens the bucket gives before it owes its
		// debt limit, computed without overflow: tokens and the debt
		// limit are each at most MaxBurst tokens, their sum may not fit.
		debt := int64(lim.DebtLimit())
		var room int64
		if tokens >= 0 {
			room = tokens/unit + debt
		} else if t := tokens + debt*unit; t > 0 {
			room = t / unit
		}
		charge := min(int64(delta), room)
		tokens -= charge * unit
		uncharged = int(int64(delta) - charge)
	}
	*res = floodgate.Result{Allowed: true, Limit: lim, ResetAfter: toDuration(s.set(lim, tokens, at))}
	count(res, tokens)
	return uncharged
}

// set stores tokens counted at at and returns the time until the bucket is
// full under lim, or never.
//
// Full, for eviction (fullAt), means full under lim, the last limit that
// took: a bucket drained while the CPU gate cut limits is full sooner than
// under the restored limit, and evicting it then hands its key a bucket
// fuller than the one it had, by at most the part of the burst the cut
// removed. Counting a whole burst's refill time instead would keep lightly
// used buckets from eviction for as long, at every capacity.
func (s *state) set(lim floodgate.Limit, tokens, at int64) int64 {
	reset := waitFor(lim, less(int64(lim.Burst)*unit, tokens))
	s.tokens, s.last, s.fullAt = tokens, at, never
	if reset != never {
		s.fullAt = at + reset
	}
	return reset
}

// peek reports s at now under lim without changing it.
func (s *state) peek(lim floodgate.Limit, now int64) floodgate.Result {
	tokens, _ := s.refill(lim, now)
	res := floodgate.Result{Allowed: true, Limit: lim}
	count(&res, tokens)
	res.ResetAfter = toDuration(waitFor(lim, less(int64(lim.Burst)*unit, tokens)))
	return res
}

// full reports whether evicting s at now would change no future decision:
// the bucket has refilled, so a new bucket would be identical.
func (s *state) full(now int64) bool { return now >= s.fullAt }
