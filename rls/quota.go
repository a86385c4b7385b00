package rls

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-go/floodgate/remote"
	"github.com/floodgate-go/floodgate/rls/internal/share"
)

// QuotaServiceName is the gRPC service a [QuotaServer] serves, also its
// name for grpc.health.v1.
const QuotaServiceName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

// A QuotaServer answers envoy.service.rate_limit_quota.v3 (RLQS): Envoys
// stream usage reports for their buckets, and the server divides each
// configured limit among the buckets that share it, sending each its share
// as a token bucket. It serves the config of a [Service] and follows its
// reloads; see the package doc, "Quotas (RLQS)", for the matching, the
// division and what Envoy does with the answers.
//
// The division is in memory, for one replica, unless [WithQuotaStore]
// has replicas on one Redis divide each limit together.
//
// A QuotaServer is safe for concurrent use. Each stream runs on its RPC's
// goroutine and one more that receives, both ending with the stream;
// [QuotaServer.Run] is the periodic recomputation (and, with a store, the
// rounds on Redis), on the caller's goroutine.
type QuotaServer struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	svc   *Service
	o     quotaOptions
	clock func() time.Time
	m     *quotaMetrics
	start time.Time // the learning window runs one TTL from here

	// With a store: the replica's name on it, a signal that a new group
	// wants its first grant, and (under mu) the keys of groups gone whose
	// grants go back at the next round.
	member   string
	kick     chan struct{}
	release  []string
	draining bool       // the last round, Close's, has started
	roundMu  sync.Mutex // one round at a time, Close's after any in flight

	closeOnce sync.Once
	done      chan struct{}

	mu      sync.Mutex
	closed  bool
	cfg     *Config // the config the groups were built under
	groups  map[string]*quotaGroup
	streams map[*quotaStream]struct{}
	subs    int // subscriptions held by open streams, for the gauge

	onReport func() // for tests: called after each report is taken
}

// quotaGroup is one global bucket: a rule and a bucket key, divided among
// its subscribers.
type quotaGroup struct {
	key  string
	rule *rule
	fill int64 // fill_interval in whole seconds, fixed while it fits
	subs []*quotaSub

	// With a store: this replica's grant of the limit, what its last
	// division asks Redis for and publishes (the rates of its subscribers
	// that are not divided again, and its measured subscribers' demands),
	// and what the other replicas published at the last round.
	granted    bool
	grant      float64
	claim      float64 // what returning subscribers held at a draining replica, to claim
	want       float64
	held       float64
	demands    []float64
	others     []float64
	othersHeld float64
}

// quotaStream is one RLQS stream: its subscriptions and the actions waiting
// to be sent on it.
type quotaStream struct {
	subs    map[string]*quotaSub
	pending map[string]*rlqspb.RateLimitQuotaResponse_BucketAction
	order   []string // pending's keys in the order they came
	notify  chan struct{}
	closed  bool
}

// quotaSub is a subscriber: one BucketId on one stream.
type quotaSub struct {
	st  *quotaStream // nil once its stream is gone
	key string
	id  *rlqspb.BucketId
	g   *quotaGroup // nil: a blanket rule, outside any division

	ewma share.EWMA
	// carryDenied counts the denied requests of the sample being gathered;
	// capped says the last sample had some: the share held the subscriber
	// back.
	carryDenied uint64
	capped      bool
	hasDemand   bool
	carry       float64 // requests reported since sampleAt, not yet a sample

	sampleAt   time.Time // the end of the last demand sample
	reportedAt time.Time // its last report
	activeAt   time.Time // its last report of at least one request
	sentAt     time.Time // its last assignment (0: none)

	// What it was last sent.
	blanket typev3.RateLimitStrategy_BlanketRule
	toks    uint32 // tokens_per_fill; 0 with a blanket rule
	maxToks uint32
	fill    int64
}

// rate is the subscriber's assigned rate, in requests per second, as
// counted against its group's limit.
func (u *quotaSub) rate() float64 {
	if u.toks == 0 || u.fill == 0 {
		return 0
	}
	return float64(u.toks) / float64(u.fill)
}

var errQuotaShutdown = status.Error(codes.Unavailable, "rls: quota server shutting down")

// NewQuotaServer returns a QuotaServer dividing the limits of svc's config,
// the one in force at each report and tick, so that svc's reloads apply to
// quotas too. Its metrics are registered with svc's registerer
// ([WithRegisterer]), if any. The error wraps floodgate.ErrInvalidOption for
// an invalid option, or is the registerer's.
func NewQuotaServer(svc *Service, opts ...QuotaOption) (*QuotaServer, error) {
	if svc == nil {
		return nil, errors.New("rls: NewQuotaServer: nil Service")
	}
	o := quotaDefaults()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &QuotaServer{svc: svc, o: o, clock: time.Now, m: newQuotaMetrics(), done: make(chan struct{}),
		groups: map[string]*quotaGroup{}, streams: map[*quotaStream]struct{}{}, kick: make(chan struct{}, 1)}
	if o.store != nil {
		s.member = rand.Text()
	}
	if o.clock != nil {
		s.clock = o.clock.Now
	}
	s.start = s.clock()
	if reg := svc.o.registerer; reg != nil {
		for _, c := range s.m.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// Register registers the server on g.
func (s *QuotaServer) Register(g *grpc.Server) { rlqspb.RegisterRateLimitQuotaServiceServer(g, s) }

// Collectors returns the server's Prometheus metrics, for a registry of the
// caller's choosing.
func (s *QuotaServer) Collectors() []prometheus.Collector { return s.m.collectors() }

// TTL returns the time to live of the server's assignments.
func (s *QuotaServer) TTL() time.Duration { return s.o.ttl }

// RoundPeriod returns how often [QuotaServer.Run] takes the replica's
// round on its store ([WithQuotaStore]): a quarter of the report interval,
// within 100 ms and 1 s. A grant lives the TTL plus two periods.
func (s *QuotaServer) RoundPeriod() time.Duration { return s.o.sharePeriod() }

// Run calls [QuotaServer.Tick] every report interval until ctx ends or the
// server is closed, and returns ctx's error or nil. With a store
// ([WithQuotaStore]) it also takes the replica's rounds on Redis: every
// [QuotaServer.RoundPeriod], and at once for a new quota or a returning
// subscriber.
func (s *QuotaServer) Run(ctx context.Context) error {
	t := time.NewTicker(s.o.interval)
	defer t.Stop()
	var rounds <-chan time.Time
	if s.o.store != nil {
		r := time.NewTicker(s.o.sharePeriod())
		defer r.Stop()
		rounds = r.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return nil
		case <-t.C:
			s.Tick()
		case <-rounds:
			s.Round(ctx)
		case <-s.kick:
			s.Round(ctx)
		}
	}
}

// Tick does what [QuotaServer.Run] does each interval, at the server's
// clock's time: it applies a reloaded config, lets subscribers whose leases
// have lapsed leave their division, abandons buckets idle for long, divides
// every limit anew and pushes the assignments that changed.
func (s *QuotaServer) Tick() {
	now := s.clock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.reconfig(now)
	for st := range s.streams {
		for k, u := range st.subs {
			switch {
			case now.Sub(u.reportedAt) >= s.o.ttl:
				// Not reported for T: its last assignment has lapsed or is
				// about to; it holds its share in the group until then.
				delete(st.subs, k)
				s.subs--
				u.st = nil
			case now.Sub(u.activeAt) >= s.o.idle:
				delete(st.subs, k)
				s.subs--
				s.enqueue(st, k, abandonAction(u.id))
				s.m.abandon.Inc()
				s.leave(u)
			}
		}
	}
	for k, g := range s.groups {
		s.expire(g, now)
		if len(g.subs) == 0 {
			delete(s.groups, k)
			if s.o.store != nil {
				// Even before its first grant: a round in flight may
				// record one after this.
				s.release = append(s.release, k)
			}
			continue
		}
		s.divide(g, now)
	}
	streams := s.notifyList()
	s.m.subscribers.Set(float64(s.subs))
	s.mu.Unlock()
	notify(streams)
}

// Close ends every stream with UNAVAILABLE, and those that start after it.
// It sends nothing first: Envoys keep their assignments until their TTL and
// open a new stream on their next report (Envoy never answers a TTL of 0
// but by dropping its assignment at once, so none is ever sent). With a
// store it first takes a last round that marks its grants draining: they
// stay held while its Envoys' assignments may be in force, and the
// replicas its Envoys come back to take them over (one call a quota, all
// within a round's period). Close is idempotent.
func (s *QuotaServer) Close() {
	s.closeOnce.Do(func() {
		if s.o.store != nil {
			s.round(context.Background(), true)
		}
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.done)
	})
}

// StreamRateLimitQuotas serves one RLQS stream: each report is answered at
// once for its buckets, and changed assignments are pushed whenever a
// division changes them. It returns UNAVAILABLE when the server closes.
func (s *QuotaServer) StreamRateLimitQuotas(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	st := &quotaStream{subs: map[string]*quotaSub{}, pending: map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{},
		notify: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errQuotaShutdown
	}
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	defer s.endStream(st)

	recvErr := make(chan error, 1)
	go func() {
		for {
			rep, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if err := s.report(st, rep); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	ctx := stream.Context()
	for {
		select {
		case <-st.notify:
			if err := s.flush(st, stream); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-s.done:
			return errQuotaShutdown
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// flush sends the actions waiting on st in one response.
func (s *QuotaServer) flush(st *quotaStream, stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	s.mu.Lock()
	if len(st.order) == 0 {
		s.mu.Unlock()
		return nil
	}
	resp := &rlqspb.RateLimitQuotaResponse{BucketAction: make([]*rlqspb.RateLimitQuotaResponse_BucketAction, 0, len(st.order))}
	for _, k := range st.order {
		resp.BucketAction = append(resp.BucketAction, st.pending[k])
	}
	clear(st.pending)
	st.order = st.order[:0]
	s.mu.Unlock()
	for _, a := range resp.BucketAction {
		switch {
		case a.GetAbandonAction() != nil:
		case a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil:
			s.m.sentBucket.Inc()
		default:
			s.m.sentBlanket.Inc()
		}
	}
	return stream.Send(resp)
}

// endStream takes a finished stream's subscribers out: each keeps its share
// counted in its group until its assignment lapses.
func (s *QuotaServer) endStream(st *quotaStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.closed = true
	delete(s.streams, st)
	for _, u := range st.subs {
		u.st = nil
		s.subs--
	}
	st.subs = nil
	s.m.subscribers.Set(float64(s.subs))
}

// report takes one usage report: a bucket seen for the first time on the
// stream is a subscription, answered at once; every bucket's demand is
// sampled, the groups they belong to divided again, and every reported
// bucket answered (changed, or the same assignment to refresh its TTL).
//
// A report that no Envoy would send (see checkReport) is refused whole,
// before any of it is taken, and the error ends the stream. Lines an Envoy
// may send but that name nothing to divide are skipped and counted.
func (s *QuotaServer) report(st *quotaStream, rep *rlqspb.RateLimitQuotaUsageReports) error {
	if err := checkReport(rep); err != nil {
		if s.onReport != nil {
			s.onReport()
		}
		return err
	}
	now := s.clock()
	s.mu.Lock()
	if s.closed || st.closed {
		s.mu.Unlock()
		if s.onReport != nil {
			s.onReport()
		}
		return nil
	}
	s.reconfig(now)
	dom := rep.GetDomain()
	uses := rep.GetBucketQuotaUsages()
	if s.cfg.domains[dom] == nil {
		// Envoy applies its own no_assignment_behavior to what it is not
		// answered: the operator's choice, rather than an ALLOW_ALL here.
		s.m.ignoredDomain.Add(float64(len(uses)))
		uses = nil
	}
	var touched []*quotaGroup
	var answer []*quotaSub
	for _, use := range uses {
		id := use.GetBucketId().GetBucket()
		if len(id) == 0 {
			s.m.ignoredEmpty.Inc() // Envoy ignores an action for an empty BucketId
			continue
		}
		k := bucketIDKey(dom, id)
		n := float64(use.GetNumRequestsAllowed()) + float64(use.GetNumRequestsDenied())
		u := st.subs[k]
		if u == nil {
			if len(st.subs) >= s.o.maxBuckets {
				// Unanswered, the bucket stays on Envoy's no-assignment
				// behaviour; an abandon would have it resubscribe, a report,
				// on its next request.
				s.m.ignoredBuckets.Inc()
				continue
			}
			u = &quotaSub{st: st, key: k, id: proto.Clone(use.GetBucketId()).(*rlqspb.BucketId),
				sampleAt: now, reportedAt: now, activeAt: now}
			// A returning Envoy's first report on a new stream covers
			// about one interval: a demand worth starting from, and, while
			// the server learns, the rate it held.
			held := -1.0
			if el := use.GetTimeElapsed().AsDuration(); el >= time.Second {
				u.ewma.Observe(n / el.Seconds())
				u.hasDemand = true
				held = float64(use.GetNumRequestsAllowed()) / el.Seconds()
			}
			st.subs[k] = u
			s.subs++
			s.join(u, dom, held, now)
			continue
		}
		u.reportedAt = now
		if n > 0 {
			u.activeAt = now
		}
		u.carry += n
		u.carryDenied += use.GetNumRequestsDenied()
		// Time is the server's: Envoy's time_elapsed is whole seconds,
		// often 0. A sample shorter than half a second carries over.
		if dt := now.Sub(u.sampleAt); dt >= time.Second/2 {
			x := u.carry / dt.Seconds()
			if u.carryDenied == 0 && x < u.ewma.Value()/2 {
				// Nothing was denied: x is all the subscriber wanted, not
				// what its share let through. A share it has stopped using
				// goes back at once rather than decaying over reports.
				u.ewma = share.EWMA{}
			}
			u.ewma.Observe(x)
			u.hasDemand = true
			u.capped = u.carryDenied > 0
			u.carry, u.carryDenied, u.sampleAt = 0, 0, now
		}
		if u.g != nil && !slices.Contains(touched, u.g) {
			touched = append(touched, u.g)
		}
		answer = append(answer, u)
	}
	for _, g := range touched {
		s.divide(g, now)
	}
	// Each answer replaces what waits for its bucket, so that its lease
	// counts from now.
	for _, u := range answer {
		s.send(u, now)
	}
	streams := s.notifyList()
	s.m.subscribers.Set(float64(s.subs))
	s.mu.Unlock()
	notify(streams)
	if s.onReport != nil {
		s.onReport()
	}
	return nil
}

// quotaMaxRate bounds a plausible report: more requests than this a second,
// over the time a line covers, is a client's bug, not traffic.
const quotaMaxRate = 1e9

// checkReport returns an InvalidArgument error naming the first field of rep
// that no Envoy sends: a line without a bucket_id, a time_elapsed that is
// negative or not a valid Duration, or counts over quotaMaxRate a second
// for the time the line covers (time_elapsed is truncated to whole seconds,
// so up to a second more).
func checkReport(rep *rlqspb.RateLimitQuotaUsageReports) error {
	for i, use := range rep.GetBucketQuotaUsages() {
		if use.GetBucketId() == nil {
			return status.Errorf(codes.InvalidArgument, "rls: RLQS report: bucket_quota_usages[%d].bucket_id: missing", i)
		}
		el := use.GetTimeElapsed()
		if el != nil {
			if err := el.CheckValid(); err != nil {
				return status.Errorf(codes.InvalidArgument, "rls: RLQS report: bucket_quota_usages[%d].time_elapsed: %v", i, err)
			}
			if d := el.AsDuration(); d < 0 {
				return status.Errorf(codes.InvalidArgument, "rls: RLQS report: bucket_quota_usages[%d].time_elapsed: negative (%v)", i, d)
			}
		}
		most := quotaMaxRate * (el.AsDuration().Seconds() + 1)
		a, d := use.GetNumRequestsAllowed(), use.GetNumRequestsDenied()
		field := ""
		switch {
		case float64(a) > most:
			field = "num_requests_allowed"
		case float64(d) > most:
			field = "num_requests_denied"
		case float64(a)+float64(d) > most:
			field = "num_requests_allowed+num_requests_denied"
		}
		if field != "" {
			return status.Errorf(codes.InvalidArgument,
				"rls: RLQS report: bucket_quota_usages[%d].%s: %d allowed, %d denied in time_elapsed %v: over %g a second",
				i, field, a, d, el.AsDuration(), quotaMaxRate)
		}
	}
	return nil
}

// join resolves a new subscriber's BucketId under the config in force and
// sends its first assignment: a newcomer's share of its group's limit, or a
// blanket rule. While the server learns, a returning subscriber (held ≥ 0:
// the allowed rate its first report showed) gets that rate back instead, as
// far as the capacity not already handed out allows.
func (s *QuotaServer) join(u *quotaSub, domain string, held float64, now time.Time) {
	g, blanket := s.resolveGroup(domain, u.id.GetBucket())
	if g == nil {
		u.blanket, u.toks, u.maxToks, u.fill = blanket, 0, 0, 0
		s.send(u, now)
		return
	}
	s.expire(g, now)
	live := 0
	given := 0.0
	for _, v := range g.subs {
		if v.st != nil {
			live++
		}
		given += v.rate()
	}
	u.g = g
	g.subs = append(g.subs, u)
	if held > 0 && s.o.store != nil {
		// A returning subscriber: if it comes from a replica that
		// drained, what it held there is this replica's to claim. Its
		// allowed count may hold its bucket's burst besides the rate:
		// what that over-claims is taken from Envoys of the drained
		// replica still to return, within one report interval.
		g.claim += held
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	lim := g.rule.limit.Rate
	live += len(g.others) // with a store, the other replicas' subscribers
	g.fill = fillFor(g.rule, live+1)
	r := share.Newcomer(lim, lim*(1-quotaReserve), quotaReserve, live)
	if held >= 0 && s.learning(now) {
		r = min(held, max(0, lim*(1-quotaReserve)-given))
	}
	u.setRate(uint32(max(1, math.Floor(r*float64(g.fill)))), g.fill)
	s.send(u, now)
}

// learning reports whether now is within one TTL of the server's start:
// Envoys subscribed to a previous instance may still enforce its
// assignments, which this one has not seen, until then. With a store, a
// previous instance's grant covers them on Redis until they lapse, and the
// server does not learn.
func (s *QuotaServer) learning(now time.Time) bool {
	return s.o.store == nil && now.Sub(s.start) < s.o.ttl
}

// resolveGroup finds the group of a BucketId, creating it; with no group,
// the blanket rule that answers it: ALLOW_ALL for no match, a domain gone
// in a reload (a report for an unknown domain is ignored before this), a
// rule without a limit, unlimited or shadow_mode, DENY_ALL for a
// limit of 0.
func (s *QuotaServer) resolveGroup(domain string, id map[string]string) (*quotaGroup, typev3.RateLimitStrategy_BlanketRule) {
	dom := s.cfg.domains[domain]
	if dom == nil {
		return nil, typev3.RateLimitStrategy_ALLOW_ALL
	}
	entries := dom.lookupBucket(id)
	if entries == nil {
		return nil, typev3.RateLimitStrategy_ALLOW_ALL
	}
	r, shared := dom.lookup(entries)
	switch {
	case r == nil, r.unlimited, r.shadow:
		return nil, typev3.RateLimitStrategy_ALLOW_ALL
	case r.limit.Rate <= 0:
		return nil, typev3.RateLimitStrategy_DENY_ALL
	}
	key := bucketKey(dom.name, entries, shared)
	g := s.groups[key]
	if g == nil {
		g = &quotaGroup{key: key, rule: r}
		s.groups[key] = g
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return g, 0
}

// reconfig moves every subscriber to its group under the config in force,
// when it is not the one the groups were built under. A subscriber that is
// gone keeps its lease in a group of the same key, if the new config has
// one.
func (s *QuotaServer) reconfig(now time.Time) {
	cfg := s.svc.Config()
	if cfg == s.cfg {
		return
	}
	s.cfg = cfg
	old := s.groups
	s.groups = map[string]*quotaGroup{}
	for st := range s.streams {
		for _, u := range st.subs {
			domain := u.domain()
			u.g = nil
			g, blanket := s.resolveGroup(domain, u.id.GetBucket())
			if g == nil {
				if u.toks != 0 || u.blanket != blanket {
					u.blanket, u.toks, u.maxToks, u.fill = blanket, 0, 0, 0
					s.send(u, now)
				}
				continue
			}
			u.g = g
			g.subs = append(g.subs, u)
		}
	}
	for _, og := range old {
		g := s.groups[og.key]
		if g != nil {
			g.granted, g.grant, g.others, g.othersHeld = og.granted, og.grant, og.others, og.othersHeld
			g.claim += og.claim
		} else if og.granted || s.o.store != nil {
			s.release = append(s.release, og.key)
		}
		for _, u := range og.subs {
			if u.st == nil && g != nil {
				u.g = g
				g.subs = append(g.subs, u)
			}
		}
	}
	for _, g := range s.groups {
		s.divide(g, now)
	}
}

// domain returns the domain of u's key, which starts with it.
func (u *quotaSub) domain() string {
	// bucketIDKey writes the domain first, length-prefixed.
	i := 0
	n := 0
	for ; i < len(u.key) && u.key[i] != ':'; i++ {
		n = n*10 + int(u.key[i]-'0')
	}
	return u.key[i+1 : i+1+n]
}

// expire drops from g the subscribers that are gone and whose last
// assignment has lapsed.
func (s *QuotaServer) expire(g *quotaGroup, now time.Time) {
	g.subs = slices.DeleteFunc(g.subs, func(u *quotaSub) bool {
		if u.st == nil && !u.sentAt.Add(s.o.ttl).After(now) {
			u.g = nil
			return true
		}
		return false
	})
}

// leave takes u out of its group at once: its bucket was abandoned.
func (s *QuotaServer) leave(u *quotaSub) {
	if g := u.g; g != nil {
		g.subs = slices.DeleteFunc(g.subs, func(v *quotaSub) bool { return v == u })
		u.g = nil
	}
	u.st = nil
}

// divide shares g's limit among its subscribers and sends each one whose
// share changed enough (share.Changed) its new assignment.
//
// The capacity is the limit less the reserve for newcomers, less the
// shares still held by subscribers that are gone (until they lapse) and by
// newcomers not yet measured (until their next report); while the server
// learns, at most what the measured subscribers already hold. The rest is
// divided by smoothed demand with headroom (share.Divide) and quantized to
// whole tokens per fill interval (share.Quantize), at least 1 each.
//
// With a store, the division is the fleet's: this replica's measured
// subscribers beside the other replicas' (as they published them at the
// last round), in the capacity that all replicas' held shares leave. What
// this replica's part comes to is what it asks Redis for at its next
// round; what it hands out is that part, cut down to the grant Redis gave
// it. Until its first grant it hands out nothing but newcomers' shares.
func (s *QuotaServer) divide(g *quotaGroup, now time.Time) { s.divideAs(g, now, true) }

// divideAs is divide; with assign false, and a store, it only computes
// what the replica asks Redis for and publishes, and assigns nothing.
func (s *QuotaServer) divideAs(g *quotaGroup, now time.Time, assign bool) {
	lim := g.rule.limit.Rate
	held := 0.0
	var act []*quotaSub
	live := 0
	for _, u := range g.subs {
		if u.st != nil {
			live++
		}
		if u.st == nil || !u.hasDemand {
			held += u.rate()
			continue
		}
		act = append(act, u)
	}
	fill := fillFor(g.rule, max(live+len(g.others), 1))
	refill := fill != g.fill
	g.fill = fill
	d := make([]float64, len(act), len(act)+len(g.others))
	for i, u := range act {
		d[i] = max(0, u.ewma.Value())
	}
	var c float64
	r := make([]float64, len(d))
	if s.o.store != nil {
		all := append(d, g.others...)
		fleet := make([]float64, len(all))
		share.Divide(max(0, lim*(1-quotaReserve)-held-g.othersHeld), all, quotaHeadroom, fleet)
		part := 0.0
		for _, x := range fleet[:len(d)] {
			part += x
		}
		g.want, g.held, g.demands = held+part, held, d
		if !assign || !g.granted || len(act) == 0 {
			return
		}
		c = max(0, min(part, g.grant-held))
		if part > 0 {
			for i := range r {
				r[i] = fleet[i] * (c / part)
			}
		}
	} else {
		if len(act) == 0 {
			return
		}
		c = max(0, lim*(1-quotaReserve)-held)
		if s.learning(now) {
			// Capacity no subscriber has shown may still be enforced by an
			// Envoy of a previous instance: those measured share what they
			// hold, and no more, until it has lapsed.
			seen := 0.0
			for _, u := range act {
				seen += u.rate()
			}
			c = min(c, seen)
		}
		share.Divide(c, d, quotaHeadroom, r)
	}
	toks := make([]uint32, len(act))
	share.Quantize(c, float64(fill), r, toks)
	// Hysteresis: keep a share that moved little, unless the kept shares
	// would exceed the capacity; then take every decrease.
	final := make([]uint32, len(act))
	var sumFinal, sumNew float64
	for i, u := range act {
		toks[i] = max(toks[i], 1)
		final[i] = toks[i]
		// A subscriber its share holds back gets any increase: the
		// hysteresis would otherwise keep it a token under what it wants.
		grow := u.capped && toks[i] > u.toks
		if !refill && !grow && u.toks != 0 && u.fill == fill && !share.Changed(u.toks, toks[i], quotaHysteresis) {
			final[i] = u.toks
		}
		sumFinal += float64(final[i])
		sumNew += float64(toks[i])
	}
	if limit := math.Floor(c * float64(fill)); sumFinal > limit && sumFinal > sumNew {
		for i := range act {
			final[i] = min(final[i], toks[i])
		}
	}
	for i, u := range act {
		if u.toks == final[i] && u.fill == fill {
			continue
		}
		u.setRate(final[i], fill)
		s.send(u, now)
	}
}

// Round takes the replica's round on its store ([WithQuotaStore]), as
// [QuotaServer.Run] does every [QuotaServer.RoundPeriod], at the server's
// clock's time; without a store it does nothing. A test or simulation driving a
// fake clock calls it instead of Run.
//
// A round is one call a quota the replica divides, all of them bounded by
// the round's period and ctx: it publishes what the quota's last division asks
// for and measured, takes the grant Redis answers and the other replicas'
// publications, divides the quota again with them and pushes what
// changed, and gives back the grants of quotas it no longer serves. A
// quota whose call fails keeps its last grant until a later round
// succeeds; the failure is counted (floodgate_rls_quota_share_errors_total).
func (s *QuotaServer) Round(ctx context.Context) {
	if s.o.store != nil {
		s.round(ctx, false)
	}
}

// round is Round; draining, the last one, from Close: every grant is kept
// as it is, held whole and marked draining.
func (s *QuotaServer) round(ctx context.Context, draining bool) {
	type round struct {
		key string
		req remote.ShareRequest
	}
	// Rounds in turn: two in flight would send one claim twice, and apply
	// their grants in another order than Redis recorded them.
	s.roundMu.Lock()
	defer s.roundMu.Unlock()
	hold := s.o.shareHold()
	s.mu.Lock()
	if s.closed || s.draining {
		s.mu.Unlock()
		return
	}
	s.draining = draining
	rounds := make([]round, 0, len(s.groups)+len(s.release))
	for k, g := range s.groups {
		if !draining && (!g.granted || g.claim > 0) {
			// A new group's first want, or one that counts the
			// returning subscribers whose claim it carries: they get
			// their part with this round.
			s.divideAs(g, s.clock(), false)
		}
		req := remote.ShareRequest{Member: s.member, Limit: g.rule.limit.Rate * (1 - quotaReserve),
			Want: g.want, Hold: hold, Held: g.held, Demands: publishable(g.demands), Claim: g.claim}
		if draining {
			req.Want, req.Held, req.Demands, req.Claim, req.Draining = g.grant, g.grant, nil, 0, true
		}
		rounds = append(rounds, round{k, req})
	}
	for _, k := range s.release {
		if s.groups[k] == nil {
			rounds = append(rounds, round{k, remote.ShareRequest{Member: s.member}})
		}
	}
	s.release = s.release[:0]
	s.mu.Unlock()

	// One round trip a group, none under the lock: a slow Redis delays
	// the rounds, never a report. The round as a whole gets one period.
	replies := make([]remote.ShareReply, len(rounds))
	errs := make([]error, len(rounds))
	cctx, cancel := context.WithTimeout(ctx, s.o.sharePeriod())
	for i, r := range rounds {
		replies[i], errs[i] = s.o.store.Share(cctx, shareKey(r.key), r.req)
	}
	cancel()

	now := s.clock()
	s.mu.Lock()
	for i, r := range rounds {
		if errs[i] != nil {
			s.m.shareErrors.Inc()
			if r.req.Hold == 0 && s.groups[r.key] == nil {
				s.release = append(s.release, r.key) // again next round
			}
			continue
		}
		g := s.groups[r.key]
		if g == nil || r.req.Hold == 0 || draining {
			continue
		}
		// A claim is taken once: what found no draining grant came from a
		// replica that did not drain, whose grant lapses with its hold.
		g.claim = max(0, g.claim-r.req.Claim)
		g.granted, g.grant = true, replies[i].Granted
		g.others, g.othersHeld = g.others[:0], 0
		for _, o := range replies[i].Others {
			if o.Draining {
				// What a draining replica handed out is in force until
				// it is claimed or lapses: held, none of it divided.
				g.othersHeld += o.Granted
				continue
			}
			g.others = append(g.others, o.Demands...)
			g.othersHeld += o.Held
		}
		s.divide(g, now)
	}
	streams := s.notifyList()
	s.mu.Unlock()
	notify(streams)
}

// shareKey is a group's key on the store, beside the RLS buckets: the
// group's key, or its SHA-256 when that is longer than a store takes
// (redisstore's MaxKeyLen is 1024 bytes).
func shareKey(group string) string {
	if len(group) > 512 {
		sum := sha256.Sum256([]byte(group))
		return "rlqs#" + hex.EncodeToString(sum[:])
	}
	return "rlqs:" + group
}

// publishable returns demands as a round publishes them: all of them up
// to remote.MaxShareDemands, else the largest with the rest summed into
// one, which keeps the fleet's total demand.
func publishable(demands []float64) []float64 {
	if len(demands) <= remote.MaxShareDemands {
		return demands
	}
	d := slices.Clone(demands)
	slices.SortFunc(d, func(a, b float64) int { return cmp.Compare(b, a) })
	rest := 0.0
	for _, x := range d[remote.MaxShareDemands-1:] {
		rest += x
	}
	d[remote.MaxShareDemands-1] = rest
	return d[:remote.MaxShareDemands]
}

// setRate sets u's token bucket: toks per fill seconds, with a burst of
// max(1, ⌈rate·β⌉).
func (u *quotaSub) setRate(toks uint32, fill int64) {
	u.blanket = 0
	u.toks, u.fill = toks, fill
	u.maxToks = uint32(max(1, math.Ceil(float64(toks)/float64(fill)*quotaBurst)))
}

// fillFor returns a group's fill interval in whole seconds for n
// subscribers: 1 s while the limit gives each at least one request a
// second, else the config's unit capped at 60 s. It changes only when the
// subscribers cross L/n = 1/s; a change re-sends every share (Envoy
// compares only fill_interval's nanos, so a change of seconds alone would
// go unseen: tokens_per_fill changes with it in all but rare cases).
func fillFor(r *rule, n int) int64 {
	want := int64(1)
	if r.limit.Rate/float64(n) < 1 {
		want = int64(min(unitSeconds[r.unit], 60))
		if want < 1 {
			want = 1
		}
	}
	return want
}

// send queues u's assignment on its stream, replacing any not yet sent.
func (s *QuotaServer) send(u *quotaSub, now time.Time) {
	if u.st == nil {
		return
	}
	u.sentAt = now
	strat := &typev3.RateLimitStrategy{}
	if u.toks == 0 {
		strat.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: u.blanket}
	} else {
		strat.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     u.maxToks,
			TokensPerFill: wrapperspb.UInt32(u.toks),
			FillInterval:  durationpb.New(time.Duration(u.fill) * time.Second),
		}}
	}
	s.enqueue(u.st, u.key, &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: u.id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(s.o.ttl),
				RateLimitStrategy:    strat,
			}},
	})
}

func abandonAction(id *rlqspb.BucketId) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

func (s *QuotaServer) enqueue(st *quotaStream, key string, a *rlqspb.RateLimitQuotaResponse_BucketAction) {
	if _, ok := st.pending[key]; !ok {
		st.order = append(st.order, key)
	}
	st.pending[key] = a
}

// notifyList returns the streams with actions waiting.
func (s *QuotaServer) notifyList() []*quotaStream {
	var out []*quotaStream
	for st := range s.streams {
		if len(st.order) > 0 {
			out = append(out, st)
		}
	}
	return out
}

func notify(streams []*quotaStream) {
	for _, st := range streams {
		select {
		case st.notify <- struct{}{}:
		default:
		}
	}
}

// quotaMetrics are the server's Prometheus metrics.
type quotaMetrics struct {
	subscribers prometheus.Gauge
	sent        *prometheus.CounterVec
	sentBucket  prometheus.Counter
	sentBlanket prometheus.Counter
	abandon     prometheus.Counter

	ignored        *prometheus.CounterVec
	ignoredEmpty   prometheus.Counter
	ignoredDomain  prometheus.Counter
	ignoredBuckets prometheus.Counter

	shareErrors prometheus.Counter
}

func newQuotaMetrics() *quotaMetrics {
	m := &quotaMetrics{
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "floodgate_rls_quota_subscribers",
			Help: "RLQS subscriptions (a BucketId on a stream) held by open streams."}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_rls_quota_actions_total",
			Help: "RLQS bucket actions sent, by kind: token_bucket, blanket (ALLOW_ALL or DENY_ALL), abandon."},
			[]string{"kind"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_rls_quota_reports_ignored_total",
			Help: "Lines of RLQS usage reports (one bucket each) skipped unanswered, by reason: empty_bucket_id, unknown_domain, too_many_buckets."},
			[]string{"reason"}),
	}
	m.shareErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "floodgate_rls_quota_share_errors_total",
		Help: "Rounds on Redis (one a divided limit, with -redis) that failed: the replica kept its last grant."})
	m.ignoredEmpty = m.ignored.WithLabelValues("empty_bucket_id")
	m.ignoredDomain = m.ignored.WithLabelValues("unknown_domain")
	m.ignoredBuckets = m.ignored.WithLabelValues("too_many_buckets")
	m.sentBucket = m.sent.WithLabelValues("token_bucket")
	m.sentBlanket = m.sent.WithLabelValues("blanket")
	m.abandon = m.sent.WithLabelValues("abandon")
	return m
}

func (m *quotaMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.subscribers, m.sent, m.ignored, m.shareErrors}
}
