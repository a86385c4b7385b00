package redisstore

import (
	"context"
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
// KEYS[i] is the i-th bucket. ARGV[1] is the time in µs, or -1 to read the
// server's TIME; ARGV[2] the longest TTL in ms; ARGV[3] the ms added to
// every TTL (see clockSlack). Then four arguments per decision: rate (tokens
// per second, which is also micro-tokens per µs), burst (tokens), n (tokens)
// and mode. Modes: 0 takes n (n = 0 is allowed unless the bucket owes
// tokens, and writes nothing), 1 peeks, 2 refunds n, "3:<min>" leases:
// takes as many whole tokens as the bucket holds, at most n and at least
// min; "4:<debt>" settles: n < 0 refunds −n, never above the burst, and
// n > 0 charges n whatever the bucket holds, in whole tokens, down to debt
// tokens below zero at most.
//
// State is 16 bytes: micro-tokens and the µs they were counted at, two
// little-endian doubles (struct.pack '<d<d', much cheaper than formatting
// text). Both are integers of magnitude below 2^53, which doubles hold
// exactly (burst and debt ≤ 2^33 tokens = 8.6e15 micro-tokens); tokens are
// negative while the bucket owes, after a settle. A
// missing bucket is full. Refill rounds down. Time never moves backwards:
// a bucket counted at a later time than now keeps its time. Only takes,
// leases, refunds and settles write, always with a TTL: the time until the bucket is
// full again plus ARGV[3], at least 1 ms and at most ARGV[2] ms. Once a
// bucket is full, a missing key means the same thing, so the TTL may run
// late but must not run early: a decision that writes nothing on a bucket
// not yet full (a refused take, a peek) lengthens the TTL when the limit in
// force would take longer to fill it (a TTL at ARGV[2], only once a
// sixteenth of it has passed).
//
// The reply has three integers per decision: allowed (0 or 1), the bucket's
// micro-tokens after the decision, and the whole tokens taken (by a settle:
// charged). A key that
// holds something other than a bucket answers -1, 0, 0 and is left alone;
// the script's other decisions are made as usual.
const bucketLua = `
local now = tonumber(ARGV[1])
local maxttl = tonumber(ARGV[2])
local slack = tonumber(ARGV[3])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local out = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 4
  local rate = tonumber(ARGV[a + 1])
  local burst = tonumber(ARGV[a + 2]) * 1000000
  local n = tonumber(ARGV[a + 3]) * 1000000
  local mode = ARGV[a + 4]
  local arg = 0
  if #mode > 1 then -- a lease, "3:<min>", or a settle, "4:<debt>"
    arg = tonumber(string.sub(mode, 3)) * 1000000
    mode = string.sub(mode, 1, 1)
  end
  local key = KEYS[i]
  local v = redis.pcall('GET', key)
  if type(v) == 'table' or (v and #v ~= 16) then
    -- Not a bucket (WRONGTYPE, or another value): this decision fails,
    -- the batch's others go on, and nothing is written.
    out[#out + 1] = -1
    out[#out + 1] = 0
    out[#out + 1] = 0
  else
    local tokens, at = burst, now
    local exists = false
    if v then
      exists = true
      tokens, at = struct.unpack('<d<d', v)
      if now > at then
        if tokens < burst and rate > 0 then
          local add = (now - at) * rate
          if add >= burst - tokens then
            tokens = burst
          else
            tokens = tokens + math.floor(add)
          end
        end
        at = now
      end
      if tokens > burst then
        tokens = burst
      end
    end
    local allowed, taken, write = 0, 0, false
    if mode == '0' then
      if n <= burst and tokens >= n then
        tokens = tokens - n
        allowed, taken, write = 1, n, n > 0
      end
    elseif mode == '1' then
      allowed = 1
    elseif mode == '2' then
      allowed = 1
      if exists and n > 0 then
        tokens = tokens + n
        if tokens >= burst then
          tokens = burst
          redis.call('DEL', key)
        else
          write = true
        end
      end
    elseif mode == '3' then
      local give = math.floor(tokens / 1000000) * 1000000
      if give > n then
        give = n
      end
      if give >= arg and give > 0 then
        tokens = tokens - give
        allowed, taken, write = 1, give, true
      end
    else
      allowed = 1
      if n < 0 then
        if exists then
          tokens = tokens - n
          if tokens >= burst then
            tokens = burst
            redis.call('DEL', key)
          else
            write = true
          end
        end
      elseif n > 0 then
        -- The whole tokens the bucket gives before it owes arg. fmod is
        -- exact, where a floor of a quotient may round up near 2^33
        -- tokens; each operand is whole tokens, so the sum is exact too.
        local room = 0
        if tokens >= 0 then
          room = tokens - math.fmod(tokens, 1000000) + arg
        elseif tokens + arg > 0 then
          room = tokens + arg - math.fmod(tokens + arg, 1000000)
        end
        if room > n then
          room = n
        end
        if room > 0 then
          tokens = tokens - room
          taken, write = room, true
        end
      end
    end
    if write or (exists and tokens < burst) then
      local ttl = maxttl
      if rate > 0 then
        ttl = math.ceil((burst - tokens) / rate / 1000) + slack
        if ttl < 1 then
          ttl = 1
        elseif ttl > maxttl then
          ttl = maxttl
        end
      end
      if write then
        redis.call('SET', key, struct.pack('<d<d', tokens, at), 'PX', ttl)
      else
        -- The limit changed since the last write (a lower rate, a
        -- higher burst): the key must not expire before the bucket
        -- is full under the limit in force. A TTL at the cap is
        -- renewed only once a sixteenth of it has passed: every
        -- refusal of a rate-0 bucket would write otherwise.
        local want = ttl
        if ttl == maxttl then
          want = ttl - ttl / 16
        end
        if redis.call('PTTL', key) < want then
          redis.call('PEXPIRE', key, ttl)
        end
      end
    end
    out[#out + 1] = allowed
    out[#out + 1] = tokens
    out[#out + 1] = taken / 1000000
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

// clockSlack is added to TTLs in client-clock mode. Keys expire on Redis's
// clock, but buckets refill on the clients': a client clock δ behind Redis's
// would see a key vanish δ before its bucket is full, and a fresh full
// bucket would over-admit. The slack absorbs skews up to 1 s; lingering
// full buckets cost only memory.
const clockSlack = time.Second

var slackArgs = [2]string{"0", strconv.FormatInt(clockSlack.Milliseconds(), 10)}

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
	min  int // leases only
}

// reply is the script's answer for one op.
type reply struct {
	allowed bool
	tokens  int64 // micro-tokens after the decision
	taken   int64 // whole tokens taken
}

// errNotBucket is the error of a decision on a key that holds something
// other than a bucket. Redis answered: the key, not Redis, is at fault.
var errNotBucket = errors.New("redisstore: key holds a value that is not a bucket")

// appendArgs appends op's four script arguments. The limit's two come
// preformatted from a one-entry cache: most stores apply few limits, and
// boxing and formatting them was a visible share of a batched decision.
func (o *op) appendArgs(args []any) []any {
	la := lastLimit.Load()
	if la == nil || la.lim != o.lim {
		la = &limitArgs{
			lim:    o.lim,
			rate:   strconv.FormatFloat(o.lim.Rate, 'f', -1, 64),
			burst:  strconv.Itoa(o.lim.Burst),
			settle: "4:" + strconv.Itoa(o.lim.DebtLimit()),
		}
		lastLimit.Store(la)
	}
	var mode any = o.mode
	switch o.mode {
	case modeLease:
		mode = "3:" + strconv.Itoa(o.min)
	case modeSettle:
		mode = la.settle
	}
	return append(args, la.rate, la.burst, o.n, mode)
}

type limitArgs struct {
	lim                 floodgate.Limit
	rate, burst, settle any
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
func evalOps(ctx context.Context, c redis.Scripter, now int64, ops []*op) ([]int64, error) {
	keys := make([]string, len(ops))
	args := make([]any, 0, 3+4*len(ops))
	args = appendHead(args, now)
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

// appendHead appends the script's first arguments: the time, the longest
// TTL, and the TTL slack (none on the server's clock).
func appendHead(args []any, now int64) []any {
	slack := slackArgs[0]
	if now >= 0 {
		slack = slackArgs[1]
	}
	return append(args, now, maxTTLArg, slack)
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
	return reply{allowed: v[0] == 1, tokens: v[1], taken: v[2]}, nil
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
				need = int64(o.min) * 1e9
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
