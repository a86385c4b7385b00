package rlqstest

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// minFillRate is TB's kMinFillRate: one token a year. A rate of 0 (an unset
// tokens_per_fill) is clamped to it, so such a bucket never refills in a test.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// hostUptime is how long the simulated host has been up when NewEnvoy runs.
// TB measures time as seconds of the monotonic clock (time since boot), and a
// full bucket whose max_tokens/fill_rate is not below that starts empty
// instead (the ENVOY_BUG guard of TB's constructor). One day makes that guard
// fire only for buckets that take a day or more to fill, e.g. any bucket whose
// tokens_per_fill is unset (rate minFillRate).
const hostUptime = 24 * time.Hour

// cmin and cmax are C++'s std::min and std::max, which differ from math.Min
// and math.Max on NaN: std::min(a, b) is (b < a) ? b : a. TB relies on this
// when a rate is +Inf or NaN (0 × Inf): the bucket then reads as full.
func cmin(a, b float64) float64 {
	if b < a {
		return b
	}
	return a
}

func cmax(a, b float64) float64 {
	if a < b {
		return b
	}
	return a
}

// tokenBucket is Envoy's AtomicTokenBucketImpl (token_bucket_impl.cc, TB): it
// stores only the monotonic instant t at which the bucket was (or would have
// been) empty, and holds min(max, (now−t)·rate) tokens at now. Times are
// seconds of the simulated monotonic clock (Envoy.mono).
type tokenBucket struct {
	max  float64
	rate float64
	t    float64
}

// newTokenBucket is TB's constructor AtomicTokenBucketImpl(max_tokens,
// time_source, fill_rate, init_fill).
func newTokenBucket(max uint64, rate, now float64, initFill bool) *tokenBucket {
	b := &tokenBucket{max: float64(max), rate: cmax(math.Abs(rate), minFillRate), t: now}
	if initFill {
		// TB: starts full unless max/rate is not below the monotonic time
		// (ENVOY_BUG, a log line in release builds), when it starts empty.
		if w := b.max / b.rate; w < now {
			b.t = now - w
		}
	}
	return b
}

// consume is TB's consume(1, false), as filter.cc:312 (F@1736899) calls it.
func (b *tokenBucket) consume(now float64) bool {
	// TB: no token is ever taken at or before t, so a bucket with an infinite
	// rate admits one request per distinct clock reading, not unlimited ones
	// when a fake clock stands still.
	if now <= b.t {
		return false
	}
	total := cmin(b.max, (now-b.t)*b.rate)
	if total < 1 {
		return false
	}
	b.t = now - (total-1)/b.rate
	return true
}

// remaining is TB's remainingTokens.
func (b *tokenBucket) remaining(now float64) float64 {
	return cmin(b.max, (now-b.t)*b.rate)
}

// fillSeconds is absl::ToInt64Seconds of fill_interval: whole seconds,
// truncated toward zero (global_client_impl.cc:257-260, GC@c33e7f8).
func fillSeconds(tb *typev3.TokenBucket) int64 {
	d := tb.GetFillInterval()
	s, n := d.GetSeconds(), int64(d.GetNanos())
	switch {
	case s > 0 && n < 0:
		s--
	case s < 0 && n > 0:
		s++
	}
	return s
}

// fillRate is createTokenBucketFromAction's rate
// (global_client_impl.cc:252-260, GC@c33e7f8): tokens_per_fill / whole seconds
// of fill_interval, in double arithmetic. An interval under 1 s divides by 0,
// giving +Inf (or NaN when tokens_per_fill is also 0); an unset tokens_per_fill
// reads as 0, not the API's default of 1.
func fillRate(tb *typev3.TokenBucket) float64 {
	return float64(tb.GetTokensPerFill().GetValue()) / float64(fillSeconds(tb))
}

// tokenBucketFromStrategy is createTokenBucketFromAction
// (global_client_impl.cc:252-271, GC@c33e7f8). With no predecessor the bucket
// starts full. With one, Envoy computes uint64(max_new × remaining_old /
// max_old) and passes it to TB's bool init_fill, so the new bucket is full if
// that is at least 1 and empty otherwise (global_client_impl.cc:265-268
// (GC@c33e7f8), TB).
func tokenBucketFromStrategy(s *typev3.RateLimitStrategy, now float64, old *tokenBucket) *tokenBucket {
	tb := s.GetTokenBucket()
	max := tb.GetMaxTokens()
	initFill := true
	if old != nil {
		// A NaN product (old max_tokens 0) converts to a non-zero integer on
		// x86, hence true; !(x < 1) keeps that.
		initFill = !(float64(max)*(old.remaining(now)/old.max) < 1)
	}
	return newTokenBucket(uint64(max), fillRate(tb), now, initFill)
}

// sameTokenBucket is protoTokenBucketsEq (global_client_impl.cc:244-249,
// GC@c33e7f8): max_tokens, tokens_per_fill and only the nanos of fill_interval.
// A change of fill_interval.seconds alone is "identical", and Envoy keeps the
// old rate.
func sameTokenBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}
