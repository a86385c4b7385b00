package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Local policy splits a limit among the instances that share it, which
// count each other for it (docs/DESIGN.md, decision 7, "Divisor"): each
// registers its random id in one sorted set per prefix and name, scored by
// the time it last decided on Redis, and reads how many ids are younger than
// instanceTTL. The Local policy divides by that count, or by the configured
// divisor when it is larger.
//
// The set's key is <prefix>:{<name>}: it ends with '}', which no bucket key
// does (a bucket key ends with :<name>, and names hold no braces), so the
// two never collide.
//
// Registration is off the decision path: after a call that Redis answered,
// at most once per instancePeriod, the store sends it from a goroutine of
// its own that ends within the deadline.

const instancePeriod = time.Second

// testInstancePeriod, when not 0, replaces instancePeriod (ns): tests
// shorten it so that stores count each other at once.
var testInstancePeriod atomic.Int64

const instanceTTL = 5 * time.Second

// instancesLua registers ARGV[1] at the time ARGV[2] (µs, or -1 for the
// server's TIME), drops ids older than ARGV[3] ms and returns how many are
// left.
const instancesLua = `
local now = tonumber(ARGV[2])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = math.floor(now / 1000)
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
`

var instancesScript = redis.NewScript(instancesLua)

var instanceTTLArg = strconv.FormatInt(instanceTTL.Milliseconds(), 10)

type instances struct {
	id    string
	raw   string // id's 8 bytes, which name this store's leases (bucketLua)
	key   string
	next  atomic.Int64 // ns since monoBase of the next registration
	count atomic.Int64 // the divisor the count gives, 0 before the first

	mu     sync.Mutex
	high   int64 // the highest count of the last instanceTTL
	highAt int64 // ns since monoBase when it was last counted
	lastOK int64 // ns since monoBase of the last registration, 0 before one
}

// counted records a count. A lower count replaces a higher one only when
// the higher one is instanceTTL old: a Redis that restarted empty, or lost
// the set, counts one store at first, and a share computed from that would
// let each store admit the whole limit. After a gap in registrations (Redis
// down, or the store idle) the higher count stays another instanceTTL,
// since the set expired meanwhile and the others re-register one by one.
func (in *instances) counted(n int64) {
	now := int64(time.Since(monoBase))
	in.mu.Lock()
	gap := in.lastOK == 0 || now-in.lastOK >= instanceTTL.Nanoseconds()-int64(in.period())
	switch {
	case gap:
		in.high, in.highAt = max(in.high, n), now
	case n >= in.high || now-in.highAt >= int64(instanceTTL):
		in.high, in.highAt = n, now
	}
	in.lastOK = now
	in.count.Store(in.high)
	in.mu.Unlock()
}

// period returns how often a store registers.
func (in *instances) period() time.Duration {
	if p := testInstancePeriod.Load(); p != 0 {
		return time.Duration(p)
	}
	return instancePeriod
}

func newInstances(prefix, name string) *instances {
	var b [8]byte
	rand.Read(b[:])
	return &instances{id: hex.EncodeToString(b[:]), raw: string(b[:]), key: prefix + ":{" + name + "}"}
}

// register starts a registration if one is due. It is called after calls
// that Redis answered.
func (s *Store) register() {
	in := s.inst
	now := int64(time.Since(monoBase))
	next := in.next.Load()
	period := int64(in.period())
	if now < next || !in.next.CompareAndSwap(next, now+period) {
		return
	}
	go s.registration()
}

// registration registers this store on Redis and records the count, within
// the deadline.
func (s *Store) registration() {
	in := s.inst
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.deadline)
	defer cancel()
	s.bounded(ctx, func(ctx context.Context) error {
		n, err := instancesScript.Run(ctx, s.client, []string{in.key}, in.id, s.now(), instanceTTLArg).Int64()
		if err == nil && n > 0 {
			in.counted(n)
			if s.obs != nil {
				s.obs.ObserveInstances(int(in.count.Load()))
			}
		}
		return err
	})
}

// divisor returns the Local policy's divisor now: the instances counted on
// Redis, or the configured divisor when that is larger.
func (s *Store) divisor() float64 {
	return max(s.opts.divisor, float64(s.inst.count.Load()))
}
