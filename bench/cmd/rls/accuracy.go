package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The accuracy phase: what each variant admits per descriptor over one
// unit of its limit (a minute; a second with -quick) against the
// configured limit, with one replica and with three behind one Redis.
// Every configuration runs at once, each on its own servers and its own
// descriptor values, in the same window: the unit [E − ½, E + ½) around a
// window edge E of the wall clock, where envoyproxy/ratelimit's fixed
// windows turn over (they are aligned on Unix time).
//
// Two patterns, each on its own values:
//
//   - steady: seconds before the window a burst of the limit plus a fifth
//     drains the value's allowance (a token bucket's burst, a fixed
//     window's current count); then, through the window, twice the
//     limit's rate, evenly spaced and spread over the replicas. A token
//     bucket admits its rate over the time since the drain; a fixed
//     window the limit once, at the edge.
//   - edge: nothing until a burst of one and a half times the limit just
//     before E and another just after. A token bucket admits its burst
//     (one unit's worth) and the refill between the bursts; a fixed
//     window admits the limit on each side of its edge: twice the limit.
//
// A variant's allowance is what its algorithm may admit given when the
// requests were sent. floodgate's target is to admit within 1% of it (or
// one request, whichever is more), widened on Redis with leases and
// credit (lease time d, R replicas) by what floodgate states they do: over
// any window all replicas together admit at most rate × (2R+1) × d more
// than the bucket would (rate × d for the leases; per replica, up to
// rate × d taken on credit and not yet charged, and as much owed by a
// charge that found the bucket empty), and each replica may lose the
// unspent part of its lease, up to
// rate × d, when its demand stops: the judgement allows R × rate × d
// less with R replicas each time the pattern's demand stops (once in the
// steady pattern, at its end; twice in the edge pattern).
const (
	accSteadyValues = 2
	accEdgeValues   = 2
	accBurstCallers = 8 // per configuration
)

// Accuracy is the accuracy phase's results.
type Accuracy struct {
	Limits accuracyLimits `json:"limits"`
	// Edge is the window edge E, UTC.
	Edge  time.Time     `json:"edge"`
	Lease time.Duration `json:"lease"`
	Runs  []AccuracyRun `json:"runs"`
}

// An AccuracyRun is one configuration: a variant with some replicas.
type AccuracyRun struct {
	Variant  string     `json:"variant"`
	Replicas int        `json:"replicas"`
	Steady   []Admitted `json:"steady"`
	Edge     []Admitted `json:"edge"`
	Errors   int64      `json:"errors"`
	// Fallbacks are floodgate-rls's decisions, over the whole phase, that
	// its store could not make and its failure policy made instead.
	Fallbacks int64 `json:"fallbacks,omitempty"`
	// Drained is when the steady values' drain was answered, and Bursts
	// when each edge burst's first request was sent and its last
	// answered: seconds from the edge E. A fixed window shows its 2× only
	// when the first burst ends before E.
	Drained float64       `json:"drained_s"`
	Bursts  [2][2]float64 `json:"bursts_s"`
}

// Admitted is what one descriptor value got.
type Admitted struct {
	Value    string `json:"value"`
	Offered  int64  `json:"offered"`
	Admitted int64  `json:"admitted"`
	// First is the edge pattern's admitted in its first burst; the rest
	// were in the second.
	First int64 `json:"first,omitempty"`
	// Span is the seconds over which the counted requests were sent: from
	// the drain to the last (steady), from the first of the first burst to
	// the last of the second (edge).
	Span float64 `json:"span_s"`
	// Allowance is what the variant's algorithm may admit given when the
	// requests were sent, without leases; LeaseExtra what leases may add
	// to it, and LeaseLoss what they may take from it.
	Allowance  float64 `json:"allowance"`
	LeaseExtra float64 `json:"lease_extra,omitempty"`
	LeaseLoss  float64 `json:"lease_loss,omitempty"`
}

// Bounds returns the target's range: the allowance within 1% (at least
// one request), widened by the leases' extra and loss.
func (a Admitted) Bounds() (lo, hi float64) {
	tol := math.Max(targetAccuracy*a.Allowance, 1)
	return a.Allowance - tol - a.LeaseLoss, a.Allowance + tol + a.LeaseExtra
}

// Within reports whether a is within the target's range.
func (a Admitted) Within() bool {
	lo, hi := a.Bounds()
	got := float64(a.Admitted)
	return got >= lo && got <= hi
}

// tokenBucket reports whether variant v decides with token buckets
// (floodgate), else with fixed windows (envoyproxy/ratelimit).
func tokenBucket(v string) bool { return v == vMemory || v == vRedis }

// accTimes are the phase's moments, relative to the edge E.
type accTimes struct {
	drainLead time.Duration // the steady values' drain, before the window
	edgeLead  time.Duration // the first edge burst, before E
	edgeLag   time.Duration // the second, after E
}

func accTimesFor(quick bool) accTimes {
	if quick {
		return accTimes{drainLead: 300 * time.Millisecond, edgeLead: 200 * time.Millisecond, edgeLag: 20 * time.Millisecond}
	}
	// Every configuration's bursts share the servers' CPU: the first must
	// end before E.
	return accTimes{drainLead: 10 * time.Second, edgeLead: 5 * time.Second, edgeLag: 100 * time.Millisecond}
}

// nextEdge returns the first window edge at least lead from now.
func nextEdge(now time.Time, period, lead time.Duration) time.Time {
	return now.Add(lead).Truncate(period).Add(period)
}

// counter is one value's counts.
type counter struct {
	offered, admitted, errors atomic.Int64
}

// accTarget is one configuration's servers, as the phase drives them.
type accTarget struct {
	run   *AccuracyRun
	stubs []rlsv3.RateLimitServiceClient // one per replica
	procs []*proc
	next  atomic.Uint64 // round robin over the replicas
}

func (t *accTarget) call(ctx context.Context, domainKey, value string, c *counter) {
	req := &rlsv3.RateLimitRequest{Domain: domainAccuracy, Descriptors: []*rlv3.RateLimitDescriptor{
		descriptor(entry(domainKey, value)),
	}}
	stub := t.stubs[int(t.next.Add(1)%uint64(len(t.stubs)))]
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	c.offered.Add(1)
	resp, err := stub.ShouldRateLimit(cctx, req)
	switch {
	case err != nil:
		c.errors.Add(1)
	case resp.OverallCode == rlsv3.RateLimitResponse_OK:
		c.admitted.Add(1)
	}
}

// burst sends n requests for each value, interleaved, from
// accBurstCallers callers, and returns when the first was sent, when the
// last was, and when every one was answered.
func (t *accTarget) burst(ctx context.Context, key string, values []string, n int, cs []*counter) (first, last, done time.Time) {
	jobs := make(chan int, len(values)*n)
	for k := range len(values) * n {
		jobs <- k % len(values)
	}
	close(jobs)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range accBurstCallers {
		wg.Go(func() {
			for i := range jobs {
				at := time.Now()
				mu.Lock()
				if first.IsZero() || at.Before(first) {
					first = at
				}
				if at.After(last) {
					last = at
				}
				mu.Unlock()
				t.call(ctx, key, values[i], cs[i])
			}
		})
	}
	wg.Wait()
	return first, last, time.Now()
}

// drive runs both patterns against t around edge and fills t.run.
func (t *accTarget) drive(ctx context.Context, lim accuracyLimits, at accTimes, edge time.Time, lease time.Duration) {
	name := t.run.Variant + "-" + strconv.Itoa(t.run.Replicas)
	values := func(p string, n int) []string {
		vs := make([]string, n)
		for i := range vs {
			vs[i] = name + "-" + p + "-" + strconv.Itoa(i)
		}
		return vs
	}
	steadyValues, edgeValues := values("steady", accSteadyValues), values("edge", accEdgeValues)
	counters := func(n int) []*counter {
		cs := make([]*counter, n)
		for i := range cs {
			cs[i] = &counter{}
		}
		return cs
	}
	steady, edges := counters(len(steadyValues)), counters(len(edgeValues))
	half := lim.Period / 2
	start, end := edge.Add(-half), edge.Add(half)
	rateSteady := float64(lim.Steady) / lim.Period.Seconds()
	rateEdge := float64(lim.Edge) / lim.Period.Seconds()
	tb := tokenBucket(t.run.Variant)
	// ends is how often the pattern's demand stops, leaving each replica
	// with a lease it may not spend: at most a quarter of the burst.
	// Leases add nothing to what the bucket admits (docs/stores.md).
	leases := func(a *Admitted, burst float64, ends int) {
		if t.run.Variant == vRedis && lease > 0 {
			a.LeaseLoss = float64(ends*t.run.Replicas) * burst / 4
		}
	}

	var wg sync.WaitGroup
	// steady: drain, then twice the rate until the window ends.
	wg.Go(func() {
		sleepUntil(ctx, start.Add(-at.drainLead))
		drainCounts := counters(len(steadyValues))
		_, _, drained := t.burst(ctx, "steady", steadyValues, lim.Steady+max(lim.Steady/5, 10), drainCounts)
		t.run.Drained = drained.Sub(edge).Seconds()
		sleepUntil(ctx, start)
		interval := time.Duration(float64(time.Second) / (2 * rateSteady))
		var calls sync.WaitGroup
		for at := time.Now(); at.Before(end) && ctx.Err() == nil; at = at.Add(interval) {
			sleepUntil(ctx, at)
			for i, v := range steadyValues {
				calls.Go(func() { t.call(ctx, "steady", v, steady[i]) })
			}
		}
		calls.Wait()
		// To the last answer, which came after the last decision: the
		// allowance errs up, by the refill over one call's latency.
		span := time.Since(drained).Seconds()
		for i, v := range steadyValues {
			a := Admitted{Value: v, Offered: steady[i].offered.Load(), Admitted: steady[i].admitted.Load(), Span: span}
			if tb {
				// Empty at the drain (it was refused at its end), then the
				// rate; the token's fraction left is within the tolerance.
				a.Allowance = rateSteady * span
				leases(&a, float64(lim.Steady), 1)
			} else {
				// The drain took the count of the window it fell in; the
				// window crosses one edge, after which the limit is fresh.
				a.Allowance = float64(lim.Steady)
			}
			t.run.Steady = append(t.run.Steady, a)
		}
	})
	// edge: a burst of one and a half times the limit on each side of E.
	burst := lim.Edge + lim.Edge/2
	wg.Go(func() {
		sleepUntil(ctx, edge.Add(-at.edgeLead))
		first, _, done1 := t.burst(ctx, "edge", edgeValues, burst, edges)
		firsts := make([]int64, len(edges))
		for i, c := range edges {
			firsts[i] = c.admitted.Load()
		}
		sleepUntil(ctx, edge.Add(at.edgeLag))
		first2, _, done2 := t.burst(ctx, "edge", edgeValues, burst, edges)
		rel := func(x time.Time) float64 { return x.Sub(edge).Seconds() }
		t.run.Bursts = [2][2]float64{{rel(first), rel(done1)}, {rel(first2), rel(done2)}}
		// From the first send, before the first decision, to the last
		// answer, after the last: the allowance errs up.
		span := done2.Sub(first).Seconds()
		for i, v := range edgeValues {
			a := Admitted{Value: v, Offered: edges[i].offered.Load(), Admitted: edges[i].admitted.Load(), First: firsts[i], Span: span}
			if tb {
				// Full (a burst of one unit's worth) at the first request.
				a.Allowance = float64(lim.Edge) + rateEdge*span
				leases(&a, float64(lim.Edge), 2)
			} else {
				a.Allowance = 2 * float64(lim.Edge)
			}
			t.run.Edge = append(t.run.Edge, a)
		}
	})
	wg.Wait()
	for _, c := range append(steady, edges...) {
		t.run.Errors += c.errors.Load()
	}
}

func sleepUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

func (r AccuracyRun) String() string {
	f := func(as []Admitted) string {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, a := range as {
			x := float64(a.Admitted) / a.Allowance
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
		return fmt.Sprintf("%.3f–%.3f", lo, hi)
	}
	return fmt.Sprintf("%s ×%d: admitted/allowance steady %s, edge %s, errors %d, fallbacks %d", r.Variant, r.Replicas, f(r.Steady), f(r.Edge), r.Errors, r.Fallbacks)
}
