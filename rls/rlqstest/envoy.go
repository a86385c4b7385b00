package rlqstest

import (
	"context"
	"errors"
	"github.com/floodgate-go/floodgate/rls/internal/bucketid"
	"sort"
	"strconv"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// DefaultReportInterval is Envoy's report interval: hard-coded at 5000 ms,
// whatever the bucket's reporting_interval says (filter_persistence.cc:41-44,
// P@93e15bf).
const DefaultReportInterval = 5 * time.Second

var (
	// ErrClosed is returned by Report after Close.
	ErrClosed = errors.New("rlqstest: envoy closed")
	// ErrNoStream is returned, wrapped with the cause, by Report when the
	// stream was down and could not be restarted: Envoy then drops the report
	// it has already built, counters included (global_client_impl.cc:419-428,
	// GC@c33e7f8).
	ErrNoStream = errors.New("rlqstest: no RLQS stream, report dropped")
)

// Settings are the bucket settings of the simulated filter
// (RateLimitQuotaBucketSettings), shared by all buckets. The zero value is
// Envoy's defaults.
type Settings struct {
	// ReportInterval is how often Run calls Report. Zero means
	// DefaultReportInterval, 5 s: Envoy ignores reporting_interval
	// (filter_persistence.cc:41-44, P@93e15bf). Negative is an error.
	ReportInterval time.Duration

	// NoAssignment is no_assignment_behavior.fallback_rate_limit: what a bucket
	// does before its first assignment, after an abandon, and after its
	// assignment (and any fallback) expires. Nil means ALLOW_ALL
	// (filter.cc:149-163, F@1736899). Only a blanket rule is accepted: a bucket
	// is created with no token bucket, and filter.cc:312 (F@1736899) would
	// dereference that null limiter, so a token bucket here crashes Envoy;
	// NewEnvoy returns an error instead.
	NoAssignment *typev3.RateLimitStrategy

	// ExpiredFallback is expired_assignment_behavior.fallback_rate_limit: what
	// an expired assignment is replaced with, for ExpiredTimeout. Nil means
	// none: expiry reverts to NoAssignment at once
	// (global_client_impl.cc:459-474, GC@c33e7f8). Envoy ignores
	// reuse_last_assignment, so it has no counterpart here (filter.cc:168-173,
	// F@1736899).
	ExpiredFallback *typev3.RateLimitStrategy

	// ExpiredTimeout is expired_assignment_behavior_timeout: how long the
	// fallback lasts before the bucket reverts to NoAssignment
	// (global_client_impl.cc:476-551, GC@c33e7f8). Envoy keeps whole seconds
	// only and defaults to 0, so the fallback ends at once unless this is at
	// least 1 s (filter.cc:174-186, F@1736899). Negative is an error.
	ExpiredTimeout time.Duration

	// Now is the clock of token buckets, TTLs, the fallback timeout and
	// time_elapsed. Nil means time.Now. Run ticks on the real clock whatever
	// Now is.
	Now func() time.Time
}

// Source says where a bucket's current behaviour comes from.
type Source int

const (
	// NoAssignment: no assignment yet, or it expired (Settings.NoAssignment).
	NoAssignment Source = iota
	// Assigned: the server's last accepted quota assignment.
	Assigned
	// Fallback: Settings.ExpiredFallback, after the assignment expired.
	Fallback
	// Abandoned: the server abandoned the bucket; the next Request
	// resubscribes it.
	Abandoned
)

var sourceNames = [...]string{"NoAssignment", "Assigned", "Fallback", "Abandoned"}

func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// BucketStats describe one bucket, as of the call to Stats.
type BucketStats struct {
	// Bucket is the BucketId map.
	Bucket map[string]string
	// Allowed and Denied count every request decided since the bucket's first
	// one, across abandons; reports carry them per interval instead.
	Allowed, Denied uint64
	// Source is where the current behaviour comes from.
	Source Source
	// Strategy is the strategy in force: the assignment's, the fallback's, or
	// Settings.NoAssignment (ALLOW_ALL when that is nil). Nil when Abandoned,
	// or when the server sent an action with neither assignment nor abandon.
	Strategy *typev3.RateLimitStrategy
	// Rate (tokens per second, possibly +Inf or NaN as Envoy computes it),
	// Burst (max_tokens) and Tokens (remaining now) describe the token
	// bucket, when Strategy is one; they are zero otherwise.
	Rate   float64
	Burst  uint64
	Tokens float64
	// Expires is when the assignment's TTL (Assigned) or the fallback
	// (Fallback) ends; zero otherwise.
	Expires time.Time
}

// Envoy is an RLQS client that behaves as Envoy's rate_limit_quota filter
// with one set of bucket settings and one domain. See the package
// documentation for the model. Its methods are safe for concurrent use.
type Envoy struct {
	client     rlqspb.RateLimitQuotaServiceClient
	domain     string
	interval   time.Duration
	noAssign   *typev3.RateLimitStrategy
	fallback   *typev3.RateLimitStrategy
	fallbackTO time.Duration
	now        func() time.Time
	boot       time.Time // the simulated host's boot, origin of the monotonic clock

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup

	// sendMu orders sends on the stream, which allows one sender at a time.
	// It is taken while mu is held, then mu is released for the send itself,
	// so the receiving goroutine (which takes only mu) never waits on it.
	sendMu sync.Mutex

	mu       sync.Mutex
	closed   bool
	started  bool // stream_tried_by_bucket_creation_ (global_client_impl.cc:166-178, GC@c33e7f8)
	stream   rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	streams  int
	buckets  map[string]*bucket
	totals   map[string]*total
	received int
	notify   chan struct{} // closed and replaced whenever received grows
}

// bucket is Envoy's CachedBucket: the action in force, its limiter and timers.
type bucket struct {
	id         map[string]string
	lastReport time.Time
	allowed    uint64 // since the last report
	denied     uint64
	// action is cached_action; nil means default_action, the no-assignment
	// behaviour (filter.cc shouldAllowRequest, F@1736899).
	action  *rlqspb.RateLimitQuotaResponse_BucketAction
	limiter *tokenBucket
	// The action expiration timer (ttl) and the fallback expiration timer
	// (fb), evaluated lazily by runTimers.
	ttlArmed, fbArmed bool
	ttlEnd, fbEnd     time.Time
	source            Source
}

type total struct {
	id              map[string]string
	allowed, denied uint64
}

// NewEnvoy returns an Envoy that will talk to the RLQS server behind cc for
// domain. Nothing starts here: the stream opens at the first Request, as
// Envoy's opens at its first bucket (global_client_impl.cc:166-178,
// GC@c33e7f8). Invalid settings are an error naming the field.
func NewEnvoy(cc grpc.ClientConnInterface, domain string, s Settings) (*Envoy, error) {
	if cc == nil {
		return nil, errors.New("rlqstest: nil grpc.ClientConnInterface")
	}
	if s.ReportInterval < 0 {
		return nil, errors.New("rlqstest: Settings.ReportInterval is negative")
	}
	if s.ReportInterval == 0 {
		s.ReportInterval = DefaultReportInterval
	}
	if s.NoAssignment == nil {
		// filter.cc:149-163 (F@1736899): no no_assignment_behavior means
		// ALLOW_ALL.
		s.NoAssignment = &typev3.RateLimitStrategy{
			Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL},
		}
	} else {
		if _, ok := s.NoAssignment.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); !ok {
			return nil, errors.New("rlqstest: Settings.NoAssignment must be a blanket rule: Envoy crashes on any other (filter.cc:312, F@1736899)")
		}
		s.NoAssignment = proto.Clone(s.NoAssignment).(*typev3.RateLimitStrategy)
	}
	if err := checkBlanket(s.NoAssignment); err != nil {
		return nil, errors.New("rlqstest: Settings.NoAssignment: " + err.Error())
	}
	if s.ExpiredFallback != nil {
		if err := checkBlanket(s.ExpiredFallback); err != nil {
			return nil, errors.New("rlqstest: Settings.ExpiredFallback: " + err.Error())
		}
		s.ExpiredFallback = proto.Clone(s.ExpiredFallback).(*typev3.RateLimitStrategy)
	}
	if s.ExpiredTimeout < 0 {
		return nil, errors.New("rlqstest: Settings.ExpiredTimeout is negative")
	}
	// filter.cc:174-186 (F@1736899): only
	// expired_assignment_behavior_timeout.seconds() is kept.
	s.ExpiredTimeout = s.ExpiredTimeout.Truncate(time.Second)
	if s.Now == nil {
		s.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Envoy{
		client:     rlqspb.NewRateLimitQuotaServiceClient(cc),
		domain:     domain,
		interval:   s.ReportInterval,
		noAssign:   s.NoAssignment,
		fallback:   s.ExpiredFallback,
		fallbackTO: s.ExpiredTimeout,
		now:        s.Now,
		boot:       s.Now().Add(-hostUptime),
		ctx:        ctx,
		cancel:     cancel,
		done:       make(chan struct{}),
		buckets:    make(map[string]*bucket),
		totals:     make(map[string]*total),
		notify:     make(chan struct{}),
	}, nil
}

// checkBlanket rejects a blanket rule outside the enum: Envoy panics on it
// (PANIC_ON_PROTO_ENUM_SENTINEL_VALUES in filter.cc shouldAllowRequest,
// F@1736899).
func checkBlanket(s *typev3.RateLimitStrategy) error {
	if r, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); ok {
		if _, known := typev3.RateLimitStrategy_BlanketRule_name[int32(r.BlanketRule)]; !known {
			return errors.New("unknown blanket rule " + strconv.Itoa(int(r.BlanketRule)))
		}
	}
	return nil
}

// Key is the canonical string of a BucketId map, the key of Stats: its
// entries sorted by key, quoted, as {"api":"orders","tenant":"acme"}. Envoy
// keys buckets by a hash of the BucketId proto (filter.cc:126 (F@1736899),
// global_client_impl.cc:304 (GC@c33e7f8)), which likewise ignores map order.
func Key(bucket map[string]string) string { return bucketid.Name(bucket) }

// mono is the simulated monotonic clock of TB, in seconds since boot.
func (e *Envoy) mono(t time.Time) float64 { return t.Sub(e.boot).Seconds() }

// Request decides one request of bucket, a BucketId map, and reports whether it
// is allowed. The first request of a bucket creates it and is decided by the
// no-assignment behaviour: allowed unless that is DENY_ALL (filter.cc:47-52,
// F@1736899). It is counted, and a one-bucket report with time_elapsed 0 is
// sent at once (global_client_impl.cc:207-218, GC@c33e7f8), or, if the stream
// is down, built and lost, so that first request is never reported
// (global_client_impl.cc:228-235, GC@c33e7f8). Later requests
// take 1 token from the assignment's token bucket (filter.cc:312, F@1736899) or
// apply its blanket rule, after any TTL or fallback timer due by Settings.Now
// has run. The decision is counted for the next report.
//
// An empty map is a bucket like any other here; Envoy would send it, and ignore
// the server's answer for it (global_client_impl.cc:292-314, GC@c33e7f8).
func (e *Envoy) Request(bucket map[string]string) bool {
	now := e.now()
	key := Key(bucket)
	e.mu.Lock()
	t := e.totals[key]
	if t == nil {
		t = &total{id: cloneMap(bucket)}
		e.totals[key] = t
	}
	b := e.buckets[key]
	if b == nil {
		allowed := e.allows(nil, now)
		e.count(t, allowed)
		e.createBucket(key, bucket, now, allowed) // releases e.mu
		return allowed
	}
	e.runTimers(b, now)
	allowed := e.allows(b, now)
	if allowed {
		b.allowed++
	} else {
		b.denied++
	}
	e.count(t, allowed)
	e.mu.Unlock()
	return allowed
}

func (e *Envoy) count(t *total, allowed bool) {
	if allowed {
		t.allowed++
	} else {
		t.denied++
	}
}

// allows is F shouldAllowRequest for b (nil: a bucket not yet created, which
// filter.cc:47-52 (F@1736899) decides from the no-assignment behaviour).
func (e *Envoy) allows(b *bucket, now time.Time) bool {
	s := e.noAssign // default_action (filter.cc:149-163, F@1736899)
	if b != nil && b.action != nil {
		// A cached action with no quota assignment reads as an unset
		// strategy, which fails open (filter.cc shouldAllowRequest, F@1736899).
		s = b.action.GetQuotaAssignmentAction().GetRateLimitStrategy()
	}
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return st.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		// filter.cc:312 (F@1736899): one token per request. The limiter is
		// never nil here: NewEnvoy refuses a token-bucket NoAssignment, the one
		// case where Envoy's would be.
		return b.limiter.consume(e.mono(now))
	default:
		// requests_per_time_unit (a fallback may be one) and unset strategies
		// allow (filter.cc shouldAllowRequest, F@1736899).
		return true
	}
}

// createBucket is createBucketImpl (global_client_impl.cc:166-218, GC@c33e7f8).
// It is called with e.mu held and releases it.
func (e *Envoy) createBucket(key string, id map[string]string, now time.Time, allowed bool) {
	b := &bucket{id: cloneMap(id), lastReport: now, source: NoAssignment}
	if allowed {
		b.allowed = 1
	} else {
		b.denied = 1
	}
	e.buckets[key] = b
	// global_client_impl.cc:166-178 (GC@c33e7f8): the first bucket ever starts
	// the stream (and Envoy's report timer: here, Report starts working). A
	// failure is only logged; the next Report retries.
	if !e.started && !e.closed {
		e.started = true
		_ = e.startStream()
	}
	// global_client_impl.cc:217-218 (GC@c33e7f8): an immediate one-bucket
	// report, time_elapsed 0 (global_client_impl.cc:110-111, GC@c33e7f8).
	r := e.buildReport([]*bucket{b}, now)
	e.sendLocked(r)
}

// sendLocked sends r on the current stream, or drops it when there is none
// (sendUsageReportImpl, global_client_impl.cc:228-235 (GC@c33e7f8)). Called
// with e.mu held; releases it.
func (e *Envoy) sendLocked(r *rlqspb.RateLimitQuotaUsageReports) {
	st := e.stream
	if st == nil {
		e.mu.Unlock()
		return
	}
	e.sendMu.Lock()
	e.mu.Unlock()
	// A send error means the stream is ending; Envoy ignores it too and
	// learns of the end from onRemoteClose, here the receiving goroutine.
	_ = st.Send(r)
	e.sendMu.Unlock()
}

// buildReport is buildReports (global_client_impl.cc:89-147, GC@c33e7f8): for
// each bucket, the counters since its last report, reset here, and time_elapsed
// in whole seconds truncated (global_client_impl.cc:110-111, GC@c33e7f8);
// last_report becomes now. The domain is on every report
// (global_client_impl.cc:122, :144, GC@c33e7f8).
func (e *Envoy) buildReport(bs []*bucket, now time.Time) *rlqspb.RateLimitQuotaUsageReports {
	r := &rlqspb.RateLimitQuotaUsageReports{Domain: e.domain}
	for _, b := range bs {
		elapsed := int64(now.Sub(b.lastReport) / time.Second)
		b.lastReport = now
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: cloneMap(b.id)},
			TimeElapsed:        &durationpb.Duration{Seconds: elapsed},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied = 0, 0
	}
	return r
}

// Report sends one report of every bucket now, idle ones included, as Envoy's
// timer does (global_client_impl.cc:130-147, GC@c33e7f8); buckets are sorted by
// Key where Envoy's order is its hash map's. The report is built first,
// resetting the counters; then, if the stream is down, it is restarted, and if
// that fails the report is dropped and Report returns an error wrapping
// ErrNoStream (global_client_impl.cc:419-428, GC@c33e7f8). Before the first
// Request, Envoy has no timer and Report does nothing. Run calls Report every
// ReportInterval; tests may call it directly.
func (e *Envoy) Report() error {
	now := e.now()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	if !e.started {
		e.mu.Unlock()
		return nil
	}
	keys := make([]string, 0, len(e.buckets))
	for k := range e.buckets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	bs := make([]*bucket, len(keys))
	for i, k := range keys {
		bs[i] = e.buckets[k]
	}
	r := e.buildReport(bs, now)
	if e.stream == nil {
		if err := e.startStream(); err != nil {
			e.mu.Unlock()
			return errors.Join(ErrNoStream, err)
		}
	}
	e.sendLocked(r)
	return nil
}

// Run calls Report every ReportInterval of the real clock, re-arming after each
// report as Envoy's timer does (global_client_impl.cc:405-417, GC@c33e7f8),
// until ctx is done (it returns ctx.Err()) or the Envoy is closed (it returns
// nil). Report errors are dropped reports, as in Envoy, and do not stop Run.
func (e *Envoy) Run(ctx context.Context) error {
	t := time.NewTimer(e.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.done:
			return nil
		case <-t.C:
			_ = e.Report()
			t.Reset(e.interval)
		}
	}
}

// startStream is startStreamImpl (global_client_impl.cc, GC@c33e7f8), called
// with e.mu held. It starts the goroutine that applies the stream's responses.
func (e *Envoy) startStream() error {
	ctx, cancel := context.WithCancel(e.ctx)
	st, err := e.client.StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return err
	}
	e.stream = st
	e.streams++
	e.wg.Add(1)
	go e.receive(st, cancel)
	return nil
}

func (e *Envoy) receive(st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, cancel context.CancelFunc) {
	defer e.wg.Done()
	defer cancel()
	for {
		resp, err := st.Recv()
		e.mu.Lock()
		if err != nil {
			// onRemoteClose (global_client_impl.cc:381-388, GC@c33e7f8) only
			// forgets the stream: assignments run on to their TTL, and the next
			// Report reconnects.
			if e.stream == st {
				e.stream = nil
			}
			e.event()
			e.mu.Unlock()
			return
		}
		e.apply(resp, e.now())
		e.event()
		e.mu.Unlock()
	}
}

// event records a handled stream event; called with e.mu held.
func (e *Envoy) event() {
	e.received++
	close(e.notify)
	e.notify = make(chan struct{})
}

// Received returns how many stream events the Envoy has handled: responses
// applied, and streams that ended.
func (e *Envoy) Received() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.received
}

// WaitReceived blocks until Received is at least n, or ctx is done. Tests use
// it to know that a response the server sent, or the end of a stream, has
// been applied.
func (e *Envoy) WaitReceived(ctx context.Context, n int) error {
	for {
		e.mu.Lock()
		got, ch := e.received, e.notify
		e.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// apply is onQuotaResponseImpl (global_client_impl.cc:292-372, GC@c33e7f8),
// called with e.mu held.
func (e *Envoy) apply(resp *rlqspb.RateLimitQuotaResponse, now time.Time) {
	for _, a := range resp.GetBucketAction() {
		// global_client_impl.cc:292-314 (GC@c33e7f8): an action with no or an
		// empty id, or for a bucket Envoy does not hold, is logged and ignored.
		id := a.GetBucketId().GetBucket()
		if len(id) == 0 {
			continue
		}
		key := Key(id)
		b := e.buckets[key]
		if b == nil {
			continue
		}
		// Timers due before now fire first, as Envoy's would have.
		e.runTimers(b, now)
		var limiter *tokenBucket
		source := Assigned
		switch act := a.GetBucketAction().(type) {
		case *rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_:
			s := act.QuotaAssignmentAction.GetRateLimitStrategy()
			switch s.GetStrategy().(type) {
			case *typev3.RateLimitStrategy_BlanketRule_:
				// global_client_impl.cc:333-335 (GC@c33e7f8): applied as is.
			case *typev3.RateLimitStrategy_TokenBucket:
				// global_client_impl.cc:339-352 (GC@c33e7f8): a new limiter
				// only if the assignment differs
				// (global_client_impl.cc:244-249, GC@c33e7f8); an identical one
				// keeps the limiter and its tokens.
				if replaceTokenBucket(b, s) {
					limiter = tokenBucketFromStrategy(s, e.mono(now), b.limiter)
				} else {
					limiter = b.limiter
				}
			default:
				// global_client_impl.cc:354-360 (GC@c33e7f8):
				// requests_per_time_unit, or no strategy, is logged and
				// skipped; the old action and its timer stay.
				continue
			}
		case *rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_:
			// global_client_impl.cc:362-366 (GC@c33e7f8): the bucket is erased;
			// the next Request recreates it and resubscribes.
			delete(e.buckets, key)
			continue
		default:
			// Neither assignment nor abandon: Envoy caches the action anyway;
			// it fails open (filter.cc shouldAllowRequest, F@1736899) and its
			// TTL of 0 expires it at once.
		}
		b.action = proto.Clone(a).(*rlqspb.RateLimitQuotaResponse_BucketAction)
		b.limiter = limiter
		b.source = source
		// The old bucket's timers are not carried over (global_client_impl.cc
		// onQuotaResponseImpl, GC@c33e7f8); every accepted action starts a TTL
		// timer (global_client_impl.cc:368-372, GC@c33e7f8) of whole seconds,
		// unset or 0 firing at once (global_client_impl.cc:437-445,
		// GC@c33e7f8).
		b.fbArmed = false
		b.ttlArmed = true
		b.ttlEnd = now.Add(time.Duration(a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds()) * time.Second)
	}
}

// replaceTokenBucket is shouldReplaceTokenBucket (global_client_impl.cc,
// GC@c33e7f8): replace unless the cached action is a token bucket identical to
// s's.
func replaceTokenBucket(b *bucket, s *typev3.RateLimitStrategy) bool {
	old := b.action.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	return old == nil || !sameTokenBucket(s.GetTokenBucket(), old)
}

// runTimers fires the bucket's timers due by now, each at its own deadline: the
// action expiration timer (onActionExpirationTimer,
// global_client_impl.cc:459-474 (GC@c33e7f8)), then the fallback expiration
// timer it may arm (global_client_impl.cc:476-551, GC@c33e7f8). Called with
// e.mu held.
func (e *Envoy) runTimers(b *bucket, now time.Time) {
	if b.ttlArmed && !now.Before(b.ttlEnd) {
		at := b.ttlEnd
		b.ttlArmed = false
		if e.fallback == nil {
			// global_client_impl.cc:459-474 (GC@c33e7f8): no fallback, back to
			// the no-assignment behaviour. The bucket is not abandoned and
			// keeps reporting.
			b.action, b.limiter, b.source = nil, nil, NoAssignment
		} else {
			// global_client_impl.cc:476-551 (GC@c33e7f8): the fallback becomes
			// the cached action. A token bucket fallback identical to the
			// expired assignment keeps its limiter; another is built from the
			// old one's fill ratio.
			var limiter *tokenBucket
			if e.fallback.GetTokenBucket() != nil {
				if replaceTokenBucket(b, e.fallback) {
					limiter = tokenBucketFromStrategy(e.fallback, e.mono(at), b.limiter)
				} else {
					limiter = b.limiter
				}
			}
			b.action = &rlqspb.RateLimitQuotaResponse_BucketAction{
				BucketId: &rlqspb.BucketId{Bucket: cloneMap(b.id)},
				BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
					QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
						RateLimitStrategy: e.fallback,
					},
				},
			}
			b.limiter, b.source = limiter, Fallback
			// filter.cc:174-186 (F@1736899): the fallback lasts ExpiredTimeout,
			// default 0.
			b.fbArmed, b.fbEnd = true, at.Add(e.fallbackTO)
		}
	}
	if b.fbArmed && !now.Before(b.fbEnd) {
		// global_client_impl.cc:476-551 (GC@c33e7f8): the fallback ends, back
		// to no-assignment.
		b.fbArmed = false
		b.action, b.limiter, b.source = nil, nil, NoAssignment
	}
}

// Stats returns every bucket ever requested, keyed by Key: its totals and
// what governs it now, after running the timers due by Settings.Now. An
// abandoned bucket not yet requested again has Source Abandoned.
func (e *Envoy) Stats() map[string]BucketStats {
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]BucketStats, len(e.totals))
	for key, t := range e.totals {
		s := BucketStats{Bucket: cloneMap(t.id), Allowed: t.allowed, Denied: t.denied, Source: Abandoned}
		if b := e.buckets[key]; b != nil {
			e.runTimers(b, now)
			s.Source = b.source
			if b.action == nil {
				s.Strategy = proto.Clone(e.noAssign).(*typev3.RateLimitStrategy)
			} else if st := b.action.GetQuotaAssignmentAction().GetRateLimitStrategy(); st != nil {
				s.Strategy = proto.Clone(st).(*typev3.RateLimitStrategy)
			}
			if b.limiter != nil {
				s.Rate = b.limiter.rate
				s.Burst = uint64(b.limiter.max)
				s.Tokens = b.limiter.remaining(e.mono(now))
			}
			switch {
			case b.ttlArmed:
				s.Expires = b.ttlEnd
			case b.fbArmed:
				s.Expires = b.fbEnd
			}
		}
		out[key] = s
	}
	return out
}

// Reconnects returns how many times a stream was opened after the first.
func (e *Envoy) Reconnects() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return max(e.streams-1, 0)
}

// Close ends the stream, waits for its receiving goroutine and stops Run.
// Later Reports return ErrClosed; Request still decides locally. Close is
// idempotent and returns nil.
func (e *Envoy) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.stream = nil
	close(e.done)
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
	return nil
}

func cloneMap(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
