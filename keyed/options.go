package keyed

import (
	"fmt"

	"github.com/floodgate-go/floodgate"
)

// DefaultCapacity is the number of keys a Map tracks when no
// [WithCapacity] option is given.
const DefaultCapacity = 100_000

// Pressure says what a full Map does when a new key arrives and the
// eviction scan finds no full bucket to drop.
type Pressure uint8

const (
	// Protect never evicts a bucket that is not full: the new key is
	// decided by its shard's shared overflow bucket instead, and
	// [Stats].Overflowed counts it. A flood of made-up keys can then slow
	// down new clients but never resets a drained client. The default.
	Protect Pressure = iota
	// Evict evicts the not-yet-full bucket closest to full, preferring
	// buckets not used recently, but never one that owes tokens (see
	// [Map.SettleN]), and counts it in [Stats].EvictedNotFull.
	// A key gets a bucket of its own, at the price of handing the evicted
	// client a fresh burst when it returns. (Eviction scans the new key's
	// shard, and, when that shard holds less than its share of the
	// capacity, up to four others whose locks are free; a key that still
	// finds no room shares the overflow bucket.)
	Evict
)

// An Eviction describes a bucket dropped to make room for a new key.
type Eviction struct {
	// Hash is a 62-bit hash of the evicted key under the Map's random seed.
	// The Map keeps no key bytes, so this is all it can say of the key:
	// evictions of one key from one Map carry the same Hash, which tells a
	// key evicted again and again from many keys evicted once, but the key
	// cannot be recovered from it.
	Hash uint64
	// Full reports whether the bucket had refilled. Evicting a full bucket
	// changes no decision; evicting one that was not full hands its client
	// a fresh burst.
	Full bool
}

// An Option configures a [Map]. [New] applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of [floodgate.ErrInvalidOption]).
type Option func(*options)

type options struct {
	capacity int
	shards   int
	clock    floodgate.Clock
	onEvict  func(Eviction)
	pressure Pressure
}

// WithCapacity sets the maximum number of keys the Map tracks, across all
// shards; it bounds memory. It must be ≥ 1. A later call replaces an
// earlier one. The default is [DefaultCapacity].
func WithCapacity(n int) Option { return func(o *options) { o.capacity = n } }

// WithShards sets the number of shards: a power of two from 1 to 1024. A
// take on a tracked key locks only its own slot, whatever the shard count;
// the shard's mutex serializes inserts, evictions and resets, so more shards
// help a workload that adds keys from many goroutines at once, and each
// shard keeps its own overflow bucket under [Protect]. A later call replaces
// an earlier one. The default is 64, or fewer for capacities below 1024 (at
// least 16 keys per shard).
func WithShards(n int) Option { return func(o *options) { o.shards = n } }

// WithClock makes the Map read time from c instead of the monotonic clock:
// for tests and simulations. A nil c restores the default. A later call
// replaces an earlier one.
func WithClock(c floodgate.Clock) Option { return func(o *options) { o.clock = c } }

// WithOnEvict registers f to be called after each eviction, on the
// goroutine whose take caused it, after the shard lock is released (so f may
// call the Map). f runs on the request path: keep it fast. A later call
// replaces an earlier one; nil removes it.
func WithOnEvict(f func(Eviction)) Option { return func(o *options) { o.onEvict = f } }

// WithPressure sets what a full Map does when it finds no full bucket to
// evict. The default is [Protect]. A later call replaces an earlier one.
func WithPressure(p Pressure) Option { return func(o *options) { o.pressure = p } }

func buildOptions(opts []Option) (options, error) {
	o := options{capacity: DefaultCapacity}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.capacity < 1 {
		return o, fmt.Errorf("%w: keyed: WithCapacity(%d): the capacity must be at least 1", floodgate.ErrInvalidOption, o.capacity)
	}
	if o.shards == 0 {
		// Enough shards that two cores rarely meet on one lock, but at
		// least 16 keys of capacity per shard: a shard short of its share
		// evicts from a few others, and more shards would make that common.
		o.shards = 64
		for o.shards > 1 && o.shards*16 > o.capacity {
			o.shards /= 2
		}
	}
	if o.shards < 1 || o.shards > 1024 || o.shards&(o.shards-1) != 0 {
		return o, fmt.Errorf("%w: keyed: WithShards(%d): the shard count must be a power of two from 1 to 1024", floodgate.ErrInvalidOption, o.shards)
	}
	if o.pressure > Evict {
		return o, fmt.Errorf("%w: keyed: WithPressure(%d): no such policy", floodgate.ErrInvalidOption, o.pressure)
	}
	return o, nil
}
