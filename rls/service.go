package rls

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/topk"
)

// Response header names, added when [WithResponseHeaders] is on.
const (
	HeaderLimit     = "x-ratelimit-limit"
	HeaderRemaining = "x-ratelimit-remaining"
	HeaderReset     = "x-ratelimit-reset"
)

// A Service answers envoy.service.ratelimit.v3.RateLimitService from a
// [Config] and a [floodgate.Reserver] that holds the buckets: a keyed.Map
// in memory, or a redisstore.Store shared by every replica.
//
// A Service is safe for concurrent use. Its config is replaced atomically
// by [Service.SetConfig], [Service.Load] and [Service.Watch]: a request is
// decided under one config, the old or the new. It starts no goroutine
// that outlives a request (Watch runs on the caller's; on a batched store
// a request decides its descriptors on goroutines it waits for).
type Service struct {
	pb.UnimplementedRateLimitServiceServer

	store floodgate.Reserver
	o     options
	m     *metrics
	top   *topk.Summary
	resv  *reservations
	cur   atomic.Pointer[served]
	unk   *domainMetrics
	clock func() time.Time
	// all decides a request's buckets in one call, all or none
	// (redisstore's), nil when the store cannot.
	all floodgate.AllReserver
	// seen is the fingerprint of the files the last Load read (applied
	// or rejected), for Watch.
	seen atomic.Pointer[string]
}

// served is a config with its counters resolved.
type served struct {
	cfg   *Config
	rules []ruleMetrics
	doms  map[string]*domainMetrics
	// override is the rule of descriptors that carry their own limit, per
	// domain, for metrics.
	override map[string]*rule
}

// New returns a Service deciding with store under cfg (nil: the zero
// Config, no domain). The error wraps floodgate.ErrInvalidOption for an
// invalid option, or is the registerer's.
func New(store floodgate.Reserver, cfg *Config, opts ...Option) (*Service, error) {
	if store == nil {
		return nil, errors.New("rls: New: nil store")
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
	top, _ := topk.New(o.topK) // validated
	s := &Service{store: store, o: o, top: top, m: newMetrics(top, o.topK),
		resv: newReservations(o.resvMax, int64(o.resvTTL))}
	s.clock = time.Now
	s.all, _ = store.(floodgate.AllReserver)
	if o.clock != nil {
		s.clock = o.clock.Now
	}
	if o.registerer != nil {
		for _, c := range s.m.collectors() {
			if err := o.registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	s.unk = s.m.forDomain(unknownDomain, FailureLocal)
	if cfg == nil {
		cfg = &Config{}
	}
	s.SetConfig(cfg)
	return s, nil
}

// Collectors returns the service's Prometheus metrics, for a registry of
// the caller's choosing (see [WithRegisterer]).
func (s *Service) Collectors() []prometheus.Collector { return s.m.collectors() }

// Register registers the service on g.
func (s *Service) Register(g *grpc.Server) { pb.RegisterRateLimitServiceServer(g, s) }

// Config returns the config in force.
func (s *Service) Config() *Config { return s.cur.Load().cfg }

// SetConfig puts cfg in force for the requests that start after it
// returns. Buckets are kept: a descriptor that cfg keeps keeps its
// bucket's tokens, under cfg's limit from its next decision on.
func (s *Service) SetConfig(cfg *Config) {
	if cfg == nil {
		cfg = &Config{}
	}
	sv := &served{cfg: cfg, rules: make([]ruleMetrics, len(cfg.rules)),
		doms: make(map[string]*domainMetrics, len(cfg.domains)), override: map[string]*rule{}}
	for i, r := range cfg.rules {
		sv.rules[i] = s.m.forRule(r)
	}
	for name, d := range cfg.domains {
		sv.doms[name] = s.m.forDomain(name, d.policy)
		or := &rule{id: -1, domain: name, path: "(override)"}
		sv.override[name] = or
	}
	s.cur.Store(sv)
}

// Load reads the config at path ([LoadConfig]) and puts it in force. On
// error the config in force stays, and the error lists every problem with
// its file and line.
func (s *Service) Load(path string) error {
	// Taken before reading: a change made while reading shows at the
	// next check.
	fp := fingerprint(path)
	s.seen.Store(&fp)
	cfg, err := loadConfig(path, s.o.merge)
	if err != nil {
		s.m.loads.WithLabelValues("error").Inc()
		if s.o.logger != nil {
			s.o.logger.Error("rls: config rejected, the previous one stays in force", "path", path, "error", err.Error())
		}
		if s.o.onReload != nil {
			s.o.onReload(path, nil, err)
		}
		return err
	}
	s.SetConfig(cfg)
	s.m.loads.WithLabelValues("success").Inc()
	if s.o.logger != nil {
		s.o.logger.Info("rls: config loaded", "path", path, "domains", cfg.Domains())
	}
	if s.o.onReload != nil {
		s.o.onReload(path, cfg, nil)
	}
	return nil
}

// Watch loads the config at path whenever it differs (its files' names,
// sizes or modification times) from what the last [Service.Load] read,
// checking every interval (1 s when ≤ 0), until ctx ends; it returns ctx's
// error. Without an earlier Load, its first check loads the config. A
// rejected change is logged and counted and leaves the config in force;
// the next change is tried again.
func (s *Service) Watch(ctx context.Context, path string, interval time.Duration) error {
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if last := s.seen.Load(); last == nil || fingerprint(path) != *last {
			_ = s.Load(path) // counted, logged and reported
		}
	}
}

// item is one descriptor of a request on its way to a decision.
type item struct {
	m        match
	limited  bool // has a bucket to decide on
	hits     int
	negative bool
	resvID   string
	hasResv  bool
	status   *pb.RateLimitResponse_DescriptorStatus
	res      floodgate.Result
	r        floodgate.Reservation
	taken    bool
	settled  bool // a charge on the response, already applied
	done     bool // decided before the request's takes (decideAll)
}

// hitsOf returns a descriptor's hits: its own hits_addend when set (0
// included: a check that takes nothing), else the request's, where 0 means
// 1.
func hitsOf(req *pb.RateLimitRequest, d *rlpb.RateLimitDescriptor) int {
	if h := d.GetHitsAddend(); h != nil {
		return int(min(h.GetValue(), uint64(math.MaxInt32)))
	}
	return int(max(1, req.GetHitsAddend()))
}

var (
	errNoDomain      = status.Error(codes.InvalidArgument, "rls: rate limit domain must not be empty")
	errNoDescriptors = status.Error(codes.InvalidArgument, "rls: rate limit descriptor list must not be empty")
)

// ShouldRateLimit decides a request: see the package doc for the
// semantics. It returns an error only for a request without a domain or
// descriptors (InvalidArgument) and for a context that ended before the
// store decided (the context's code).
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, errNoDomain
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, errNoDescriptors
	}
	sv := s.cur.Load()
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK,
		Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(descs))}
	dom := sv.cfg.domains[req.GetDomain()]
	if dom == nil {
		for i := range resp.Statuses {
			resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		}
		s.unk.unmatched.Add(float64(len(descs)))
		s.unk.ok.Inc()
		return resp, nil
	}
	dm := sv.doms[dom.name]
	items := make([]item, len(descs))
	var replacing map[string]bool
	for i, d := range descs {
		it := &items[i]
		entries, id, has := splitReservation(d.GetEntries())
		it.resvID, it.hasResv = id, has
		it.hits, it.negative = hitsOf(req, d), d.GetIsNegativeHits()
		if !s.resolve(sv, dom, d, entries, &it.m) {
			dm.unmatched.Inc()
			it.status = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
			continue
		}
		if len(it.m.rule.replaces) > 0 {
			if replacing == nil {
				replacing = map[string]bool{}
			}
			for _, n := range it.m.rule.replaces {
				replacing[n] = true
			}
		}
		if it.m.rule.unlimited {
			it.status = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
			if rm := sv.ruleMetrics(it.m.rule); rm != nil {
				rm.ok.Inc()
			}
			continue
		}
		it.limited = true
	}
	for i := range items {
		it := &items[i]
		if it.limited && it.m.rule.name != "" && replacing[it.m.rule.name] {
			it.limited = false
			it.status = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		}
	}

	// refused is the first descriptor that refused (-1: none), after
	// which the request holds no take.
	var refused int
	var err error
	if s.all != nil && limitedCount(items) > 1 {
		refused, err = s.decideAll(ctx, sv, dom, dm, items)
	} else {
		refused, err = s.decideInOrder(ctx, sv, dom, dm, items)
	}
	if err != nil {
		return nil, err
	}
	now := int64(0)
	for i := range items {
		it := &items[i]
		if it.hasResv && it.limited && !it.settled {
			if now == 0 {
				now = s.clock().UnixNano()
			}
			r := it.r
			if refused >= 0 || !it.taken {
				// Nothing is held for a refused request: its response
				// settles to nothing.
				r = floodgate.Reservation{}
			}
			s.resv.put(resvKey(it.m.key, it.resvID), r, now)
		}
		if it.status == nil {
			it.status = s.status(sv, it, refused >= 0 && i < refused)
		}
		resp.Statuses[i] = it.status
	}
	if refused >= 0 {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		dm.over.Inc()
	} else {
		dm.ok.Inc()
	}
	if s.o.headers {
		resp.ResponseHeadersToAdd = headers(items, refused)
	}
	return resp, nil
}

func resvKey(bucket, id string) string { return bucket + "\x00" + id }

func (sv *served) ruleMetrics(r *rule) *ruleMetrics {
	if r.id >= 0 && r.id < len(sv.rules) {
		return &sv.rules[r.id]
	}
	return nil
}

// resolve finds a descriptor's limit and bucket; false when nothing
// limits it.
func (s *Service) resolve(sv *served, dom *domain, d *rlpb.RateLimitDescriptor,
	entries []*rlpb.RateLimitDescriptor_Entry, m *match) bool {
	if len(entries) == 0 {
		return false
	}
	if ov := d.GetLimit(); ov != nil {
		unit := pb.RateLimitResponse_RateLimit_Unit(ov.GetUnit())
		if _, ok := unitSeconds[unit]; !ok {
			return false
		}
		mult := max(ov.GetUnitMultiplier().GetValue(), 1)
		r := sv.override[dom.name]
		*m = match{rule: r, cost: 1, key: bucketKey(dom.name, entries, nil),
			limit: overrideLimit(ov.GetRequestsPerUnit(), unit, mult), top: dom.name + "." + r.path}
		m.rpu, m.unit = ov.GetRequestsPerUnit(), unit
		return true
	}
	if dom.tenants != nil {
		return s.resolveTenant(dom, entries, m)
	}
	r, shared := dom.lookup(entries)
	if r == nil {
		return false
	}
	*m = match{rule: r, limit: r.limit, cost: 1, rpu: r.rpu, unit: r.unit}
	if !r.unlimited {
		m.key = bucketKey(dom.name, entries, shared)
		if r.detailed {
			m.top = detailedName(dom.name, entries)
		} else {
			m.top = dom.name + "." + r.path
		}
	}
	return true
}

func overrideLimit(rpu uint32, unit pb.RateLimitResponse_RateLimit_Unit, mult uint32) floodgate.Limit {
	if rpu == 0 {
		return floodgate.Limit{}
	}
	secs := unitSeconds[unit] * float64(mult)
	return floodgate.Limit{Rate: float64(rpu) / secs, Burst: int(rpu)}
}

// decide takes a limited descriptor's tokens, settles its charge on the
// response, or refunds (is_negative_hits), and applies the domain's
// failure policy to decisions the store could not make.
func (s *Service) decide(ctx context.Context, sv *served, dom *domain, dm *domainMetrics, it *item) error {
	n := cost(it.m.cost, it.hits)
	if it.negative {
		res, err := s.store.SettleN(context.WithoutCancel(ctx), it.m.key, it.m.limit, n, 0)
		if err != nil {
			dm.errs.Inc()
			res = floodgate.Result{Limit: it.m.limit}
		} else {
			dm.refund.Inc()
		}
		res.Allowed = true
		it.res, it.settled = res, true
		return nil
	}
	if it.hasResv {
		if r, ok := s.resv.take(resvKey(it.m.key, it.resvID), s.clock().UnixNano()); ok {
			res, err := r.Settle(context.WithoutCancel(ctx), n)
			var dl *floodgate.DebtLimitError
			switch {
			case errors.As(err, &dl):
				dm.debt.Inc()
			case err != nil:
				dm.errs.Inc()
			default:
				dm.settled.Inc()
			}
			if res.Limit != it.m.limit {
				res.Limit = it.m.limit
			}
			res.Allowed = true
			it.res, it.settled = res, true
			return nil
		}
	}
	r, err := s.store.ReserveN(ctx, it.m.key, it.m.limit, n)
	switch {
	case err == nil:
	case errors.Is(err, floodgate.ErrExceedsBurst), errors.Is(err, floodgate.ErrKeyTooLong):
		// Never fits: no outage to fail open on.
		it.res = floodgate.Result{Limit: it.m.limit, RetryAfter: floodgate.Never}
		s.count(sv, it)
		return nil
	case ctx.Err() != nil:
		if r.Result.Allowed {
			_, _ = r.Settle(context.WithoutCancel(ctx), 0)
		}
		return status.FromContextError(ctx.Err()).Err()
	default:
		// A store error that is not the caller's: the policy decides.
		dm.fallback.Inc()
		allowed := dom.policy != FailureClosed
		if r.Result.Allowed && !allowed {
			_, _ = r.Settle(context.WithoutCancel(ctx), 0)
		}
		it.res = floodgate.Result{Allowed: allowed, Limit: it.m.limit, Source: floodgate.SourceFallback}
		it.r = floodgate.Reservation{Result: it.res}
		it.taken = false
		s.count(sv, it)
		return nil
	}
	res := r.Result
	switch res.Source {
	case floodgate.SourceFallback, floodgate.SourceFailOpen, floodgate.SourceFailClosed:
		dm.fallback.Inc()
		switch dom.policy {
		case FailureOpen:
			if !res.Allowed {
				res.Allowed = true
				r = floodgate.Reservation{Result: res}
			}
		case FailureClosed:
			if res.Allowed {
				_, _ = r.Settle(context.WithoutCancel(ctx), 0)
				res.Allowed = false
				r = floodgate.Reservation{Result: res}
			}
		}
	}
	it.res, it.r, it.taken = res, r, res.Allowed
	s.count(sv, it)
	return nil
}

// cost returns perHit × hits, at most math.MaxInt32 (above any burst a
// response can report, so a cost that large is refused as over the burst).
func cost(perHit, hits int) int {
	if hits == 0 || perHit == 0 {
		return 0
	}
	if perHit > math.MaxInt32/hits {
		return math.MaxInt32
	}
	return perHit * hits
}

// count records a decision in the metrics of the config it was decided
// under, and in the over-limit summary.
func (s *Service) count(sv *served, it *item) {
	rm := sv.ruleMetrics(it.m.rule)
	switch {
	case it.res.Allowed:
		if rm != nil {
			rm.ok.Inc()
			if float64(it.res.Remaining) < (1-s.o.near)*float64(it.m.limit.Burst) {
				rm.near.Inc()
			}
		}
	case it.m.rule.shadow:
		if rm != nil {
			rm.shadow.Inc()
			rm.ok.Inc()
		}
		s.top.Add(it.m.top, 1)
	default:
		if rm != nil {
			rm.over.Inc()
		}
		s.top.Add(it.m.top, 1)
	}
}

// limitedCount returns how many of items have a bucket to decide on.
func limitedCount(items []item) int {
	n := 0
	for i := range items {
		if items[i].limited {
			n++
		}
	}
	return n
}

// refuses reports whether it is limited and refused, not in shadow mode:
// a refusal of the request.
func (it *item) refuses() bool { return it.limited && !it.res.Allowed && !it.m.rule.shadow }

// decideInOrder takes from every limited item in order and returns the
// first refused, -1 for none. The first refusal refunds every take before
// it and ends the takes; the items after it are peeked, for their status,
// taking nothing. An error refunds every take before it.
func (s *Service) decideInOrder(ctx context.Context, sv *served, dom *domain, dm *domainMetrics, items []item) (int, error) {
	for i := range items {
		it := &items[i]
		if !it.limited || it.done {
			continue
		}
		if err := s.decide(ctx, sv, dom, dm, it); err != nil {
			s.refundAll(ctx, items[:i])
			return -1, err
		}
		if it.refuses() {
			s.refundAll(ctx, items[:i])
			for j := i + 1; j < len(items); j++ {
				if items[j].limited {
					s.peek(ctx, &items[j])
				}
			}
			return i, nil
		}
	}
	return -1, nil
}

// decideAll decides a request's takes in one call to the store, all or
// none ([floodgate.AllReserver]), and returns the first refused (not in
// shadow mode), -1 for none. Refunds (is_negative_hits), settles of a
// reservation and shadow rules, which never refuse a request, are decided
// first, one by one; a refused request gives their takes back. A take the
// store decided by its failure policy sends the request down
// decideInOrder, which applies the domain's policy take by take.
func (s *Service) decideAll(ctx context.Context, sv *served, dom *domain, dm *domainMetrics, items []item) (int, error) {
	var group []int
	for i := range items {
		it := &items[i]
		if !it.limited {
			continue
		}
		if !it.negative && !it.hasResv && !it.m.rule.shadow {
			group = append(group, i)
			continue
		}
		it.done = true
		if err := s.decide(ctx, sv, dom, dm, it); err != nil {
			s.refundAll(ctx, items)
			return -1, err
		}
	}
	takes := make([]floodgate.Take, len(group))
	rs := make([]floodgate.Reservation, len(group))
	for k, i := range group {
		it := &items[i]
		takes[k] = floodgate.Take{Key: it.m.key, Limit: it.m.limit, N: cost(it.m.cost, it.hits)}
	}
	refused, err := s.all.ReserveAll(ctx, takes, rs)
	policy := err != nil && ctx.Err() == nil
	for k := range group {
		switch rs[k].Result.Source {
		case floodgate.SourceFallback, floodgate.SourceFailOpen, floodgate.SourceFailClosed:
			policy = true
		}
	}
	if policy {
		// Nothing is held for the request (see AllReserver), or all is:
		// give it back, and decide take by take.
		if refused < 0 {
			for k := range rs {
				rs[k].Settle(context.WithoutCancel(ctx), 0)
			}
		}
		return s.decideInOrder(ctx, sv, dom, dm, items)
	}
	if err != nil {
		s.refundAll(ctx, items)
		return -1, status.FromContextError(ctx.Err()).Err()
	}
	first := -1
	for k, i := range group {
		it := &items[i]
		it.res, it.r = rs[k].Result, rs[k]
		it.taken = refused < 0 && it.res.Allowed
		s.count(sv, it)
		if refused >= 0 && k == refused {
			first = i
		}
	}
	if first >= 0 {
		s.refundAll(ctx, items)
	}
	return first, nil
}

// peek sets it's result from its bucket, taking nothing.
func (s *Service) peek(ctx context.Context, it *item) {
	res, err := s.store.TakeN(ctx, it.m.key, it.m.limit, 0)
	if err != nil {
		res = floodgate.Result{Allowed: true, Limit: it.m.limit, Remaining: it.m.limit.Burst}
	}
	res.Allowed = res.Remaining >= cost(it.m.cost, it.hits) && res.Owed == 0
	it.res = res
}

// refundAll gives back every take among items: the request was refused,
// and nothing is taken from any bucket.
func (s *Service) refundAll(ctx context.Context, items []item) {
	for i := range items {
		it := &items[i]
		if !it.taken {
			continue
		}
		res, err := it.r.Settle(context.WithoutCancel(ctx), 0)
		if err == nil {
			it.res.Remaining = res.Remaining
			it.res.ResetAfter = res.ResetAfter
		}
		it.taken = false
	}
}

// status is a decided descriptor's status; undone reports a take refunded
// because another descriptor refused.
func (s *Service) status(sv *served, it *item, undone bool) *pb.RateLimitResponse_DescriptorStatus {
	st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	if !it.res.Allowed && !it.m.rule.shadow {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
	}
	if undone {
		st.Code = pb.RateLimitResponse_OK
	}
	st.CurrentLimit = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: it.m.rpu, Unit: it.m.unit, Name: it.m.rule.name}
	st.LimitRemaining = uint32(min(max(it.res.Remaining, 0), math.MaxUint32))
	st.DurationUntilReset = durationpb.New(it.res.ResetAfter)
	return st
}

// headers returns the x-ratelimit-* headers of the descriptor that decided
// the response: the one that refused, else the one with the fewest tokens
// left. Reset is the whole seconds, rounded up, until the refused take
// could succeed, or until the bucket is full again.
func headers(items []item, refused int) []*core.HeaderValue {
	at := refused
	if at < 0 {
		least := math.MaxInt
		for i := range items {
			if items[i].limited && items[i].res.Remaining < least {
				at, least = i, items[i].res.Remaining
			}
		}
	}
	if at < 0 {
		return nil
	}
	it := &items[at]
	reset := it.res.ResetAfter
	if !it.res.Allowed && it.res.RetryAfter != floodgate.Never {
		reset = it.res.RetryAfter
	}
	secs := int64(math.Ceil(reset.Seconds()))
	remaining := it.res.Remaining
	if refused >= 0 {
		remaining = 0
	}
	return []*core.HeaderValue{
		{Key: HeaderLimit, Value: strconv.FormatUint(uint64(it.m.rpu), 10)},
		{Key: HeaderRemaining, Value: strconv.Itoa(remaining)},
		{Key: HeaderReset, Value: strconv.FormatInt(secs, 10)},
	}
}
