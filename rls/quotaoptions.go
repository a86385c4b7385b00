package rls

import (
	"context"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/remote"
)

// A QuotaOption configures a [QuotaServer]. [NewQuotaServer] applies the
// options in order to a copy of the defaults, skipping nil ones, then
// validates the result (the convention of floodgate.ErrInvalidOption).
type QuotaOption func(*quotaOptions)

type quotaOptions struct {
	interval   time.Duration
	ttl        time.Duration // 0: 2×interval + 2 s, rounded up to whole seconds
	clock      floodgate.Clock
	maxBuckets int
	idle       time.Duration
	store      QuotaStore // nil: one replica, in memory
}

// Division constants. A subscriber's burst is half a second of its share:
// an Envoy's token bucket that holds less denies requests that arrive a
// little early, so a steady subscriber would not get its share; the bursts
// together stay at most half a second of the limit plus one token a
// subscriber.
const (
	quotaReserve    = 0.01 // ρ: the share of each limit held back for newcomers
	quotaHeadroom   = 0.05 // h: a subscriber under its equal part gets d(1+h)
	quotaBurst      = 0.5  // β, in seconds: max_tokens = max(1, ⌈rate·β⌉)
	quotaHysteresis = 0.05 // a share is re-sent changed only past max(1 token, 5%)
)

func quotaDefaults() quotaOptions {
	return quotaOptions{interval: 5 * time.Second, maxBuckets: 10000, idle: 10 * time.Minute}
}

// WithReportInterval sets the interval I at which Envoy reports, 5 s by
// default as Envoy's filter hard-codes it (its bucket's reporting_interval
// is ignored). The server recomputes its shares every I ([QuotaServer.Run])
// and, unless [WithAssignmentTTL] says otherwise, gives assignments a TTL of
// 2I + 2 s in whole seconds. It must be positive; a repeated call replaces
// it.
func WithReportInterval(d time.Duration) QuotaOption {
	return func(o *quotaOptions) { o.interval = d }
}

// WithAssignmentTTL sets the time to live of every assignment, which is also
// how long a subscriber that stops reporting, or whose stream ends, keeps its
// share counted against the limit. By default 2I + 2 s (I the report
// interval) rounded up to whole seconds: 12 s for Envoy's 5 s. Envoy reads
// only whole seconds and expires a TTL of 0 at once, so ttl must be a whole
// number of seconds, at least 1. A repeated call replaces it.
func WithAssignmentTTL(ttl time.Duration) QuotaOption {
	return func(o *quotaOptions) { o.ttl = ttl }
}

// WithQuotaClock sets the clock that times reports, leases and idleness,
// the system clock by default (nil). [QuotaServer.Run] ticks on real time;
// a test driving a fake clock calls [QuotaServer.Tick] instead. A repeated
// call replaces it.
func WithQuotaClock(c floodgate.Clock) QuotaOption {
	return func(o *quotaOptions) { o.clock = c }
}

// WithMaxBucketsPerStream sets how many buckets one stream may hold, 10000 by
// default: a report's new bucket past it is not answered nor tracked, and
// counted (floodgate_rls_quota_reports_ignored_total{reason="too_many_buckets"});
// Envoy keeps it on its no-assignment behaviour, where an abandon would have
// it resubscribe on its next request. Each bucket a stream holds is reported every interval,
// forever, so the bound is the server's defence against a stream that names
// a bucket per request. It must be ≥ 1; a repeated call replaces it.
func WithMaxBucketsPerStream(n int) QuotaOption {
	return func(o *quotaOptions) { o.maxBuckets = n }
}

// WithIdleAbandon sets how long a bucket may report no request at all before
// the server abandons it (Envoy erases it, and subscribes again with its
// next request): 10 minutes by default. It must be at least the assignment
// TTL; a repeated call replaces it.
func WithIdleAbandon(d time.Duration) QuotaOption {
	return func(o *quotaOptions) { o.idle = d }
}

// A QuotaStore holds the grants of a limit divided among [QuotaServer]
// replicas: a *redisstore.Store is one, and its Share states the contract.
type QuotaStore interface {
	Share(ctx context.Context, key string, req remote.ShareRequest) (remote.ShareReply, error)
}

// WithQuotaStore has the server divide each limit with every other replica
// that shares st (for a *redisstore.Store, its Redis and prefix): each
// replica holds a grant of the limit there and divides it among its own
// subscribers, so that Envoys connected to different replicas share one
// quota by their demand, as if one server divided it. Without it (nil, the
// default) the division is in memory, and two servers on one limit each
// divide the whole of it. See the package doc, "Replicas on Redis", for
// what a replica sends and the bound. st must be nil or a working store:
// a nil *redisstore.Store inside a non-nil QuotaStore is not detected. A
// repeated call replaces it.
func WithQuotaStore(st QuotaStore) QuotaOption {
	return func(o *quotaOptions) { o.store = st }
}

// sharePeriod is QuotaServer.RoundPeriod.
func (o *quotaOptions) sharePeriod() time.Duration {
	return min(max(o.interval/4, 100*time.Millisecond), time.Second)
}

// shareHold returns how long a replica's grant lives on Redis past its
// latest round: the assignment TTL, which the last assignment handed out
// of the grant may still run, plus two rounds, the longest a replica may
// go on handing out between rounds that Redis answers.
func (o *quotaOptions) shareHold() time.Duration { return o.ttl + 2*o.sharePeriod() }

func (o *quotaOptions) validate() error {
	switch {
	case o.interval <= 0:
		return invalid("WithReportInterval(%v): not positive", o.interval)
	case o.ttl < 0 || (o.ttl != 0 && (o.ttl < time.Second || o.ttl%time.Second != 0)):
		return invalid("WithAssignmentTTL(%v): not a whole number of seconds ≥ 1s", o.ttl)
	case o.maxBuckets < 1:
		return invalid("WithMaxBucketsPerStream(%d): below 1", o.maxBuckets)
	}
	if o.ttl == 0 {
		o.ttl = (2*o.interval + 2*time.Second + time.Second - 1).Truncate(time.Second)
	}
	if o.idle < o.ttl {
		return invalid("WithIdleAbandon(%v): below the assignment TTL %v", o.idle, o.ttl)
	}
	return nil
}
