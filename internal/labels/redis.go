package labels

import (
	"fmt"
	"math"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/remote"
)

// CallBuckets returns the default upper bounds, in seconds, of the Redis
// call duration histograms: from 100 µs (a round trip on loopback) to 1 s
// (well past any decision's deadline).
func CallBuckets() []float64 {
	return []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
}

// CheckBuckets returns an error wrapping floodgate.ErrInvalidOption, naming
// package pkg's WithCallBuckets, unless bounds are at least one, finite,
// positive and increasing.
func CheckBuckets(pkg string, bounds []float64) error {
	invalid := func(v any, want string) error {
		return fmt.Errorf("%w: %s: WithCallBuckets = %v, want %s", floodgate.ErrInvalidOption, pkg, v, want)
	}
	for i, b := range bounds {
		if !(b > 0) || math.IsInf(b, 0) || i > 0 && b <= bounds[i-1] {
			return invalid(bounds, "finite, positive and increasing bounds")
		}
	}
	if len(bounds) == 0 {
		return invalid("no bounds", "at least one")
	}
	return nil
}

// NumKinds is the number of error kinds labelled; a kind beyond them, from
// a newer redisstore, counts as "other" (Kind).
const NumKinds = int(remote.KindOther) + 1

// Kind returns the label index of k: k, or KindOther for a newer kind.
func Kind(k remote.ErrorKind) int {
	if int(k) >= NumKinds {
		return int(remote.KindOther)
	}
	return int(k)
}

// BreakerStates label the breaker's states, by remote.BreakerState.
var BreakerStates = [...]string{"closed", "open", "half_open"}

// FallbackSources are the sources of the decisions Redis did not make, in
// label order, and their labels (as in the decisions' source).
var FallbackSources = [...]struct {
	Source floodgate.Source
	Label  string
}{
	{floodgate.SourceCache, "cache"},
	{floodgate.SourceLease, "lease"},
	{floodgate.SourceFallback, "fallback"},
	{floodgate.SourceFailOpen, "fail_open"},
	{floodgate.SourceFailClosed, "fail_closed"},
}

// Fallback returns the label index of a fallback decision's source, or
// false for a source Redis decided.
func Fallback(source floodgate.Source) (int, bool) {
	for i, f := range FallbackSources {
		if f.Source == source {
			return i, true
		}
	}
	return 0, false
}
