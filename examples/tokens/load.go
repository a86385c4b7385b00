package main

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/middleware"
	completionv1 "github.com/floodgate-go/floodgate/proto/completion/v1"
)

// An outcome is how a call ended, for the caller.
type outcome int

const (
	served        outcome = iota
	rejectedQuota         // refused for want of tokens
	rejectedDebt          // refused while the tenant's bucket owes tokens
	failed                // the server failed or went away (a killed worker)
	outcomes
)

// noEstimate is the estimate of a caller that states none.
const noEstimate = -1

// A target makes one call of one strategy on worker w: a reply of n
// tokens, the caller stating estimate (or noEstimate). It returns the
// tokens the caller received, the whole reply or, from a call that failed
// midway, its part, and how the call ended.
type target interface {
	call(ctx context.Context, w int, tenant string, n, estimate int) (int, outcome)
}

// classify tells the quota's rejections from failures.
func classify(err error) outcome {
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted {
		return failed
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == middleware.ReasonDebt.ErrorReason() {
			return rejectedDebt
		}
	}
	return rejectedQuota
}

// grpcTarget calls a strategy's servers, one connection per worker.
type grpcTarget struct {
	clients []completionv1.CompletionClient
}

func (g *grpcTarget) call(ctx context.Context, w int, tenant string, n, estimate int) (int, outcome) {
	md := metadata.Pairs(tenantHeader, tenant)
	if estimate != noEstimate {
		md.Append(estimateHeader, strconv.Itoa(estimate))
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), 10*maxLasts)
	defer cancel()
	stream, err := g.clients[w].Complete(ctx, &completionv1.CompleteRequest{Prompt: "Say something.", ReplyTokens: int32(n)})
	if err != nil {
		return 0, classify(err)
	}
	got := 0
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, served
		}
		if err != nil {
			return got, classify(err)
		}
		got += int(m.GetTokens())
	}
}

// A sample is the tokens a call delivered and when it ended, since the
// start of the run.
type sample struct {
	at     time.Duration
	tokens int
}

// A tally is what one strategy delivered to one tenant.
type tally struct {
	mu      sync.Mutex
	samples []sample // calls that delivered tokens
	calls   [outcomes]int
}

func (t *tally) add(at time.Duration, tokens int, o outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls[o]++
	if tokens > 0 {
		t.samples = append(t.samples, sample{at, tokens})
	}
}

// A load is the demand every strategy meets alike: closed-loop callers
// that call back to back, or open-loop arrivals at a rate. Each caller
// draws its calls' lengths from a seeded source of its own, so that each
// strategy is asked for the same replies in the same order.
type load struct {
	clock    clock
	start    time.Time
	duration time.Duration
	tenants  []string
	// callers is the closed-loop callers per tenant; 0 for open-loop
	// arrivals, rate calls a second per tenant.
	callers int
	rate    float64
	// estimate is the estimate a caller states for a reply of n tokens.
	estimate func(n int) int
	// backoff is the mean wait of a caller after a rejection, before it
	// asks again for the same reply (jittered by ±50%).
	backoff time.Duration
	workers int
	seed    uint64
}

func (l *load) since() time.Duration { return l.clock.Now().Sub(l.start) }

// run puts the load on each target until its duration is up and returns
// the tallies, by target and tenant.
func (l *load) run(ctx context.Context, targets []target) [][]*tally {
	out := make([][]*tally, len(targets))
	for s, t := range targets {
		out[s] = make([]*tally, len(l.tenants))
		for ti, tenant := range l.tenants {
			tl := new(tally)
			out[s][ti] = tl
			if l.callers == 0 {
				l.clock.Go(func() { l.arrivals(ctx, t, tl, tenant, ti) })
				continue
			}
			for i := range l.callers {
				l.clock.Go(func() { l.caller(ctx, t, tl, tenant, ti, i) })
			}
		}
	}
	l.clock.Wait()
	return out
}

// caller calls back to back, asking again for the same reply after a
// rejection, and moving to the next worker after a failure.
func (l *load) caller(ctx context.Context, t target, tl *tally, tenant string, ti, i int) {
	lengths := rand.New(rand.NewPCG(l.seed, uint64(ti)<<32|uint64(i)))
	jitter := rand.New(rand.NewPCG(^l.seed, uint64(ti)<<32|uint64(i)))
	w := i % l.workers
	n := drawReply(lengths)
	for ctx.Err() == nil && l.since() < l.duration {
		got, o := t.call(ctx, w, tenant, n, l.estimate(n))
		tl.add(l.since(), got, o)
		if o == served {
			n = drawReply(lengths)
			continue
		}
		if o == failed {
			n, w = drawReply(lengths), (w+1)%l.workers
		}
		l.clock.Sleep(ctx, time.Duration(float64(l.backoff)*(0.5+jitter.Float64())))
	}
}

// arrivals starts calls at Poisson arrivals, each on the next worker that
// has not failed; a rejected call is not asked again.
func (l *load) arrivals(ctx context.Context, t target, tl *tally, tenant string, ti int) {
	r := rand.New(rand.NewPCG(l.seed, uint64(ti)<<32|1<<31))
	down := make([]atomic.Bool, l.workers)
	next := 0
	for {
		l.clock.Sleep(ctx, time.Duration(r.ExpFloat64()/l.rate*float64(time.Second)))
		if ctx.Err() != nil || l.since() >= l.duration {
			return
		}
		n := drawReply(r)
		w := next
		for k := range l.workers {
			if w = (next + k) % l.workers; !down[w].Load() {
				break
			}
		}
		next = (w + 1) % l.workers
		l.clock.Go(func() {
			got, o := t.call(ctx, w, tenant, n, l.estimate(n))
			if o == failed {
				down[w].Store(true)
			}
			tl.add(l.since(), got, o)
		})
	}
}
