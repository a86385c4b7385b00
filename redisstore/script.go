package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/redis/go-redis/v9"
)

// bucketLua decides one or more bucket operations atomically. A batch of
// decisions on keys of one Cluster slot (or on a standalone server) runs as
// one call; a lone decision is a batch of one.
//
// KEYS[i] is the i-th decision's bucket. ARGV[1] is the time in µs, or -1
// to read the server's TIME; ARGV[2] the longest TTL in ms; ARGV[3] the ms
// added to every lease expiry (see clockSlack); ARGV[4] the calling
// store's id, which names its leases; ARGV[5] its lease time in ms; ARGV[6]
// the ms a bucket lingers once full (see linger). Then nine arguments per
// decision: rate (tokens per second, which is also micro-tokens per µs),
// burst (tokens), n (tokens), mode, three more whose meaning depends on
// the mode, a group number, and a hint.
//
// Modes: 0 takes n (n = 0 is allowed unless the bucket owes tokens, and
// writes nothing); 1 peeks; 2 refunds n; 3 leases: it first closes the
// store's lease on the bucket, if it holds one, giving back ret = a3 of its
// tokens (a3 = -1: the store holds no lease), then takes n + x tokens,
// x = a1 at most and xmin = a2 at least (the whole take is refused when
// n + xmin whole tokens are not there; n + xmin = 0 only closes), and
// records the x tokens beyond n as the store's lease until now plus the
// lease time; 4 settles: n < 0 refunds −n, never above the burst, and n > 0
// charges n whatever the bucket holds, in whole tokens, down to a1 tokens
// below zero at most.
//
// A bucket is a hash. Field "s" holds its state, five little-endian
// doubles: micro-tokens, the µs they were counted at, the micro-tokens
// leased out (G), the earliest and the latest expiry of its leases (µs,
// 0 without leases). Every other field is a lease, named by its store's id:
// its micro-tokens and its expiry. All are integers below 2^53, which
// doubles hold exactly.
//
// A bucket's key lingers ARGV[6] ms after the bucket is full, and longer
// while a lease of it is out. So a missing bucket is full, unless a store
// decided on it within that time: then it was lost (a restarted Redis,
// FLUSHALL), and a decision's hint (whole tokens, -1 for none), what its
// store last saw of the bucket plus the refill since, is what it holds.
//
// The bucket and its leases together never hold more than the burst: the
// refill stops at burst − G. Taking a lease moves tokens into G, closing
// one moves its unspent part back, and a lease that expired unclosed (its
// store died) leaves G at the next decision after its expiry. So over any
// window every token admitted was in the bucket, or in a lease, at its
// start, or refilled during it: see docs/stores.md.
//
// Refill rounds down. Time never moves backwards: a bucket counted at a
// later time than now keeps its time. Decisions that change a bucket write
// it with a TTL: the time until it is full again plus ARGV[6], at most
// ARGV[2] ms, and never before its last lease expires. The TTL may run
// late but must not run early: a decision that writes nothing on a bucket
// lengthens the TTL when the limit in force would take longer to fill it
// (a TTL at ARGV[2], only once a sixteenth of it has passed).
//
// Decisions with the same group number g > 0 are all or nothing: at the
// first of them, all are checked on the buckets as they are then; if each
// would be allowed, all are applied there, else none is, and each is
// answered with its bucket as it is, refused (0) or, had it fitted alone,
// 2.
//
// The reply has three integers per decision: allowed (0 or 1), the bucket's
// micro-tokens after the decision, and the whole tokens taken (by a settle:
// charged). A key that holds something other than a bucket answers -1, 0,
// 0 and is left alone; the script's other decisions are made as usual. A
// bucket of the earlier layout (a 16-byte string) is read, and rewritten
// as a hash.
const bucketLua = `
local now = tonumber(ARGV[1])
local maxttl = tonumber(ARGV[2])
local slack = tonumber(ARGV[3])
local id = ARGV[4]
local leasettl = tonumber(ARGV[5]) * 1000
local linger = tonumber(ARGV[6])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local M = 1000000
local states = {}

-- load returns the key's state, read once per call, or false when the
-- key holds something else.
local function load(key, rate, burst)
  local st = states[key]
  if st ~= nil then
    return st
  end
  local migrated = false
  local v = redis.pcall('HGET', key, 's')
  if type(v) == 'table' then
    local old = redis.pcall('GET', key)
    if type(old) == 'string' and #old == 16 then
      local tk, at = struct.unpack('<d<d', old)
      redis.call('DEL', key)
      v = struct.pack('<d<d<d<d<d', tk, at, 0, 0, 0)
      migrated = true
    else
      states[key] = false
      return false
    end
  elseif (v and #v ~= 40) or (not v and redis.call('EXISTS', key) == 1) then
    -- Another value, or a hash that is not a bucket.
    states[key] = false
    return false
  end
  st = {rate = rate, burst = burst, exists = false, dirty = migrated, recs = {}}
  if v then
    st.exists = true
    st.tokens, st.at, st.g, st.next, st.last = struct.unpack('<d<d<d<d<d', v)
  else
    st.tokens, st.at, st.g, st.next, st.last = burst, now, 0, 0, 0
  end
  states[key] = st
  return st
end

-- prepare brings st to now under the limit: lapsed leases leave G, the
-- bucket refills up to burst − G.
local function prepare(key, st, rate, burst)
  st.rate, st.burst = rate, burst
  if st.g > 0 and st.next > 0 and now >= st.next then
    local all = redis.call('HGETALL', key)
    local nxt = 0
    for j = 1, #all, 2 do
      local f = all[j]
      if f ~= 's' and st.recs[f] == nil then
        local lg, le = struct.unpack('<d<d', all[j + 1])
        if le <= now then
          st.recs[f] = false
          st.g = st.g - lg
        elseif nxt == 0 or le < nxt then
          nxt = le
        end
      end
    end
    if st.g < 1 or nxt == 0 then
      st.g, nxt = 0, 0
    end
    st.next = nxt
    st.dirty = true
  end
  local cap = burst - st.g
  if now > st.at then
    if st.tokens < cap and rate > 0 then
      local add = (now - st.at) * rate
      if add >= cap - st.tokens then
        st.tokens = cap
      else
        st.tokens = st.tokens + math.floor(add)
      end
    end
    st.at = now
  end
  if st.tokens > cap then
    st.tokens = cap
  end
end

-- rec returns the store's lease on the bucket: micro-tokens and expiry,
-- or nil.
local function rec(key, st)
  local r = st.recs[id]
  if r == nil then
    r = redis.call('HGET', key, id)
    if r then
      local lg, le = struct.unpack('<d<d', r)
      r = {lg, le}
    else
      r = false
    end
    st.recs[id] = r
  end
  if r then
    return r
  end
  return nil
end

-- decide applies one decision to st and returns allowed, taken.
local function decide(key, st, mode, burst, n, a1, a2, a3)
  if mode == '0' then
    if n <= burst and st.tokens >= n then
      st.tokens = st.tokens - n
      if n > 0 then
        st.dirty = true
      end
      return 1, n
    end
    return 0, 0
  elseif mode == '1' then
    return 1, 0
  elseif mode == '2' then
    if st.exists and n > 0 then
      st.tokens = math.min(st.tokens + n, burst - st.g)
      st.dirty = true
    end
    return 1, 0
  elseif mode == '3' then
    -- Close the store's lease, if any, whatever the store says of it: a
    -- record left behind would hold G until it expires.
    local r = rec(key, st)
    if r then
      st.g = math.max(st.g - r[1], 0)
      st.tokens = math.min(st.tokens + math.min(math.max(a3, 0), r[1]), burst - st.g)
      st.recs[id] = false
      st.dirty = true
    end
    local need = n + a2
    if need == 0 then
      return 1, 0
    end
    local avail = st.tokens - math.fmod(st.tokens, M)
    if st.tokens < 0 or avail < need then
      return 0, 0
    end
    local give = math.min(n + a1, avail)
    st.tokens = st.tokens - give
    st.dirty = true
    local x = give - n
    if x > 0 then
      local exp = now + leasettl + slack * 1000
      st.recs[id] = {x, exp}
      st.g = st.g + x
      if st.next == 0 or exp < st.next then
        st.next = exp
      end
      if exp > st.last then
        st.last = exp
      end
    end
    return 1, give
  end
  if n < 0 then
    if st.exists then
      st.tokens = math.min(st.tokens - n, burst - st.g)
      st.dirty = true
    end
    return 1, 0
  elseif n > 0 then
    -- The whole tokens the bucket gives before it owes a1. fmod is
    -- exact, where a floor of a quotient may round up near 2^33 tokens;
    -- each operand is whole tokens, so the sum is exact too.
    local room = 0
    if st.tokens >= 0 then
      room = st.tokens - math.fmod(st.tokens, M) + a1
    elseif st.tokens + a1 > 0 then
      room = st.tokens + a1 - math.fmod(st.tokens + a1, M)
    end
    room = math.min(room, n)
    if room > 0 then
      st.tokens = st.tokens - room
      st.dirty = true
      return 1, room
    end
  end
  return 1, 0
end

local W = 9
local count = #KEYS
local out = {}
local function arg(i, k)
  return ARGV[6 + (i - 1) * W + k]
end
-- params reads decision i's arguments, in micro-tokens.
local function params(i)
  return tonumber(arg(i, 1)), tonumber(arg(i, 2)) * M, tonumber(arg(i, 3)) * M, arg(i, 4),
    tonumber(arg(i, 5)) * M, tonumber(arg(i, 6)) * M, tonumber(arg(i, 7))
end
-- prepared loads and prepares decision i's bucket, or returns false.
local function prepared(i)
  local rate, burst, n, mode, a1, a2, a3 = params(i)
  local st = load(KEYS[i], rate, burst)
  local hint = tonumber(arg(i, 9))
  if st and not st.exists and hint >= 0 then
    -- Lost (see above): the bucket holds what the store's hint says.
    st.tokens, st.exists, st.dirty = math.min(hint * M, burst), true, true
  end
  if st then
    prepare(KEYS[i], st, rate, burst)
  end
  return st, rate, burst, n, mode, a1, a2, a3 * M
end
local function answer(i, allowed, st, taken)
  if st.dirty then
    st.exists = true
  end
  out[3 * i - 2] = allowed
  out[3 * i - 1] = st.tokens
  out[3 * i] = taken / M
end
local function copy(st)
  local c = {}
  for k, v in pairs(st) do
    c[k] = v
  end
  local r = {}
  for k, v in pairs(st.recs) do
    r[k] = v
  end
  c.recs = r
  return c
end

local decided = {}
for i = 1, count do
  if not decided[i] then
    local grp = arg(i, 8)
    if grp == '0' then
      decided[i] = true
      local st, rate, burst, n, mode, a1, a2, a3 = prepared(i)
      if st then
        local allowed, taken = decide(KEYS[i], st, mode, burst, n, a1, a2, a3)
        answer(i, allowed, st, taken)
      else
        out[3 * i - 2], out[3 * i - 1], out[3 * i] = -1, 0, 0
      end
    else
      -- All or nothing: try the group on copies, then apply or refuse.
      local members = {}
      for j = i, count do
        if arg(j, 8) == grp then
          members[#members + 1] = j
          decided[j] = true
        end
      end
      local trial = {}
      local fits = {}
      local ok = true
      for _, j in ipairs(members) do
        local st, rate, burst, n, mode, a1, a2, a3 = prepared(j)
        if not st then
          ok = false
        else
          local c = trial[KEYS[j]]
          if c == nil then
            c = copy(st)
            trial[KEYS[j]] = c
          end
          fits[j] = decide(KEYS[j], c, mode, burst, n, a1, a2, a3)
          if fits[j] ~= 1 then
            ok = false
          end
        end
      end
      for _, j in ipairs(members) do
        local st, rate, burst, n, mode, a1, a2, a3 = prepared(j)
        if not st then
          out[3 * j - 2], out[3 * j - 1], out[3 * j] = -1, 0, 0
        elseif ok then
          local allowed, taken = decide(KEYS[j], st, mode, burst, n, a1, a2, a3)
          answer(j, allowed, st, taken)
        elseif fits[j] == 1 then
          answer(j, 2, st, 0) -- it fitted; the group did not
        else
          answer(j, 0, st, 0)
        end
      end
    end
  end
end

-- Write what changed, once per key, with its TTL.
for key, st in pairs(states) do
  if st then
    local burst = st.burst
    local ttl = maxttl
    if st.rate > 0 then
      ttl = math.min(math.ceil(math.max(burst - st.tokens, 0) / st.rate / 1000) + linger, maxttl)
    end
    if st.last > now then
      ttl = math.max(ttl, math.ceil((st.last - now) / 1000) + linger)
    end
    if st.dirty then
      if st.exists then
        for f, r in pairs(st.recs) do
          if r == false then
            redis.call('HDEL', key, f)
          else
            redis.call('HSET', key, f, struct.pack('<d<d', r[1], r[2]))
          end
        end
        if st.g <= 0 then
          st.next, st.last = 0, 0
        end
        redis.call('HSET', key, 's', struct.pack('<d<d<d<d<d', st.tokens, st.at, st.g, st.next, st.last))
        redis.call('PEXPIRE', key, ttl)
      end
    elseif st.exists then
      -- The limit changed since the last write (a lower rate, a higher
      -- burst): the key must not expire before the bucket is full under
      -- the limit in force. A TTL at the cap is renewed only once a
      -- sixteenth of it has passed: every refusal of a rate-0 bucket would
      -- write otherwise.
      local want = ttl
      if ttl == maxttl then
        want = ttl - ttl / 16
      end
      if redis.call('PTTL', key) < want then
        redis.call('PEXPIRE', key, ttl)
      end
    end
  end
end
return out
`

// maxTTL bounds every key's TTL. Only buckets that refill slower than one
// burst in maxTTL (including rate 0) ever reach it; they forget their state
// maxTTL after the last decision that set their TTL (a take, or a refusal
// at least a sixteenth of maxTTL later) and start full again.
const maxTTL = 400 * 24 * time.Hour

var maxTTLArg = strconv.FormatInt(maxTTL.Milliseconds(), 10)

// clockSlack is added to lease expiries in client-clock mode: each client
// sends its own clock, and one whose clock runs δ ahead would expire the
// others' leases on Redis δ early, while they are still spent. The slack
// absorbs offsets up to 1 s.
const clockSlack = time.Second

var slackArgs = [2]string{"0", strconv.FormatInt(clockSlack.Milliseconds(), 10)}

// linger is how long a bucket's key outlives the time the bucket is full
// again: within it, a store that decided on the bucket can tell a lost
// bucket from a full one, and hints what it held (bucketLua). It is longer
// than clockSlack, which it also covers: keys expire on Redis's clock,
// buckets refill on the clients' in client-clock mode.
const linger = 10 * time.Second

// hintAge is how old a store's last answer for a key may be for a hint:
// half of linger, so that clock rates and the round trip's time never
// make a store hint for a bucket that expired full.
const hintAge = linger / 2

var lingerArg = strconv.FormatInt(linger.Milliseconds(), 10)

// fullState is the state of a bucket that holds more than any burst: full
// under every limit (bucketLua caps it), with no lease out.
var fullState = func() string {
	b := make([]byte, 40)
	binary.LittleEndian.PutUint64(b, math.Float64bits(float64(floodgate.MaxBurst)*1e6))
	return string(b)
}()

var bucketScript = redis.NewScript(bucketLua)

const (
	modeTake   = 0
	modePeek   = 1
	modeRefund = 2
	modeLease  = 3
	modeSettle = 4
)

// op is one decision on its way to Redis.
type op struct {
	key  string
	lim  floodgate.Limit
	n    int // a settle's: the tokens to charge, or to refund when negative
	mode int
	// a1, a2 and a3 are the mode's arguments (bucketLua): a lease's
	// extra tokens, its minimum and what it gives back (-1: no lease
	// held); a settle's debt limit comes from lim.
	a1, a2, a3 int
	// hint, when hinted, is a take's or a lease's: the whole tokens this
	// store expects the bucket to hold, for a bucket Redis lost
	// (bucketLua).
	hint   int
	hinted bool
	grp    int   // all-or-nothing group within a call, 0 for none
	sent   int64 // a lease's: local ns when it was asked for
	exp    int64 // a lease's: the expiry of the lease it closes, local ns
}

// reply is the script's answer for one op.
type reply struct {
	allowed bool
	fitted  bool  // refused with its group, though it fitted alone
	tokens  int64 // micro-tokens after the decision
	taken   int64 // whole tokens taken
}

// errNotBucket is the error of a decision on a key that holds something
// other than a bucket. Redis answered: the key, not Redis, is at fault.
var errNotBucket = errors.New("redisstore: key holds a value that is not a bucket")

// argsPerOp is the script's arguments per decision.
const argsPerOp = 9

// small holds the boxed small integers that most arguments are, so that
// appending them allocates nothing.
var small = func() (s [16]any) {
	for i := range s {
		s[i] = i
	}
	return
}()

var minusOne any = -1

func boxedHint(v int) any {
	if v < 0 {
		return minusOne
	}
	return boxed(v)
}

func boxed(v int) any {
	if v >= 0 && v < len(small) {
		return small[v]
	}
	return v
}

// appendArgs appends op's script arguments. The limit's come preformatted
// from a one-entry cache: most stores apply few limits, and boxing and
// formatting them was a visible share of a batched decision.
func (o *op) appendArgs(args []any) []any {
	la := lastLimit.Load()
	if la == nil || la.lim != o.lim {
		la = &limitArgs{
			lim:   o.lim,
			rate:  strconv.FormatFloat(o.lim.Rate, 'f', -1, 64),
			burst: strconv.Itoa(o.lim.Burst),
			debt:  o.lim.DebtLimit(),
		}
		lastLimit.Store(la)
	}
	a1, a3 := o.a1, o.a3
	switch o.mode {
	case modeSettle:
		a1 = la.debt
		a3 = 0
	case modeLease:
	default:
		a3 = 0
	}
	hint := -1
	if o.hinted && (o.mode == modeTake || o.mode == modeLease) {
		hint = o.hint
	}
	return append(args, la.rate, la.burst, boxed(o.n), boxed(o.mode), boxed(a1), boxed(o.a2), boxed(a3), boxed(o.grp), boxedHint(hint))
}

type limitArgs struct {
	lim         floodgate.Limit
	rate, burst any
	debt        int
}

var lastLimit atomic.Pointer[limitArgs]

// isNoScript reports whether err says the script is not in the server's
// cache (after SCRIPT FLUSH, a restart or a failover).
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// evalOps runs ops as one script call on c, falling back from EVALSHA to EVAL
// when the server does not know the script. All keys must share a slot on a
// Cluster.
func (s *Store) evalOps(ctx context.Context, c redis.Scripter, now int64, ops []*op) ([]int64, error) {
	keys := make([]string, len(ops))
	args := make([]any, 0, headArgs+argsPerOp*len(ops))
	args = s.appendHead(args, now)
	for i, o := range ops {
		keys[i] = o.key
		args = o.appendArgs(args)
	}
	cmd := c.EvalSha(ctx, bucketScript.Hash(), keys, args...)
	if isNoScript(cmd.Err()) {
		cmd = c.Eval(ctx, bucketLua, keys, args...)
	}
	return cmd.Int64Slice()
}

// headArgs is the script's arguments before the decisions'.
const headArgs = 6

// appendHead appends the script's first arguments: the time, the longest
// TTL, the TTL slack (none on the server's clock), this store's id and
// lease time.
func (s *Store) appendHead(args []any, now int64) []any {
	slack := slackArgs[0]
	if now >= 0 {
		slack = slackArgs[1]
	}
	return append(args, now, maxTTLArg, slack, s.inst.id, s.leaseArg, lingerArg)
}

// parse reads the i-th reply out of vals: errShortReply when it is missing,
// errNotBucket when the key held something else.
func parse(vals []int64, i int) (reply, error) {
	if len(vals) < 3*(i+1) {
		return reply{}, errShortReply
	}
	v := vals[3*i:]
	if v[0] < 0 {
		return reply{}, errNotBucket
	}
	return reply{allowed: v[0] == 1, fitted: v[0] == 2, tokens: v[1], taken: v[2]}, nil
}

// unit converts micro-tokens to the 1e-9 token units of the duration math:
// the nanosecond arithmetic below is then the same as the keyed store's.
const unit = 1000

// waitFor returns how long lim takes to add need units of 1e-9 token,
// rounded up to the microsecond so that a retry after exactly that long
// succeeds, or Never. The script counts time in whole microseconds: a wait
// of a whole number of them is refilled in full however the clock's
// readings are truncated, where a wait in nanoseconds may lose one.
func waitFor(lim floodgate.Limit, need int64) time.Duration {
	if need <= 0 {
		return 0
	}
	if !(lim.Rate > 0) {
		return floodgate.Never
	}
	f := math.Ceil(float64(need) / lim.Rate)
	if f >= float64(floodgate.Never-time.Microsecond) {
		return floodgate.Never
	}
	ns := int64(f)
	if float64(ns)*lim.Rate < float64(need) {
		ns++
	}
	return time.Duration(ns+999) / time.Microsecond * time.Microsecond
}

// result turns a reply into a Result under the op's limit.
func (o *op) result(r reply) floodgate.Result {
	res := floodgate.Result{Allowed: r.allowed, Limit: o.lim, Source: floodgate.SourceRedis}
	tokens := r.tokens * unit
	burst := int64(o.lim.Burst) * 1e9
	count(&res, r.tokens)
	res.ResetAfter = waitFor(o.lim, burst-tokens)
	if !r.allowed {
		if o.n > o.lim.Burst {
			res.RetryAfter = floodgate.Never
		} else {
			need := int64(o.n) * 1e9
			if o.mode == modeLease {
				need = int64(o.n+o.a2) * 1e9
			}
			res.RetryAfter = waitFor(o.lim, need-tokens)
		}
	}
	return res
}

// count writes micro-tokens into res: the whole tokens Remaining, or the
// tokens Owed, rounded up, while the bucket is below zero.
func count(res *floodgate.Result, micro int64) {
	if micro > 0 {
		res.Remaining = int(micro / 1e6)
	} else if micro < 0 {
		res.Owed = int((-micro + 1e6 - 1) / 1e6)
	}
}
