package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
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
// the ms a bucket lingers once full (see linger). ARGV[6 + i] is the i-th
// decision: nine little-endian doubles, rate (tokens per second, which is
// also micro-tokens per µs), burst (tokens), n (tokens), mode, three more
// whose meaning depends on the mode (a1, a2, a3), a group number, and a
// hint.
//
// Modes: 0 takes n (n = 0 is allowed unless the bucket owes tokens, and
// writes nothing); 1 peeks; 2 refunds n; 3 leases: it first closes the
// store's lease on the bucket, if it holds one, giving back ret = a3 of its
// tokens (a3 = -1: the store holds no lease), then takes n + x tokens,
// x = a1 at most and xmin = a2 at least, or only n when fewer than n + xmin
// whole tokens are there (n + xmin = 0 only closes), and records the x
// tokens beyond n as the store's lease until now plus the lease time; 4 settles: n < 0 refunds −n, never above the burst, and n > 0
// charges n whatever the bucket holds, in whole tokens, down to a1 tokens
// below zero at most.
//
// A bucket is a string: its state, five little-endian doubles
// (micro-tokens, the µs they were counted at, the micro-tokens leased out
// (G), the earliest and the latest expiry of its leases in µs, 0 without
// leases), then its leases, 24 bytes each: the store's id (8 bytes), the
// lease's micro-tokens and its expiry. All are integers below 2^53, which
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
// bucket of the earlier layout (a 16-byte state) is read, and rewritten.
const bucketLua = `
local now = tonumber(ARGV[1])
local maxttl = tonumber(ARGV[2])
local slack = tonumber(ARGV[3]) * 1000
local id = ARGV[4]
local leasettl = tonumber(ARGV[5]) * 1000
local linger = tonumber(ARGV[6])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local M = 1000000
local pack, unpack, sub, fmod, floor, min, max = struct.pack, struct.unpack, string.sub, math.fmod, math.floor, math.min, math.max

-- step decides on a bucket whose value is v (false: missing), and returns
-- allowed (-1: not a bucket), the micro-tokens after, the whole tokens
-- taken, the value to write (nil: none) and its TTL, and whether the TTL
-- must be checked (a bucket not full that nothing was written to).
local function step(v, rate, burst, n, mode, a1, a2, a3, hint)
  local tokens, at, g, nxt, last, recs
  local exists, dirty = true, false
  if not v then
    exists, tokens, at, g, nxt, last, recs = false, burst, now, 0, 0, 0, ''
    if hint >= 0 then
      -- Lost (see above): the bucket holds what the store's hint says.
      exists, dirty, tokens = true, true, min(hint * M, burst)
    end
  elseif #v == 16 then -- the earlier layout
    tokens, at = unpack('<d<d', v)
    g, nxt, last, recs, dirty = 0, 0, 0, '', true
  elseif #v >= 40 and (#v - 40) % 24 == 0 then
    tokens, at, g, nxt, last = unpack('<d<d<d<d<d', v)
    recs = sub(v, 41)
  else
    return -1, 0, 0
  end
  -- The bucket refills up to burst − G, with G as it stood since the last
  -- decision: a lease that lapsed meanwhile holds its part of the burst
  -- until now, so that no refill earned under the lower cap is credited
  -- above it (what the bucket would have refilled above that cap since the
  -- lapse is not added: it errs toward the limit). Then lapsed leases
  -- leave G.
  local cap = burst - g
  if now > at then
    if tokens < cap and rate > 0 then
      local add = (now - at) * rate
      if add >= cap - tokens then
        tokens = cap
      else
        tokens = tokens + floor(add)
      end
    end
    at = now
  end
  if g > 0 and now >= nxt then
    local keep = {}
    g, nxt = 0, 0
    for p = 1, #recs, 24 do
      local lg, le = unpack('<d<d', sub(recs, p + 8, p + 23))
      if le > now then
        keep[#keep + 1] = sub(recs, p, p + 23)
        g = g + lg
        if nxt == 0 or le < nxt then
          nxt = le
        end
      end
    end
    recs, dirty = table.concat(keep), true
    cap = burst - g
  end
  if tokens > cap then
    tokens = cap
  end
  local allowed, taken = 1, 0
  if mode == 0 then
    if n <= burst and tokens >= n then
      tokens, taken = tokens - n, n
      dirty = dirty or n > 0
    else
      allowed = 0
    end
  elseif mode == 1 then
  elseif mode == 2 then
    if exists and n > 0 then
      tokens, dirty = min(tokens + n, cap), true
    end
  elseif mode == 3 then
    -- Close the store's lease, if any, whatever the store says of it: a
    -- record left behind would hold G until it expires.
    if g > 0 then
      for p = 1, #recs, 24 do
        if sub(recs, p, p + 7) == id then
          local lg = unpack('<d', sub(recs, p + 8, p + 15))
          recs = sub(recs, 1, p - 1) .. sub(recs, p + 24)
          g = max(g - lg, 0)
          tokens, dirty = min(tokens + min(max(a3, 0), lg), burst - g), true
          break
        end
      end
    end
    local need = n + a2
    if need > 0 then
      local avail = tokens - fmod(tokens, M)
      if tokens < 0 or avail < n then
        allowed = 0
      elseif avail < need then
        -- Too little to lease: the request's tokens only.
        tokens, taken, dirty = tokens - n, n, dirty or n > 0
      else
        taken = min(n + a1, avail)
        tokens, dirty = tokens - taken, true
        local x = taken - n
        if x > 0 then
          local exp = now + leasettl + slack
          recs, g = recs .. id .. pack('<d<d', x, exp), g + x
          if nxt == 0 or exp < nxt then
            nxt = exp
          end
          if exp > last then
            last = exp
          end
        end
      end
    end
  elseif n < 0 then -- settle: a refund
    if exists then
      tokens, dirty = min(tokens - n, cap), true
    end
  elseif n > 0 then -- settle: a charge
    -- The whole tokens the bucket gives before it owes a1. fmod is
    -- exact, where a floor of a quotient may round up near 2^33 tokens;
    -- each operand is whole tokens, so the sum is exact too.
    local room = 0
    if tokens >= 0 then
      room = tokens - fmod(tokens, M) + a1
    elseif tokens + a1 > 0 then
      room = tokens + a1 - fmod(tokens + a1, M)
    end
    room = min(room, n)
    if room > 0 then
      tokens, taken, dirty = tokens - room, room, true
    end
  end
  if not (dirty or (exists and tokens < burst)) then
    return allowed, tokens, taken / M
  end
  local ttl = maxttl
  if rate > 0 then
    ttl = min(math.ceil(max(burst - tokens, 0) / rate / 1000) + linger, maxttl)
  end
  if g <= 0 then
    g, nxt, last, recs = 0, 0, 0, ''
  elseif last > now then
    ttl = max(ttl, math.ceil((last - now) / 1000) + linger)
  end
  if dirty then
    return allowed, tokens, taken / M, pack('<d<d<d<d<d', tokens, at, g, nxt, last) .. recs, ttl
  end
  return allowed, tokens, taken / M, nil, ttl, true
end

local count = #KEYS
local out = {}
local vals = {} -- the values of the keys read, as written since

-- run decides decision i (or with peek, peeks at its bucket) on the
-- bucket's value v, and returns step's results. Its arguments are
-- ARGV[6 + i], little-endian doubles: rate, burst, n, mode, a1, a2, a3,
-- group and hint.
local function run(i, v, peek)
  local rate, burst, n, mode, a1, a2, a3, _, hint = unpack('<d<d<d<d<d<d<d<d<d', ARGV[6 + i])
  if peek then
    mode = 1
  end
  return step(v, rate, burst * M, n * M, mode, a1 * M, a2 * M, a3 * M, hint)
end

local function read(key)
  local v = vals[key]
  if v == nil then
    v = redis.pcall('GET', key)
    if type(v) == 'table' then
      v = '' -- WRONGTYPE: step answers it is not a bucket
    end
    vals[key] = v
  end
  return v
end

local function group(i)
  return unpack('<d', sub(ARGV[6 + i], 57, 64))
end

-- apply decides decision i on Redis, writes, and answers it.
local function apply(i)
  local key = KEYS[i]
  local allowed, tokens, taken, nv, ttl, check = run(i, read(key))
  if nv then
    redis.call('SET', key, nv, 'PX', ttl)
    vals[key] = nv
  elseif check then
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
  out[3 * i - 2], out[3 * i - 1], out[3 * i] = allowed, tokens, taken
end

local decided = {}
for i = 1, count do
  if not decided[i] then
    local grp = group(i)
    if grp == 0 then
      apply(i)
    else
      -- All or nothing: try the group on the values it would write, then
      -- apply it, or answer each member as its bucket is.
      local members, trial, fits, ok = {}, {}, {}, true
      for j = i, count do
        if group(j) == grp then
          members[#members + 1] = j
          decided[j] = true
        end
      end
      for _, j in ipairs(members) do
        local key = KEYS[j]
        local v = trial[key]
        if v == nil then
          v = read(key)
        end
        local allowed, _, _, nv = run(j, v)
        fits[j] = allowed
        if allowed ~= 1 then
          ok = false
        end
        if nv then
          trial[key] = nv
        elseif trial[key] == nil then
          trial[key] = v
        end
      end
      for _, j in ipairs(members) do
        if ok then
          apply(j)
        else
          -- Each as it fitted in the trial (2: it did; the group did not),
          -- with its bucket as it is.
          local allowed, tokens = run(j, read(KEYS[j]), true)
          if allowed >= 0 then
            allowed = fits[j]
            if allowed == 1 then
              allowed = 2
            end
          end
          out[3 * j - 2], out[3 * j - 1], out[3 * j] = allowed, tokens, 0
        end
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
const argsPerOp = 1

// opArgLen is the length of a decision's argument: nine doubles.
const opArgLen = 9 * 8

// appendArgs appends op's script argument: rate, burst, n, mode, the
// mode's three, the group and the hint, as little-endian doubles (see
// bucketLua), which the script reads with one unpack.
func (o *op) appendArgs(args []any) []any {
	a1, a3 := o.a1, o.a3
	switch o.mode {
	case modeSettle:
		a1, a3 = o.lim.DebtLimit(), 0
	case modeLease:
	default:
		a3 = 0
	}
	hint := -1
	if o.hinted && (o.mode == modeTake || o.mode == modeLease) {
		hint = o.hint
	}
	b := make([]byte, opArgLen)
	for i, v := range [9]float64{o.lim.Rate, float64(o.lim.Burst), float64(o.n), float64(o.mode),
		float64(a1), float64(o.a2), float64(a3), float64(o.grp), float64(hint)} {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return append(args, b)
}

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
	return append(args, now, maxTTLArg, slack, s.inst.raw, s.leaseArg, lingerArg)
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
