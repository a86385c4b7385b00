package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-go/floodgate/internal/redistest"
)

// A step changes the fleet or its Redis at a time from the load's start.
type step struct {
	At   time.Duration
	Kind string // add N, term N (newest first), kill (and replace) one, replace one, redis-restart
	N    int
}

// A scenario is a fleet's history under one load.
type scenario struct {
	Name     string
	Replicas int
	Run      time.Duration
	Steps    []step
	Skew     bool // every caller on replica 0
}

var scenarios = []scenario{
	{Name: "start", Replicas: 3, Run: 10 * time.Second},
	// Scale-down takes the newest first, as a Kubernetes ReplicaSet does.
	{Name: "scale", Replicas: 3, Run: 18 * time.Second, Steps: []step{{6 * time.Second, "add", 3}, {12 * time.Second, "term", 4}}},
	{Name: "kill", Replicas: 3, Run: 14 * time.Second, Steps: []step{{6 * time.Second, "kill", 1}}},
	{Name: "rolling", Replicas: 3, Run: 18 * time.Second, Steps: []step{{4 * time.Second, "replace", 1}, {8 * time.Second, "replace", 1}, {12 * time.Second, "replace", 1}}},
	{Name: "redis-restart", Replicas: 3, Run: 14 * time.Second, Steps: []step{{6 * time.Second, "redis-restart", 0}}},
	{Name: "skew", Replicas: 3, Run: 8 * time.Second, Skew: true},
}

// scaled returns sc with every time multiplied by f, the run rounded to
// whole seconds so that its last second is whole too.
func (sc scenario) scaled(f float64) scenario {
	mul := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	sc.Run, sc.Steps = max(time.Second, mul(sc.Run).Round(time.Second)), slices.Clone(sc.Steps)
	for i := range sc.Steps {
		sc.Steps[i].At = mul(sc.Steps[i].At)
	}
	return sc
}

// An Event is a step as it happened, in seconds from the load's start.
type Event struct {
	At   float64 `json:"at_s"`
	Done float64 `json:"done_s"`
	What string  `json:"what"`
}

// A fleet is one scenario's replicas. live is what the callers spread
// over, oldest first; a replica leaves it before it is told to stop, as
// a load balancer drains an endpoint, but a killed one only after.
type fleet struct {
	lab     *lab
	variant string
	prefix  string
	n       atomic.Int64
	mu      sync.Mutex // serialises changes of live
	live    atomic.Pointer[[]*replica]
	stops   sync.WaitGroup
}

func (f *fleet) add(ctx context.Context, n int) error {
	errs := make(chan error, n)
	for range n {
		go func() {
			r, err := f.lab.start(ctx, f.variant, f.prefix, f.variant+"-"+strconv.FormatInt(f.n.Add(1), 10))
			if err == nil {
				f.update(func(rs []*replica) []*replica { return append(rs, r) })
			}
			errs <- err
		}()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (f *fleet) update(fn func([]*replica) []*replica) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs := fn(slices.Clone(f.replicas()))
	f.live.Store(&rs)
}

func (f *fleet) replicas() []*replica {
	if p := f.live.Load(); p != nil {
		return *p
	}
	return nil
}

// take removes the replica at i (negative: from the end) from live.
func (f *fleet) take(i int) *replica {
	var r *replica
	f.update(func(rs []*replica) []*replica {
		if i < 0 {
			i += len(rs)
		}
		r = rs[i]
		return slices.Delete(rs, i, i+1)
	})
	return r
}

// do carries out one step.
func (f *fleet) do(ctx context.Context, s step) error {
	switch s.Kind {
	case "add":
		return f.add(ctx, s.N)
	case "term":
		for range s.N {
			r := f.take(-1)
			f.stops.Go(r.term)
		}
	case "kill":
		r := f.replicas()[0]
		r.kill()
		f.take(0)
		return f.add(ctx, 1)
	case "replace":
		if err := f.add(ctx, 1); err != nil {
			return err
		}
		r := f.take(0)
		f.stops.Go(r.term)
	case "redis-restart":
		return f.lab.redis.Restart()
	default:
		return fmt.Errorf("unknown step %q", s.Kind)
	}
	return nil
}

// callTimeout bounds a call, so that a caller stuck on a dead replica
// moves on.
const callTimeout = time.Second

// runScenario starts sc's fleet of variant, loads it with callers for
// sc.Run while the steps happen, and returns what the callers saw.
func (l *lab) runScenario(ctx context.Context, variant string, sc scenario, callers int) (*Result, error) {
	f := &fleet{lab: l, variant: variant, prefix: "churn-" + sc.Name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	if variant == "ratelimit" { // its keys have no prefix: start from nothing
		if _, err := redistest.Do(l.redis.Addr, "FLUSHALL"); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, r := range f.replicas() {
			r.kill()
		}
		f.stops.Wait()
	}()
	if err := f.add(ctx, sc.Replicas); err != nil {
		return nil, err
	}
	secs := int((sc.Run + time.Second - 1) / time.Second)
	per := func() []atomic.Int64 { return make([]atomic.Int64, secs) }
	calls, over, errs := per(), per(), per()
	logs := make([][]time.Duration, callers)
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: descKey, Value: descVal}}},
	}}
	// envoyproxy/ratelimit's windows are wall-clock seconds: starting on
	// one lines them up with the per-second counts.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Until(time.Now().Truncate(time.Second).Add(time.Second))):
	}
	lctx, cancel := context.WithTimeout(ctx, sc.Run)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range callers {
		// Each caller logs alone, into room for twice its share of the
		// allowance: no lock on the path being measured.
		logs[i] = make([]time.Duration, 0, 2*(burst+rate*secs)/callers)
		wg.Go(func() {
			for off := 0; lctx.Err() == nil; {
				rs := f.replicas()
				if len(rs) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				r := rs[0]
				if !sc.Skew {
					r = rs[(i+off)%len(rs)]
				}
				sent := time.Since(start)
				cctx, ccancel := context.WithTimeout(lctx, callTimeout)
				resp, err := r.stub.ShouldRateLimit(cctx, req)
				ccancel()
				got := time.Since(start)
				if lctx.Err() != nil || got >= sc.Run {
					return
				}
				calls[sent/time.Second].Add(1)
				switch {
				case err != nil:
					errs[got/time.Second].Add(1)
					off++ // to the next live replica
					time.Sleep(time.Millisecond)
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					logs[i] = append(logs[i], got)
				default:
					over[got/time.Second].Add(1)
				}
			}
		})
	}
	var events []Event
	var stepErr error
	for _, s := range sc.Steps {
		select {
		case <-lctx.Done():
		case <-time.After(time.Until(start.Add(s.At))):
			at := time.Since(start)
			err := f.do(ctx, s)
			events = append(events, Event{At: at.Seconds(), Done: time.Since(start).Seconds(), What: fmt.Sprintf("%s %d", s.Kind, s.N)})
			if err != nil && stepErr == nil {
				stepErr = fmt.Errorf("%s at %v: %w", s.Kind, s.At, err)
			}
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if stepErr != nil {
		return nil, stepErr
	}
	ok := slices.Concat(logs...)
	slices.Sort(ok)
	load := func(a []atomic.Int64) []int64 {
		out := make([]int64, len(a))
		for i := range a {
			out[i] = a[i].Load()
		}
		return out
	}
	res := analyse(ok, load(calls), load(over), load(errs), sc.Run)
	res.Variant, res.Scenario, res.Replicas, res.Events = variant, sc.Name, sc.Replicas, events
	return res, nil
}
