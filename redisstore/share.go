package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-go/floodgate/remote"
)

// shareLua records one member's round on a shared rate and returns what the
// other live members hold and published.
//
// KEYS[1] is a hash, one field a member. ARGV[1] is the time in ms, or -1
// to read the server's TIME; ARGV[2] the member; ARGV[3] the limit; ARGV[4]
// what the member wants; ARGV[5] its hold in ms (0: give the grant back);
// ARGV[6] its publication (opaque bytes); ARGV[7] 1 if it is draining,
// else 0; ARGV[8] the rate it claims. A field is three little-endian
// doubles, the expiry in ms, the grant and the draining flag, then the
// publication.
//
// The script drops members whose expiry has passed, takes the claim from
// the grants of draining members (in the hash's order), then grants
// min(want, limit − Σ the others' grants), at least 0, so the sum of live
// grants never exceeds the limit of the latest round; a lower limit is
// reached as the other members come round. The hash expires with its
// latest member. It returns the grant and the rate claimed as two
// little-endian doubles, then the others' fields.
const shareLua = `
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local member, limit, want, hold = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local draining, claim, claimed = tonumber(ARGV[7]), tonumber(ARGV[8]), 0
local all = redis.call('HGETALL', KEYS[1])
local out, others, last = {''}, 0, 0
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if f ~= member then
    local exp, g, dr = struct.unpack('<ddd', v)
    if exp <= now then
      redis.call('HDEL', KEYS[1], f)
    else
      if dr == 1 and claimed < claim and g > 0 then
        local t = math.min(claim - claimed, g)
        claimed, g = claimed + t, g - t
        v = struct.pack('<ddd', exp, g, dr) .. string.sub(v, 25)
        redis.call('HSET', KEYS[1], f, v)
      end
      others = others + g
      out[#out + 1] = v
      if exp > last then last = exp end
    end
  end
end
local g = 0
if hold > 0 then
  g = math.max(0, math.min(want, limit - others))
  redis.call('HSET', KEYS[1], member, struct.pack('<ddd', now + hold, g, draining) .. ARGV[6])
  if now + hold > last then last = now + hold end
else
  redis.call('HDEL', KEYS[1], member)
end
if last > now then
  redis.call('PEXPIRE', KEYS[1], math.ceil(last - now))
end
out[1] = struct.pack('<dd', g, claimed)
return out
`

var shareScript = redis.NewScript(shareLua)

// Share takes one member's round in a rate divided among members through
// Redis (several rls.QuotaServer replicas, each dividing its grant among
// its own subscribers): it records req's grant under key, a hash of its
// own (<prefix>:{<escaped key>}:<name>, one Cluster slot), and returns the
// grant with what the other live members hold and published.
//
// The grant is min(req.Want, req.Limit − Σ the other live grants), at
// least 0: the live grants of a key never sum above the limit, whoever
// calls and whenever, so a member that wants more gets it as the others
// come round and give theirs back. A grant lives req.Hold on Redis's clock
// (the client clock's, with [WithClientClock]) and is renewed by the
// member's next round; a member that stops (a crash) loses it then, and
// req.Hold = 0 gives it back at once. A grant is the caller's only until
// req.Hold after it sent the round: one that goes on using it past that
// without a round Redis answered (rls's QuotaServer does, while Redis is
// unreachable) may see other members divide it again. A caller should hold
// a grant long enough to cover whatever it handed out of it.
//
// A member that leaves while what it handed out is still in force marks
// its last round req.Draining: its grant stays held, and the other
// members take it over, a req.Claim at a time, as its subscribers come to
// them (or it lapses with its hold).
//
// Share asks Redis only: no cache, lease, breaker or fallback, and no
// deadline but ctx's. A bad request (an empty key or member, a negative or
// non-finite rate, more than [remote.MaxShareDemands] demands) is an error naming
// the field, and Redis failing to answer one wrapping [ErrUnavailable].
func (s *Store) Share(ctx context.Context, key string, req remote.ShareRequest) (remote.ShareReply, error) {
	if err := checkShare(key, req); err != nil {
		return remote.ShareReply{}, err
	}
	pub := make([]byte, 8*(1+len(req.Demands)))
	binary.LittleEndian.PutUint64(pub, math.Float64bits(req.Held))
	for i, d := range req.Demands {
		binary.LittleEndian.PutUint64(pub[8*(i+1):], math.Float64bits(d))
	}
	now := int64(-1)
	if s.opts.clock != nil {
		now = s.opts.clock.Now().UnixMilli()
	}
	hold := req.Hold.Milliseconds()
	if req.Hold > 0 && hold == 0 {
		hold = 1
	}
	draining := 0
	if req.Draining {
		draining = 1
	}
	v, err := shareScript.Run(ctx, s.client, []string{s.Key(key)},
		now, req.Member, fmtRate(req.Limit), fmtRate(req.Want), hold, pub, draining, fmtRate(req.Claim)).Slice()
	if err != nil {
		return remote.ShareReply{}, &unavailableError{err}
	}
	return parseShare(v)
}

func fmtRate(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

var errShareReply = errors.New("redisstore: Share: malformed reply")

// parseShare decodes shareLua's reply.
func parseShare(v []any) (remote.ShareReply, error) {
	if len(v) == 0 {
		return remote.ShareReply{}, errShareReply
	}
	g, ok := v[0].(string)
	if !ok || len(g) != 16 {
		return remote.ShareReply{}, errShareReply
	}
	r := remote.ShareReply{Granted: float(g), Claimed: float(g[8:])}
	for _, x := range v[1:] {
		f, ok := x.(string)
		// expiry, grant, draining, held, then whole demands
		const head = 32
		if !ok || len(f) < head || len(f)%8 != 0 {
			return remote.ShareReply{}, errShareReply
		}
		m := remote.ShareMember{Granted: float(f[8:]), Draining: float(f[16:]) == 1, Held: float(f[24:]),
			Demands: make([]float64, (len(f)-head)/8)}
		for i := range m.Demands {
			m.Demands[i] = float(f[head+8*i:])
		}
		r.Others = append(r.Others, m)
	}
	return r, nil
}

func float(b string) float64 {
	return math.Float64frombits(binary.LittleEndian.Uint64([]byte(b[:8])))
}

func checkShare(key string, req remote.ShareRequest) error {
	if err := checkKey(key); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("redisstore: Share(%q): "+format, append([]any{key}, args...)...)
	}
	rate := func(x float64) bool { return x >= 0 && !math.IsInf(x, 1) } // false for NaN
	switch {
	case key == "":
		return bad("empty key")
	case req.Member == "":
		return bad("empty Member")
	case !rate(req.Limit):
		return bad("Limit %v: not a finite rate ≥ 0", req.Limit)
	case !rate(req.Want):
		return bad("Want %v: not a finite rate ≥ 0", req.Want)
	case !rate(req.Held):
		return bad("Held %v: not a finite rate ≥ 0", req.Held)
	case !rate(req.Claim):
		return bad("Claim %v: not a finite rate ≥ 0", req.Claim)
	case req.Hold < 0:
		return bad("Hold %v: negative", req.Hold)
	case len(req.Demands) > remote.MaxShareDemands:
		return bad("%d Demands: over %d", len(req.Demands), remote.MaxShareDemands)
	}
	for i, d := range req.Demands {
		if !rate(d) {
			return bad("Demands[%d] %v: not a finite rate ≥ 0", i, d)
		}
	}
	return nil
}
