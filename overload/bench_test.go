package overload

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

// The controller's own work for an admitted call: Enter, Acquire and Done
// in an open server, across 100 flows.
func BenchmarkAdmitted(b *testing.B) {
	c, err := New(WithLimits(1<<20, 1<<20))
	if err != nil {
		b.Fatal(err)
	}
	flows := benchFlows(100)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		f := flows[i%len(flows)]
		i++
		cctx, in := c.Enter(ctx, f)
		if !in {
			b.Fatal("shed in an open server")
		}
		p, err := c.Acquire(cctx, f)
		if err != nil {
			b.Fatal(err)
		}
		p.Done()
	}
}

// The controller's own work for a call shed at the tap: Enter for the
// flood's calls in a server whose places the flood holds, beside 100
// quieter flows remembered.
func BenchmarkShedAtTheTap(b *testing.B) {
	c, err := New(WithLimits(1, 1))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, f := range benchFlows(100) {
		cctx, _ := c.Enter(ctx, f)
		c.Leave(cctx)
	}
	flood := Flow{Key: "flood"}
	for {
		if _, in := c.Enter(ctx, flood); !in {
			break
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, in := c.Enter(ctx, flood); in {
			b.Fatal("the flood's call entered a server its calls fill")
		}
	}
}

func benchFlows(n int) []Flow {
	flows := make([]Flow, n)
	for i := range flows {
		flows[i] = Flow{Key: fmt.Sprint("tenant-", i)}
	}
	return flows
}

// The controller's work, per call in an overload, that looks at the flows,
// as the number of flows with calls inside and waiting grows: the tap's
// choice of a flow to take a place from (for a light tenant's call), the
// queue's choice of a waiting call to displace (for a flood's call), and a
// freed slot handed to the next waiting call by start-time fair queueing.
// One slot; a flood holds 100 places and n light flows hold one each, with
// one call waiting; the flood's calls are let in the most, and one light
// flow, s, holds the slot and gets it back each time (the others have
// started so many calls that their virtual start times are ahead of it).
func BenchmarkFlows(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		b.Run(fmt.Sprint("flows=", n), func(b *testing.B) {
			clk := &stepClock{}
			c, err := New(WithLimits(1, 1), WithClock(clk), WithQueueTarget(time.Hour))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for range 16 { // a latency known, and places for every flow
				tctx, _ := c.Enter(ctx, Flow{Key: "teach"})
				p, err := c.Acquire(tctx, Flow{Key: "teach"})
				if err != nil {
					b.Fatal(err)
				}
				clk.advance(time.Millisecond)
				p.Done()
			}
			flood := Flow{Key: "flood"}
			for range 100 {
				if _, in := c.Enter(ctx, flood); !in {
					b.Fatal("the flood was shed at the tap")
				}
			}
			lights := benchFlows(n)
			for _, f := range lights {
				if _, in := c.Enter(ctx, f); !in {
					b.Fatal("a light flow was shed at the tap")
				}
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			now := c.o.now()
			wait := func(fl *flow) { c.enqueueLocked(&waiter{ch: make(chan struct{}, 1), f: fl, at: now}) }
			fls := make([]*flow, n)
			for i, f := range lights {
				fls[i] = c.flows[flowKey{key: f.Key}]
				if i > 0 {
					fls[i].vt = math.Inf(1)
				}
				wait(fls[i])
			}
			s, fl := fls[0], c.flows[flowKey{key: flood.Key}]
			c.dispatchLocked(now)
			wait(s)
			if s.inflight != 1 || c.queued != n {
				b.Fatalf("inflight %d, queued %d; want s's call running and %d waiting", s.inflight, c.queued, n)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if v := c.displacedLocked(fls[i%n], now); v != fl {
					b.Fatalf("a light flow's call would take a place of %v, want the flood's", v)
				}
				if v := c.victimLocked(fl, now); v != s {
					b.Fatalf("the flood's call would displace a call of %v, want s's", v)
				}
				c.releaseLocked(s, nil)
				c.dispatchLocked(now)
				wait(s)
				i++
			}
		})
	}
}
