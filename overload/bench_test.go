package overload

import (
	"context"
	"fmt"
	"testing"
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
