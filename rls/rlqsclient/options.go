package rlqsclient

import (
	"fmt"
	"time"

	"github.com/floodgate-go/floodgate"
)

// An Option configures a [Client]. [New] applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result.
type Option func(*options)

type options struct {
	interval     time.Duration
	bucketID     func(key string, lim floodgate.Limit) map[string]string
	noAssignment func(lim floodgate.Limit) floodgate.Limit
	clock        floodgate.Clock
	capacity     int
}

func defaults() options {
	return options{
		interval:     5 * time.Second,
		bucketID:     func(key string, _ floodgate.Limit) map[string]string { return map[string]string{"key": key} },
		noAssignment: func(lim floodgate.Limit) floodgate.Limit { return lim },
		clock:        floodgate.ClockFunc(time.Now),
		capacity:     100_000,
	}
}

// WithReportInterval sets how often [Client.Run] reports every bucket's
// usage, 5 s by default as Envoy's filter does. The server's assignments
// live a few intervals (floodgate-rls: 2I + 2 s), so it must match the
// server's. It must be positive; a repeated call replaces it.
func WithReportInterval(d time.Duration) Option {
	return func(o *options) { o.interval = d }
}

// WithBucketID sets the function that names a key's RLQS bucket, called
// once, on the key's first take, with the limit of that take. By default
// the BucketId is {"key": key}. Keys given the same BucketId share one
// bucket, its assignment and its local tokens. A nil or empty map leaves the
// key unreported: it is decided by the no-assignment behaviour alone, as
// Envoy allows a request it cannot name. The map must not be modified after
// it is returned. A repeated call replaces the function.
func WithBucketID(f func(key string, lim floodgate.Limit) map[string]string) Option {
	return func(o *options) { o.bucketID = f }
}

// WithNoAssignment sets the limit a key is held to, in this process alone,
// while it has no assignment: before the first arrives, after one's time to
// live lapses, and while the server cannot be reached. f receives the limit
// of the take. The default is that limit itself.
//
// The default is safer than Envoy's allow-all for a gRPC server, which has
// no other limiter in front of it: allow-all would leave every key
// unlimited at once when the fleet restarts (every key new) or the RLQS
// server is down for longer than a TTL, the moments a backend is most
// fragile. The key's own limit bounds the fleet at N times the limit for N
// processes, and a single process exactly. Return floodgate.Inf to allow
// all, lim.Scale(1/N) for a static split among N processes, or the zero
// Limit to deny all (a denial then has a RetryAfter of one report
// interval). A repeated call replaces f.
func WithNoAssignment(f func(lim floodgate.Limit) floodgate.Limit) Option {
	return func(o *options) { o.noAssignment = f }
}

// WithClock sets the clock of the local buckets, of the reports' elapsed
// times and of assignments' time to live, the system clock by default.
// [Client.Run] ticks on real time; a test driving a fake clock calls
// [Client.Report] instead. A repeated call replaces it.
func WithClock(c floodgate.Clock) Option {
	return func(o *options) { o.clock = c }
}

// WithCapacity sets how many buckets (BucketIds) a Client subscribes at
// most, 100,000 by default. A new key past it is decided by the
// no-assignment behaviour and not reported, until the server abandons
// buckets that went idle. Every bucket held is reported every interval. It
// must be ≥ 1; a repeated call replaces it.
func WithCapacity(n int) Option {
	return func(o *options) { o.capacity = n }
}

func (o *options) validate() error {
	switch {
	case o.interval <= 0:
		return invalid("WithReportInterval(%v): not positive", o.interval)
	case o.bucketID == nil:
		return invalid("WithBucketID(nil)")
	case o.noAssignment == nil:
		return invalid("WithNoAssignment(nil)")
	case o.clock == nil:
		return invalid("WithClock(nil)")
	case o.capacity < 1:
		return invalid("WithCapacity(%d): below 1", o.capacity)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: rlqsclient: "+format, append([]any{floodgate.ErrInvalidOption}, args...)...)
}
