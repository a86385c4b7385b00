package rlqsclient

import (
	"context"
	"errors"
	"github.com/floodgate-go/floodgate/rls/internal/bucketid"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
)

var (
	_ floodgate.Store    = (*Client)(nil)
	_ floodgate.Peeker   = (*Client)(nil)
	_ floodgate.Resetter = (*Client)(nil)
)

// ErrClosed is returned by [Client.Report] and [Client.Run] once the
// Client is closed.
var ErrClosed = errors.New("rlqsclient: client closed")

// A Client decides takes locally under the shares an RLQS server assigns
// this process, and reports every key's usage on one stream; see the
// package doc. It implements [floodgate.Store], [floodgate.Peeker] and
// [floodgate.Resetter]. Results are decided by [floodgate.SourceLease]
// under an assignment (a token bucket, or a blanket rule), and by
// [floodgate.SourceFallback] under the no-assignment behaviour.
//
// A Client is safe for concurrent use; the zero Client is not usable:
// build one with [New], call [Client.Run] to report, and [Client.Close]
// when done.
type Client struct {
	rpc    rlqspb.RateLimitQuotaServiceClient
	domain string
	o      options
	local  *keyed.Map // one bucket per BucketId, by its name

	ctx    context.Context // the streams' parent, cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the streams' goroutines

	sendMu sync.Mutex // a stream's sends are serialized

	mu      sync.RWMutex
	closed  bool
	keys    map[string]*bucket // by key
	ids     map[string]*bucket // reported buckets, by name
	pending []*bucket          // subscribed, not yet reported
	stream  *stream            // nil while down

	// For tests: stream events handled (responses applied, streams ended).
	evMu     sync.Mutex
	received int
	notify   chan struct{}
}

// bucket is one RLQS bucket: a BucketId, its assignment and its counts.
type bucket struct {
	id   *rlqspb.BucketId // nil: never reported (WithBucketID gave none)
	name string           // its key in the local Map; for an id, its canonical form

	a               atomic.Pointer[assignment] // nil: none yet
	allowed, denied atomic.Uint64              // since the last report
	lastReport      time.Time                  // under Client.mu
	fallback        atomic.Pointer[floodgate.Limit]
}

// assignment is what the server assigned a bucket: a local limit
// (floodgate.Inf for ALLOW_ALL, the zero Limit for DENY_ALL), until expires
// (zero: never).
type assignment struct {
	lim     floodgate.Limit
	expires time.Time
}

// stream is one open RLQS stream.
type stream struct {
	st     rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc
	kick   chan struct{} // wakes the subscription sender
}

// New returns a Client for domain (the domain of every report, which the
// server matches its config against) on cc. It opens no stream and starts
// no goroutine: [Client.Run] or [Client.Report] does. The error wraps
// floodgate.ErrInvalidOption for a nil cc, an empty domain or an invalid
// option.
func New(cc grpc.ClientConnInterface, domain string, opts ...Option) (*Client, error) {
	switch {
	case cc == nil:
		return nil, invalid("New: nil ClientConnInterface")
	case domain == "":
		return nil, invalid("New: empty domain")
	}
	o := defaults()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	// Two keys per bucket at most (a bucket's, and overflowing keys'
	// own), and room to spare: the Map must not evict a live bucket.
	local, err := keyed.New(keyed.WithClock(o.clock), keyed.WithCapacity(2*o.capacity+1024))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{rpc: rlqspb.NewRateLimitQuotaServiceClient(cc), domain: domain, o: o, local: local,
		ctx: ctx, cancel: cancel, keys: map[string]*bucket{}, ids: map[string]*bucket{},
		notify: make(chan struct{})}, nil
}

// TakeN takes n tokens from key's bucket under its assignment, or under the
// no-assignment behaviour applied to lim, and counts n requests allowed or
// denied for the next report. The first take of a key subscribes it: its
// BucketId is reported at once, on the stream's goroutine, if the stream is
// open (else by the next [Client.Report]). The context is not used: a take
// never waits on the network. Errors are the keyed store's: an invalid
// limit, a negative n, or n over the burst ([floodgate.ErrExceedsBurst],
// with a refused Result, counted as n denied).
func (c *Client) TakeN(_ context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	c.mu.RLock()
	b := c.keys[key]
	c.mu.RUnlock()
	if b == nil {
		if err := lim.Validate(); err != nil {
			return floodgate.Result{}, err
		}
		if n < 0 {
			return floodgate.Result{}, floodgate.ErrNegativeN
		}
		b = c.subscribe(key, lim)
	}
	now := c.o.clock.Now()
	use, src := c.limit(b, lim, now)
	if use.IsZero() && !use.IsInf() && n > 0 {
		// DENY_ALL, or a no-assignment behaviour that denies: refused
		// until the next assignment, which a report can bring.
		b.denied.Add(uint64(n))
		return floodgate.Result{Limit: use, RetryAfter: c.o.interval, Source: src}, nil
	}
	res, err := c.local.TakeAt(b.name, use, n, now)
	if err != nil && !errors.Is(err, floodgate.ErrExceedsBurst) {
		return res, err
	}
	res.Source = src
	if b.id != nil && n > 0 {
		if res.Allowed {
			b.allowed.Add(uint64(n))
		} else {
			b.denied.Add(uint64(n))
		}
	}
	return res, err
}

// Peek reports key's bucket under its assignment, or under the
// no-assignment behaviour applied to lim, without taking from it; a key
// never taken from is reported full and is not subscribed.
func (c *Client) Peek(_ context.Context, key string, lim floodgate.Limit) (floodgate.Result, error) {
	c.mu.RLock()
	b := c.keys[key]
	c.mu.RUnlock()
	if b == nil {
		res, err := c.local.TakeAt("k"+key, c.o.noAssignment(lim), 0, c.o.clock.Now())
		res.Source = floodgate.SourceFallback
		return res, err
	}
	now := c.o.clock.Now()
	use, src := c.limit(b, lim, now)
	res, err := c.local.TakeAt(b.name, use, 0, now)
	res.Source = src
	return res, err
}

// Reset refills key's local bucket. It keeps the key's subscription and
// assignment: the quota is the server's to reset.
func (c *Client) Reset(ctx context.Context, key string) error {
	c.mu.RLock()
	b := c.keys[key]
	c.mu.RUnlock()
	if b == nil {
		return nil
	}
	return c.local.Reset(ctx, b.name)
}

// limit returns the limit b is held to at now, and the source it comes
// from: its assignment while it lives, else the no-assignment behaviour
// applied to lim.
func (c *Client) limit(b *bucket, lim floodgate.Limit, now time.Time) (floodgate.Limit, floodgate.Source) {
	if a := b.a.Load(); a != nil && (a.expires.IsZero() || now.Before(a.expires)) {
		return a.lim, floodgate.SourceLease
	}
	return c.o.noAssignment(lim), floodgate.SourceFallback
}

// subscribe returns key's bucket, creating it and queuing its first report
// when the key is new. Past the capacity, the bucket it returns is the
// key's own, unreported and not kept.
func (c *Client) subscribe(key string, lim floodgate.Limit) *bucket {
	// The BucketId function runs outside the lock: it is the caller's.
	m := c.o.bucketID(key, lim)
	var name string
	if len(m) > 0 {
		name = bucketid.Name(m)
	}
	c.mu.Lock()
	if b := c.keys[key]; b != nil {
		c.mu.Unlock()
		return b
	}
	if len(c.keys) >= c.o.capacity || c.closed {
		c.mu.Unlock()
		return &bucket{name: "k" + key}
	}
	var b *bucket
	switch {
	case name == "":
		b = &bucket{name: "k" + key}
	case c.ids[name] != nil:
		b = c.ids[name] // another key's BucketId: one bucket
	default:
		b = &bucket{id: &rlqspb.BucketId{Bucket: m}, name: "b" + name, lastReport: c.o.clock.Now()}
		c.ids[name] = b
		c.pending = append(c.pending, b)
	}
	c.keys[key] = b
	st := c.stream
	c.mu.Unlock()
	if st != nil {
		select {
		case st.kick <- struct{}{}:
		default:
		}
	}
	return b
}

// Run reports every bucket's usage at once, then every report interval,
// on the caller's goroutine, until ctx ends (it returns ctx's error) or
// the Client is closed (it returns nil). A report that cannot be sent
// (the stream is down and cannot be opened) does not stop Run: its counts
// go into the next one.
func (c *Client) Run(ctx context.Context) error {
	t := time.NewTicker(c.o.interval)
	defer t.Stop()
	for {
		if err := c.Report(ctx); errors.Is(err, ErrClosed) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Report sends one report of every bucket now, idle ones included, as
// [Client.Run] does each interval, opening the stream first if it is down.
// It returns an error if the stream cannot be opened or the send fails;
// the counts are then kept for the next report only when the stream could
// not be opened. Report blocks while the stream is flow-controlled; tests
// driving a fake clock call it directly.
func (c *Client) Report(ctx context.Context) error {
	st, err := c.open(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	all := make([]*bucket, 0, len(c.ids))
	for _, b := range c.ids {
		all = append(all, b)
	}
	c.pending = c.pending[:0]
	rep := c.build(all)
	c.mu.Unlock()
	if rep == nil {
		return nil
	}
	return c.send(st, rep)
}

// open returns the open stream, opening one if there is none.
func (c *Client) open(ctx context.Context) (*stream, error) {
	c.mu.RLock()
	st, closed := c.stream, c.closed
	c.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if st != nil {
		return st, nil
	}
	sctx, cancel := context.WithCancel(c.ctx)
	// The stream lives past ctx: ctx bounds only the wait for it to open.
	stop := context.AfterFunc(ctx, cancel)
	gst, err := c.rpc.StreamRateLimitQuotas(sctx)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	st = &stream{st: gst, cancel: cancel, kick: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.closed || c.stream != nil {
		// Closed, or another Report opened one meanwhile.
		cur := c.stream
		c.mu.Unlock()
		cancel()
		if cur == nil {
			return nil, ErrClosed
		}
		return cur, nil
	}
	c.stream = st
	c.wg.Add(2)
	c.mu.Unlock()
	go c.receive(st)
	go c.subscriptions(st)
	return st, nil
}

// build makes a report of bs at now, resetting their counts; nil for none.
// Called with c.mu held.
func (c *Client) build(bs []*bucket) *rlqspb.RateLimitQuotaUsageReports {
	if len(bs) == 0 {
		return nil
	}
	now := c.o.clock.Now()
	rep := &rlqspb.RateLimitQuotaUsageReports{Domain: c.domain,
		BucketQuotaUsages: make([]*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, 0, len(bs))}
	for _, b := range bs {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           b.id,
			TimeElapsed:        durationpb.New(max(0, now.Sub(b.lastReport))),
			NumRequestsAllowed: b.allowed.Swap(0),
			NumRequestsDenied:  b.denied.Swap(0),
		})
		b.lastReport = now
	}
	return rep
}

// send sends rep on st; a failure ends the stream, for the next report to
// open another.
func (c *Client) send(st *stream, rep *rlqspb.RateLimitQuotaUsageReports) error {
	c.sendMu.Lock()
	err := st.st.Send(rep)
	c.sendMu.Unlock()
	if err != nil {
		c.drop(st)
	}
	return err
}

// drop forgets st, if it is the open stream, and cancels it.
func (c *Client) drop(st *stream) {
	c.mu.Lock()
	if c.stream == st {
		c.stream = nil
	}
	c.mu.Unlock()
	st.cancel()
}

// subscriptions sends the reports of new buckets, each at once, until st
// ends.
func (c *Client) subscriptions(st *stream) {
	defer c.wg.Done()
	ctx := st.st.Context()
	for {
		select {
		case <-ctx.Done():
			return
		case <-st.kick:
		}
		c.mu.Lock()
		rep := c.build(c.pending)
		c.pending = c.pending[:0]
		c.mu.Unlock()
		if rep != nil && c.send(st, rep) != nil {
			return
		}
	}
}

// receive applies st's responses until it ends.
func (c *Client) receive(st *stream) {
	defer c.wg.Done()
	for {
		resp, err := st.st.Recv()
		if err != nil {
			// Assignments run on to their TTL; the next report reconnects.
			c.drop(st)
			c.event()
			return
		}
		c.apply(resp)
		c.event()
	}
}

// apply applies a response's actions to the buckets they name; an action
// for a bucket the Client does not hold, or that it cannot read, is
// ignored, as Envoy ignores it.
func (c *Client) apply(resp *rlqspb.RateLimitQuotaResponse) {
	now := c.o.clock.Now()
	for _, act := range resp.GetBucketAction() {
		id := act.GetBucketId().GetBucket()
		if len(id) == 0 {
			continue
		}
		name := bucketid.Name(id)
		c.mu.RLock()
		b := c.ids[name]
		c.mu.RUnlock()
		if b == nil {
			continue
		}
		if act.GetAbandonAction() != nil {
			c.abandon(name, b)
			continue
		}
		qa := act.GetQuotaAssignmentAction()
		lim, ok := strategyLimit(qa.GetRateLimitStrategy())
		if !ok {
			continue // the old assignment stands, as in Envoy
		}
		a := &assignment{lim: lim}
		if ttl := qa.GetAssignmentTimeToLive(); ttl != nil && ttl.AsDuration() > 0 {
			a.expires = now.Add(ttl.AsDuration())
		}
		b.a.Store(a)
	}
}

// abandon forgets the bucket and every key that maps to it: the next take
// of one subscribes it again.
func (c *Client) abandon(name string, b *bucket) {
	c.mu.Lock()
	delete(c.ids, name)
	for k, kb := range c.keys {
		if kb == b {
			delete(c.keys, k)
		}
	}
	c.pending = slices.DeleteFunc(c.pending, func(p *bucket) bool { return p == b })
	c.mu.Unlock()
	_ = c.local.Reset(context.Background(), b.name)
}

// strategyLimit reads a strategy as a local limit: a token bucket's rate is
// tokens_per_fill (1 when unset, as the API says) per fill_interval, its
// burst max_tokens; ALLOW_ALL is floodgate.Inf, DENY_ALL the zero Limit.
// It reports false for what it cannot enforce: no strategy,
// requests_per_time_unit, a fill interval ≤ 0 or a max_tokens of 0.
func strategyLimit(s *typev3.RateLimitStrategy) (floodgate.Limit, bool) {
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		switch st.BlanketRule {
		case typev3.RateLimitStrategy_ALLOW_ALL:
			return floodgate.Inf, true
		case typev3.RateLimitStrategy_DENY_ALL:
			return floodgate.Limit{}, true
		}
	case *typev3.RateLimitStrategy_TokenBucket:
		tb := st.TokenBucket
		fill := tb.GetFillInterval().AsDuration()
		if fill <= 0 || tb.GetMaxTokens() == 0 || int64(tb.GetMaxTokens()) > floodgate.MaxBurst {
			return floodgate.Limit{}, false
		}
		per := uint32(1)
		if v := tb.GetTokensPerFill(); v != nil {
			per = v.GetValue()
		}
		return floodgate.Limit{Rate: float64(per) / fill.Seconds(), Burst: int(tb.GetMaxTokens())}, true
	}
	return floodgate.Limit{}, false
}

// event records a handled stream event, for tests.
func (c *Client) event() {
	c.evMu.Lock()
	c.received++
	close(c.notify)
	c.notify = make(chan struct{})
	c.evMu.Unlock()
}

// Close ends the stream and waits for its goroutines; takes go on, under
// the assignments in force until they lapse. Report and Run return once it
// is closed. Close is idempotent and returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.stream = nil
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}
