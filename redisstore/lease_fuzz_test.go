package redisstore_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// FuzzLeases drives stores that share buckets on a real redis-server with
// sequences of takes, reservations, settles, ReserveAll requests, refunds,
// peeks, limit changes, clock steps, and stores closed or crashed (dropped
// without Close, their leases left on Redis) and replaced. The client clock
// is a fake one: time moves only when the input says so.
//
// Input: a 5-byte header, then up to lfMaxOps ops of 4 bytes (see lfRun.do).
// Header byte 0: bit 0 selects the mode, bit 1 two keys instead of one;
// byte 1: 2 + b%3 stores (lease mode); byte 2: the lease time,
// 50 ms × (1 + b%40); byte 3: per store slot i, bit 2i batching and bit
// 2i+1 the deny cache; byte 4: the two limits, leaseLimits[b&15] and
// leaseLimits[b>>4].
//
// In lease mode, 2–4 stores with leases share one prefix, and after each op
// the test checks:
//
//  1. The bound of docs/stores.md, per key: for every two instants
//     t_i ≤ t_j at which tokens were admitted, the tokens admitted in
//     [t_i, t_j] are at most B + R·(t_j − t_i), plus D when a settle
//     charged tokens in the window, where B, R and D are the largest burst,
//     rate and debt limit of any limit used so far. Admitted counts, at the
//     instant of the op: each allowed take's and reservation's n (whether
//     from Redis or a lease), each settle's charge beyond the estimate (what
//     was charged, less what a DebtLimitError says was not), and, negative,
//     each Refund's n and each settle's refund. See lfLedger for why this
//     is sound.
//  2. Every Result reports 0 ≤ Remaining ≤ its limit's burst, Owed ≥ 0,
//     not both, and a Source that is Redis, a lease, or (refusals only) the
//     deny cache: no failure policy ever decides here.
//  3. A refused take, reservation or ReserveAll took nothing: a store
//     without leases peeks at each bucket just before and just after (at the
//     same instant), and the bucket holds at least as many whole tokens
//     after. A refused reservation and every reservation of a refused
//     ReserveAll hold no tokens.
//
// In exact mode one store without leases decides, and every decision must
// equal lfBucket's, a reference of the script in integer micro-tokens,
// exactly (allowed, Remaining, Owed; a settle's uncharged tokens; the
// request ReserveAll refused), as keyed's FuzzTake does for the Map. Two
// licences, both the deny cache's: its refusal reports an upper bound of
// the bucket, so its Remaining may be higher than the reference's; and it
// does not see a write under a faster rate (see blindSpot). Invariants 1
// and 2 are checked in this mode too.
func FuzzLeases(f *testing.F) {
	for _, s := range lfSeeds {
		f.Add(s.bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 5 {
			return
		}
		srv := sharedServer(t)
		r := newLFRun(t, srv.Addr, data[:5])
		for ops := data[5:]; len(ops) >= 4 && r.ops < lfMaxOps; ops = ops[4:] {
			r.do([4]byte(ops[:4]))
		}
	})
}

// lfMaxOps bounds a sequence: each op costs a round trip or three.
const lfMaxOps = 60

// leaseLimits are the limits FuzzLeases switches between: whole rates, so
// that the script's refill (micro-tokens per µs) is exact and the reference
// needs no rounding; bursts of at least 8, so that a lease (at most an
// eighth of the burst) holds a token or more; several whose lease is more
// than a second's refill, which the client clock's 1 s of lease slack does
// not cover; the default debt, NoDebt and small explicit debts; and a rate
// of 0.
var leaseLimits = [16]floodgate.Limit{
	{Rate: 5, Burst: 80},
	{Rate: 10, Burst: 20},
	{Rate: 100, Burst: 40},
	{Rate: 1, Burst: 8},
	{Rate: 50, Burst: 16, Debt: floodgate.NoDebt},
	{Rate: 1000, Burst: 64, Debt: 10},
	{Rate: 0, Burst: 24},
	{Rate: 20, Burst: 100, Debt: 3},
	{Rate: 2, Burst: 64},
	{Rate: 3, Burst: 120, Debt: 7},
	{Rate: 4, Burst: 48},
	{Rate: 200, Burst: 24},
	{Rate: 1, Burst: 200, Debt: floodgate.NoDebt},
	{Rate: 25, Burst: 160},
	{Rate: 7, Burst: 32},
	{Rate: 500, Burst: 100, Debt: 1},
}

// Op kinds, an op's first byte modulo 16. Takes, reservations, settles and
// clock steps get several values each, so that random bytes mostly decide.
const (
	lfTakeOp       = 0 // 0–2
	lfReserveOp    = 3 // 3–4
	lfSettleOp     = 5 // 5–6
	lfReserveAllOp = 7
	lfAdvanceOp    = 8 // 8–10
	lfCloseOp      = 11
	lfCrashOp      = 12
	lfReloadOp     = 13
	lfRefundOp     = 14
	lfPeekOp       = 15
)

const lfMicro = 1_000_000

type lfRun struct {
	t        *testing.T
	client   *redis.Client // the stores' decisions do not depend on whose client
	exact    bool
	keys     int
	slots    int
	lease    time.Duration
	opts     byte
	pfx      string
	clock    *fakeClock
	start    time.Time
	stores   []*redisstore.Store
	observer *redisstore.Store // no leases, no cache: peeks for invariant 3
	lims     [2]floodgate.Limit
	cur      int // the limit in force: lims[cur]
	held     []lfHeld
	ledger   map[string]*lfLedger
	ref      map[string]*lfBucket // exact mode
	denied   map[string]*lfDenial // exact mode
	// The largest burst, rate and debt limit used so far.
	maxBurst, maxRate, maxDebt int64
	ops                        int
	log                        []string
}

// lfHeld is a reservation that was allowed and is not settled yet.
type lfHeld struct {
	rv   *floodgate.Reservation
	s    *redisstore.Store
	key  string
	lim  floodgate.Limit
	n    int
	what string
}

func newLFRun(t *testing.T, addr string, h []byte) *lfRun {
	r := &lfRun{
		t:      t,
		client: newClient(t, addr),
		exact:  h[0]&1 == 0,
		keys:   1 + int(h[0]>>1&1),
		slots:  1,
		lease:  50 * time.Millisecond * time.Duration(1+h[2]%40),
		opts:   h[3],
		pfx:    prefix(t),
		clock:  newFakeClock(),
		lims:   [2]floodgate.Limit{leaseLimits[h[4]&15], leaseLimits[h[4]>>4]},
		ledger: map[string]*lfLedger{},
		ref:    map[string]*lfBucket{},
		denied: map[string]*lfDenial{},
	}
	r.start = r.clock.Now()
	if !r.exact {
		r.slots = 2 + int(h[1]%3)
	}
	for i := range r.slots {
		r.stores = append(r.stores, r.newStore(i))
	}
	if !r.exact {
		r.observer = r.newStoreOpts(nil)
	}
	mode := "lease mode"
	if r.exact {
		mode = "exact mode"
	}
	r.logf("%s, %d store(s), %d key(s), lease %v, options %08b, limits %v | %v",
		mode, r.slots, r.keys, r.lease, r.opts, r.lims[0], r.lims[1])
	return r
}

// newStore returns a store for slot i, with the slot's options.
func (r *lfRun) newStore(i int) *redisstore.Store {
	var opts []redisstore.Option
	if !r.exact {
		opts = append(opts, redisstore.WithLeases(r.lease, 8))
	}
	if r.opts>>(2*i)&1 != 0 {
		opts = append(opts, redisstore.WithBatching(8))
	}
	if r.opts>>(2*i+1)&1 != 0 {
		opts = append(opts, redisstore.WithDenyCache(16))
	}
	return r.newStoreOpts(opts)
}

func (r *lfRun) newStoreOpts(opts []redisstore.Option) *redisstore.Store {
	// The deadline is long so that no failure policy ever decides
	// (invariant 2).
	opts = append([]redisstore.Option{redisstore.WithPrefix(r.pfx), redisstore.WithDeadline(5 * time.Second),
		redisstore.WithClientClock(r.clock)}, opts...)
	s, err := redisstore.New(r.client, opts...)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// now returns the fake clock's µs since the run's start.
func (r *lfRun) now() int64 { return r.clock.Now().Sub(r.start).Microseconds() }

func (r *lfRun) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf("t=%.6fs ", float64(r.now())/lfMicro)+fmt.Sprintf(format, args...))
}

// fatalf fails the run with the sequence so far.
func (r *lfRun) fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s\nsequence:\n  %s", fmt.Sprintf(format, args...), strings.Join(r.log, "\n  "))
}

// use records that lim was used: the bound grows with the largest limit.
func (r *lfRun) use(lim floodgate.Limit) {
	r.maxBurst = max(r.maxBurst, int64(lim.Burst))
	r.maxRate = max(r.maxRate, int64(lim.Rate))
	r.maxDebt = max(r.maxDebt, int64(lim.DebtLimit()))
}

// do decodes and applies one op: kind, x, y, z. x names the store (low
// nibble, modulo the stores) and the key (bit 4); y is a count (lfCount);
// z bit 7 has the op use the limit not in force (a store that has not
// reloaded yet).
func (r *lfRun) do(b [4]byte) {
	r.ops++
	x, y, z := b[1], b[2], b[3]
	slot := int(x&0x0f) % r.slots
	key := fmt.Sprintf("k%d", int(x>>4&1)%r.keys)
	lim := r.lims[r.cur]
	if z&0x80 != 0 {
		lim = r.lims[r.cur^1]
	}
	switch k := b[0] % 16; {
	case k < lfReserveOp:
		r.take(slot, key, lim, lfCount(y, lim.Burst), false)
	case k < lfSettleOp:
		r.take(slot, key, lim, lfCount(y, lim.Burst), true)
	case k < lfReserveAllOp:
		if len(r.held) == 0 {
			r.logf("(settle: nothing held)")
			return
		}
		i := int(x) % len(r.held)
		actual := int(y)
		if z&1 == 0 {
			actual %= 2*r.held[i].n + 3
		}
		r.settle(i, actual)
	case k == lfReserveAllOp:
		takes := make([]floodgate.Take, 1+int(x>>2)%3)
		for j := range takes {
			takes[j] = floodgate.Take{Key: fmt.Sprintf("k%d", int(y>>j&1)%r.keys), Limit: lim, N: int(z >> (2 * j) & 3)}
		}
		r.reserveAll(int(x&3)%r.slots, takes)
	case k < lfCloseOp:
		d := time.Duration(1+int(y)) * time.Microsecond
		for range x % 6 {
			d *= 10
		}
		r.clock.Advance(d)
		r.logf("advanced %v", d)
	case k == lfCloseOp:
		r.stores[slot].Close()
		r.stores[slot] = r.newStore(slot)
		clear(r.denied)
		r.logf("s%d: Close, replaced", slot)
	case k == lfCrashOp:
		// Its reservations die with it: their estimates stay charged.
		old := r.stores[slot]
		r.held = dropHeld(r.held, old)
		r.stores[slot] = r.newStore(slot)
		clear(r.denied)
		r.logf("s%d: crashed (dropped without Close), replaced", slot)
	case k == lfReloadOp:
		r.cur ^= 1
		r.logf("reload: the limit is now %v", r.lims[r.cur])
	case k == lfRefundOp:
		r.refund(slot, key, lim, int(y%8))
	case k == lfPeekOp:
		r.peek(slot, key, lim)
	}
}

// lfCount decodes a count: 0–3 mostly; when y's top bit is set, any count
// up to burst + 1 (one more than a take may ask), or for y ≥ 0xf0 lfDrain.
func lfCount(y byte, burst int) int {
	switch {
	case y&0x80 == 0:
		return int(y & 3)
	case y >= 0xf0:
		return lfDrain
	}
	return int(y&0x7f) % (burst + 2)
}

// lfDrain asks for every token the bucket holds, as a greedy client would:
// a bucket that holds more than it should then shows in what is admitted,
// where a random count would rarely fit the surplus.
const lfDrain = -1

func dropHeld(held []lfHeld, s *redisstore.Store) []lfHeld {
	out := held[:0]
	for _, h := range held {
		if h.s != s {
			out = append(out, h)
		}
	}
	return out
}

func (r *lfRun) take(slot int, key string, lim floodgate.Limit, n int, reserve bool) {
	r.use(lim)
	s := r.stores[slot]
	before := r.levels(lim, key)
	if n == lfDrain {
		level := before[key]
		if r.exact {
			level = int(r.bucket(key).view(lim, r.now()) / lfMicro)
		}
		n = min(max(level, 1), lim.Burst)
	}
	var res floodgate.Result
	var rv floodgate.Reservation
	var err error
	what := fmt.Sprintf("s%d: TakeN(%s, %v, %d)", slot, key, lim, n)
	if reserve {
		what = fmt.Sprintf("s%d: ReserveN(%s, %v, %d)", slot, key, lim, n)
		rv, err = s.ReserveN(bg, key, lim, n)
		res = rv.Result
	} else {
		res, err = s.TakeN(bg, key, lim, n)
	}
	r.logf("%s = %s, %v", what, lfShow(res), err)
	if n > lim.Burst {
		if !errors.Is(err, floodgate.ErrExceedsBurst) || res.Allowed {
			r.fatalf("%s = %+v, %v; want refused with ErrExceedsBurst", what, res, err)
		}
	} else if err != nil {
		r.fatalf("%s: %v", what, err)
	}
	r.checkResult(what, lim, res)
	if r.exact {
		saved := *r.bucket(key)
		allowed, tokens := r.refTake(key, lim, n, reserve)
		if r.compare(what, key, res, allowed, tokens) {
			*r.bucket(key) = saved // the store took nothing
		}
		switch {
		case res.Allowed && n > 0:
			r.wrote(key, lim)
		case !res.Allowed && n > 0 && n <= lim.Burst && res.Source == floodgate.SourceRedis:
			r.denied[key] = &lfDenial{lim: lim}
		}
	}
	if !res.Allowed {
		if rv.Tokens() != 0 {
			r.fatalf("%s refused, yet holds %d tokens", what, rv.Tokens())
		}
		r.tookNothing(what, lim, before)
		return
	}
	r.admit(key, int64(n), false)
	if reserve {
		r.held = append(r.held, lfHeld{rv: &rv, s: s, key: key, lim: lim, n: n, what: what})
	}
}

func (r *lfRun) reserveAll(slot int, takes []floodgate.Take) {
	lim := takes[0].Limit
	r.use(lim)
	s := r.stores[slot]
	var keys []string
	for _, tk := range takes {
		if !slices.Contains(keys, tk.Key) {
			keys = append(keys, tk.Key)
		}
	}
	before := r.levels(lim, keys...)
	rs := make([]floodgate.Reservation, len(takes))
	refused, err := s.ReserveAll(bg, takes, rs)
	what := fmt.Sprintf("s%d: ReserveAll(%v)", slot, takes)
	var shown []string
	for i := range rs {
		shown = append(shown, lfShow(rs[i].Result))
	}
	r.logf("%s = %d, %v: %s", what, refused, err, strings.Join(shown, "; "))
	if err != nil {
		r.fatalf("%s: %v", what, err)
	}
	cached := false
	for i := range rs {
		r.checkResult(fmt.Sprintf("%s[%d]", what, i), lim, rs[i].Result)
		cached = cached || rs[i].Result.Source == floodgate.SourceCache
	}
	if r.exact {
		saved := map[string]lfBucket{}
		for _, k := range keys {
			saved[k] = *r.bucket(k)
		}
		wantRefused, fits, tokens := r.refAll(takes)
		switch {
		case refused >= 0 && wantRefused < 0 && rs[refused].Result.Source == floodgate.SourceCache &&
			r.blindSpot(takes[refused].Key, lim):
			r.logf("(a cached refusal the reference would admit: the key was decided under a faster rate since)")
			for k, b := range saved {
				*r.bucket(k) = b // the store took nothing
			}
		case (refused < 0) != (wantRefused < 0):
			r.fatalf("%s refused %d, want %d (-1: all reserved)", what, refused, wantRefused)
		case refused < 0 || !cached:
			// A cached refusal peeks at the other buckets, each alone;
			// otherwise every take is answered as the script's group.
			if refused != wantRefused {
				r.fatalf("%s refused %d, want %d", what, refused, wantRefused)
			}
			for i := range rs {
				r.compare(fmt.Sprintf("%s[%d]", what, i), takes[i].Key, rs[i].Result, fits[i], tokens[i])
			}
		}
		for i, tk := range takes {
			switch {
			case refused < 0 && tk.N > 0:
				r.wrote(tk.Key, lim)
			case refused >= 0 && !cached && !fits[i] && tk.N > 0:
				r.denied[tk.Key] = &lfDenial{lim: lim}
			}
		}
	}
	if refused >= 0 {
		for i := range rs {
			if rs[i].Tokens() != 0 {
				r.fatalf("%s refused %d, yet take %d holds %d tokens", what, refused, i, rs[i].Tokens())
			}
		}
		r.tookNothing(what, lim, before)
		return
	}
	for i, tk := range takes {
		if !rs[i].Result.Allowed {
			r.fatalf("%s reserved all, but take %d is not allowed: %+v", what, i, rs[i].Result)
		}
		r.admit(tk.Key, int64(tk.N), false)
		rv := rs[i]
		r.held = append(r.held, lfHeld{rv: &rv, s: s, key: tk.Key, lim: lim, n: tk.N, what: fmt.Sprintf("%s[%d]", what, i)})
	}
}

func (r *lfRun) settle(i, actual int) {
	h := r.held[i]
	r.held = append(r.held[:i], r.held[i+1:]...)
	r.use(h.lim)
	res, err := h.rv.Settle(bg, actual)
	what := fmt.Sprintf("Settle(%d) of %s", actual, h.what)
	r.logf("%s = %s, %v", what, lfShow(res), err)
	uncharged := 0
	var dle *floodgate.DebtLimitError
	switch {
	case errors.As(err, &dle):
		uncharged = dle.Uncharged
	case err != nil:
		r.fatalf("%s: %v", what, err)
	}
	delta := actual - h.n
	if delta != 0 {
		r.checkResult(what, h.lim, res)
	}
	if r.exact && delta != 0 {
		tokens, charged := r.refSettle(h.key, h.lim, delta)
		r.compare(what, h.key, res, true, tokens)
		r.wrote(h.key, h.lim)
		if delta > 0 && int64(uncharged) != int64(delta)-charged {
			r.fatalf("%s left %d uncharged, want %d", what, uncharged, int64(delta)-charged)
		}
	}
	switch {
	case delta > 0 && delta > uncharged:
		r.admit(h.key, int64(delta-uncharged), true)
	case delta < 0:
		r.admit(h.key, int64(delta), false)
	}
}

func (r *lfRun) refund(slot int, key string, lim floodgate.Limit, n int) {
	r.use(lim)
	err := r.stores[slot].Refund(bg, key, lim, n)
	r.logf("s%d: Refund(%s, %v, %d) = %v", slot, key, lim, n, err)
	if err != nil {
		r.fatalf("Refund: %v", err)
	}
	n = min(n, lim.Burst) // Refund gives back no more than a burst
	if r.exact {
		r.refRefund(key, lim, n)
		r.wrote(key, lim)
	}
	if n > 0 {
		r.admit(key, -int64(n), false)
	}
}

func (r *lfRun) peek(slot int, key string, lim floodgate.Limit) {
	r.use(lim)
	res, err := r.stores[slot].Peek(bg, key, lim)
	what := fmt.Sprintf("s%d: Peek(%s, %v)", slot, key, lim)
	r.logf("%s = %s, %v", what, lfShow(res), err)
	if err != nil {
		r.fatalf("%s: %v", what, err)
	}
	r.checkResult(what, lim, res)
	if r.exact {
		r.compare(what, key, res, true, r.bucket(key).view(lim, r.now()))
	}
}

func lfShow(res floodgate.Result) string {
	return fmt.Sprintf("{allowed %v, remaining %d, owed %d, %v}", res.Allowed, res.Remaining, res.Owed, res.Source)
}

// checkResult checks invariant 2.
func (r *lfRun) checkResult(what string, lim floodgate.Limit, res floodgate.Result) {
	r.t.Helper()
	switch res.Source {
	case floodgate.SourceRedis, floodgate.SourceLease:
	case floodgate.SourceCache:
		if res.Allowed {
			r.fatalf("%s = %+v: the deny cache allowed", what, res)
		}
	default:
		r.fatalf("%s = %+v: not decided by Redis or a lease", what, res)
	}
	if res.Remaining < 0 || res.Remaining > lim.Burst || res.Owed < 0 || res.Remaining > 0 && res.Owed > 0 {
		r.fatalf("%s = %+v: Remaining outside [0, burst %d], or Owed negative, or both set", what, res, lim.Burst)
	}
}

// levels returns, in lease mode, each key's whole tokens on Redis
// (negative: owed) under lim, as a store without leases peeks at them.
// These peeks are ops like the others (a peek may write: it drops lapsed
// leases), and the invariants must hold with them in the sequence.
func (r *lfRun) levels(lim floodgate.Limit, keys ...string) map[string]int {
	if r.exact {
		return nil
	}
	out := map[string]int{}
	for _, k := range keys {
		res, err := r.observer.Peek(bg, k, lim)
		if err != nil {
			r.fatalf("observer: Peek(%s): %v", k, err)
		}
		out[k] = res.Remaining - res.Owed
	}
	return out
}

// tookNothing checks invariant 3: at the same instant, a refusal leaves
// every bucket at least as full as before it. It may give tokens back (a
// refused lease round trip first closes the store's old lease), never
// take.
func (r *lfRun) tookNothing(what string, lim floodgate.Limit, before map[string]int) {
	r.t.Helper()
	keys := make([]string, 0, len(before))
	for k := range before {
		keys = append(keys, k)
	}
	after := r.levels(lim, keys...)
	for k, b := range before {
		if a := after[k]; a < b {
			r.fatalf("%s was refused, yet bucket %s went from %d to %d whole tokens", what, k, b, a)
		}
	}
}

// lfLedger is one key's admissions, in time order.
//
// Why the bound holds (invariant 1). Let P be the tokens of the bucket, as
// a decision would read it (refilled, capped), plus those of the leases not
// yet spent. Every admission comes out of P: a take needs the tokens in the
// bucket, a lease's spend comes out of tokens the script moved out of it,
// and a charge takes the bucket at most the debt limit below zero; below
// zero only a charge takes, and a take or a lease leaves the bucket at zero
// or above. P grows only by refill, by refunds (counted negative, and
// crediting at most what they ask back), while a closed lease gives back at
// most what it did not spend. At every instant P ≤ B: the bucket refills
// only up to burst − G, G the leases recorded with it; a lease is spent
// only while Redis counts it out (its store stops d after it sent the
// request, Redis d plus 1 s of slack after the script ran, on one fake
// clock); a crashed store's lease is never spent again. Decisions under
// several limits refill at their own rate and cap at their own burst,
// hence the largest of each. So over [t_i, t_j], admitted ≤ B + R·(t_j −
// t_i), + D if a charge in the window may have taken the bucket below zero.
// The bound grows with the window, so windows that start and end at
// admissions are the tightest. The clock moves in whole µs and the rates are
// whole tokens per second, so R·t is exact in micro-tokens: the check
// needs no rounding slack, and has none.
type lfLedger struct {
	at     []int64 // µs
	n      []int64 // tokens admitted, negative for refunds
	charge []bool  // a settle's charge
}

// admit records n tokens admitted on key now, and checks the bound over
// every window that ends now.
func (r *lfRun) admit(key string, n int64, charge bool) {
	r.t.Helper()
	l := r.ledger[key]
	if l == nil {
		l = &lfLedger{}
		r.ledger[key] = l
	}
	now := r.now()
	l.at, l.n, l.charge = append(l.at, now), append(l.n, n), append(l.charge, charge)
	var sum int64
	charged := false
	for i := len(l.at) - 1; i >= 0; i-- {
		sum += l.n[i]
		charged = charged || l.charge[i]
		if i > 0 && l.at[i-1] == l.at[i] {
			continue // a window starts at the first admission of its instant
		}
		bound := r.maxBurst*lfMicro + r.maxRate*(now-l.at[i])
		if charged {
			bound += r.maxDebt * lfMicro
		}
		if sum*lfMicro > bound {
			var in []string
			for j := i; j < len(l.at); j++ {
				in = append(in, fmt.Sprintf("%+d at %.6fs", l.n[j], float64(l.at[j])/lfMicro))
			}
			debt := ""
			if charged {
				debt = fmt.Sprintf(" + debt %d", r.maxDebt)
			}
			r.fatalf("%s: %d tokens admitted in [%.6fs, %.6fs], more than burst %d + rate %d/s × %.6fs%s = %.6f\nadmissions in the window: %s",
				key, sum, float64(l.at[i])/lfMicro, float64(now)/lfMicro, r.maxBurst, r.maxRate, float64(now-l.at[i])/lfMicro,
				debt, float64(bound)/lfMicro, strings.Join(in, ", "))
		}
	}
}

// lfBucket is the reference for exact mode: the script's bucket without
// leases, in integer micro-tokens and µs. It shares no code with the store.
type lfBucket struct {
	exists     bool // the key holds a bucket; a missing one is full
	tokens, at int64
}

func (r *lfRun) bucket(key string) *lfBucket {
	b := r.ref[key]
	if b == nil {
		b = &lfBucket{}
		r.ref[key] = b
	}
	return b
}

// view returns the micro-tokens the script reads at now under lim: refilled
// (whole rates: exact) and capped at the burst, which a decision writes
// only when it changes the bucket.
func (b lfBucket) view(lim floodgate.Limit, now int64) int64 {
	burst := int64(lim.Burst) * lfMicro
	if !b.exists {
		return burst
	}
	tokens := b.tokens
	if now > b.at && tokens < burst {
		tokens = min(tokens+(now-b.at)*int64(lim.Rate), burst)
	}
	return min(tokens, burst)
}

func (b *lfBucket) write(tokens, now int64) {
	b.exists, b.tokens, b.at = true, tokens, max(now, b.at)
}

// takeOn decides a take of n on b as the script does: n = 0 is a peek for
// TakeN, and for a reservation is allowed unless the bucket owes.
func takeOn(b *lfBucket, lim floodgate.Limit, n int, reserve bool, now int64) (bool, int64) {
	tokens := b.view(lim, now)
	switch {
	case n == 0 && !reserve:
		return true, tokens
	case tokens < int64(n)*lfMicro:
		return false, tokens
	}
	if n > 0 {
		tokens -= int64(n) * lfMicro
		b.write(tokens, now)
	}
	return true, tokens
}

func (r *lfRun) refTake(key string, lim floodgate.Limit, n int, reserve bool) (bool, int64) {
	if n > lim.Burst {
		return false, 0 // no call: the Result is empty
	}
	return takeOn(r.bucket(key), lim, n, reserve, r.now())
}

func (r *lfRun) refRefund(key string, lim floodgate.Limit, n int) {
	b := r.bucket(key)
	if n > 0 && b.exists {
		now := r.now()
		b.write(min(b.view(lim, now)+int64(n)*lfMicro, int64(lim.Burst)*lfMicro), now)
	}
}

// refSettle settles delta ≠ 0 and returns the tokens after and the whole
// tokens charged.
func (r *lfRun) refSettle(key string, lim floodgate.Limit, delta int) (tokens, charged int64) {
	b := r.bucket(key)
	now := r.now()
	tokens = b.view(lim, now)
	if delta < 0 {
		if b.exists {
			tokens = min(tokens-int64(delta)*lfMicro, int64(lim.Burst)*lfMicro)
			b.write(tokens, now)
		}
		return tokens, 0
	}
	debt := int64(lim.DebtLimit()) * lfMicro
	var room int64
	switch {
	case tokens >= 0:
		room = tokens - tokens%lfMicro + debt
	case tokens+debt > 0:
		room = tokens + debt - (tokens+debt)%lfMicro
	}
	room = min(room, int64(delta)*lfMicro)
	if room > 0 {
		tokens -= room
		b.write(tokens, now)
	}
	return tokens, max(room, 0) / lfMicro
}

// refAll decides takes as the script's all-or-nothing group: tried in order
// on the buckets as the earlier takes leave them; applied all if each fits,
// else none, each answered with its bucket as it is and whether it fitted.
func (r *lfRun) refAll(takes []floodgate.Take) (refused int, fits []bool, tokens []int64) {
	now := r.now()
	trial := map[string]*lfBucket{}
	refused = -1
	for i, tk := range takes {
		b := trial[tk.Key]
		if b == nil {
			c := *r.bucket(tk.Key)
			b = &c
			trial[tk.Key] = b
		}
		ok, tok := takeOn(b, tk.Limit, tk.N, true, now)
		fits, tokens = append(fits, ok), append(tokens, tok)
		if !ok && refused < 0 {
			refused = i
		}
	}
	if refused < 0 {
		for k, b := range trial {
			*r.bucket(k) = *b
		}
		return refused, fits, tokens
	}
	for i, tk := range takes {
		tokens[i] = r.bucket(tk.Key).view(tk.Limit, now)
	}
	return refused, fits, tokens
}

// compare checks a Result against the reference's decision and
// micro-tokens, and reports whether it tolerated a cached refusal that the
// reference would admit (see blindSpot): the store then took nothing.
func (r *lfRun) compare(what, key string, res floodgate.Result, allowed bool, tokens int64) bool {
	r.t.Helper()
	var rem, owed int
	switch {
	case tokens > 0:
		rem = int(tokens / lfMicro)
	case tokens < 0:
		owed = int((-tokens + lfMicro - 1) / lfMicro)
	}
	blind := res.Source == floodgate.SourceCache && r.blindSpot(key, res.Limit)
	if blind && allowed {
		r.logf("(a cached refusal the reference would admit: the key was decided under a faster rate since)")
		return true
	}
	if res.Allowed != allowed {
		r.fatalf("%s = %+v; the reference says allowed %v (remaining %d, owed %d)", what, res, allowed, rem, owed)
	}
	if res.Source == floodgate.SourceCache {
		// The cache's bound of the bucket, which only refill raises (and,
		// in its blind spot, a faster rate the cache did not see).
		if !blind && res.Remaining-res.Owed < rem-owed {
			r.fatalf("%s = %+v; a cached refusal below the reference's bucket (remaining %d, owed %d)", what, res, rem, owed)
		}
		return false
	}
	if res.Remaining != rem || res.Owed != owed {
		r.fatalf("%s = %+v; the reference says remaining %d, owed %d", what, res, rem, owed)
	}
	return false
}

// lfDenial is what exact mode knows of the deny cache's entry for a key:
// the limit of the refusal Redis made, and whether a write under a faster
// rate has refilled the bucket since.
type lfDenial struct {
	lim    floodgate.Limit
	raised bool
}

// wrote records a decision on key under lim that may have written the
// bucket, refilled at lim's rate.
func (r *lfRun) wrote(key string, lim floodgate.Limit) {
	if d := r.denied[key]; d != nil && lim.Rate > d.lim.Rate {
		d.raised = true
	}
}

// blindSpot reports whether a cached refusal of a take on key under lim may
// refuse what Redis would admit. The deny cache bounds the bucket by its
// tokens at the refusal plus refill at the refusal's rate since, and does
// not see "a raised limit" (cache.go): a write under a faster rate (here,
// this very store's, on a limit change) refills the bucket faster, and the
// entry refuses until its retry-after. That errs toward the limit only.
func (r *lfRun) blindSpot(key string, lim floodgate.Limit) bool {
	d := r.denied[key]
	return d != nil && d.raised && d.lim == lim
}

// lfSeed builds an input for FuzzLeases.
type lfSeed struct {
	leases, twoKeys bool
	stores          int           // with leases, 2–4
	lease           time.Duration // a multiple of 50 ms, up to 2 s
	opts            byte          // per slot i: bit 2i batching, 2i+1 deny cache
	a, b            int           // the limits, indexes in leaseLimits
	ops             [][4]byte
}

func (s lfSeed) bytes() []byte {
	var mode byte
	if s.leases {
		mode |= 1
	}
	if s.twoKeys {
		mode |= 2
	}
	out := []byte{mode, byte(max(s.stores-2, 0)), byte(max(s.lease/(50*time.Millisecond)-1, 0)), s.opts, byte(s.a | s.b<<4)}
	for _, o := range s.ops {
		out = append(out, o[:]...)
	}
	return out
}

func lfWho(slot, key int) byte { return byte(slot | key<<4) }

// lfN encodes a count (lfCount): lfDrain, or up to 111 and below the
// burst + 2.
func lfN(n int) byte {
	switch {
	case n == lfDrain:
		return 0xf0
	case n < 4:
		return byte(n)
	}
	return 0x80 | byte(n)
}

func lfTake(slot, key, n int) [4]byte    { return [4]byte{lfTakeOp, lfWho(slot, key), lfN(n), 0} }
func lfReserve(slot, key, n int) [4]byte { return [4]byte{lfReserveOp, lfWho(slot, key), lfN(n), 0} }

// lfStale makes a take, reservation or ReserveAll use the limit not in
// force.
func lfStale(o [4]byte) [4]byte { o[3] |= 0x80; return o }

// lfSettle settles the i-th held reservation (oldest first) at actual.
func lfSettle(i, actual int) [4]byte { return [4]byte{lfSettleOp, byte(i), byte(actual), 1} }

// lfAll is a ReserveAll of takes {key, n ≤ 3} (one to three).
func lfAll(slot int, takes ...[2]int) [4]byte {
	o := [4]byte{lfReserveAllOp, byte(slot | (len(takes)-1)<<2), 0, 0}
	for j, tk := range takes {
		o[2] |= byte(tk[0] << j)
		o[3] |= byte(tk[1] << (2 * j))
	}
	return o
}

// lfAdvance steps the clock by d: (1 + y) × 10^e µs, y < 256, e < 6.
func lfAdvance(d time.Duration) [4]byte {
	us := d.Microseconds()
	for e, p := 0, int64(1); e < 6; e, p = e+1, p*10 {
		if us%p == 0 && us/p >= 1 && us/p <= 256 {
			return [4]byte{lfAdvanceOp, byte(e), byte(us/p - 1), 0}
		}
	}
	panic(fmt.Sprintf("lfAdvance(%v): not (1..256) × 10^(0..5) µs", d))
}

func lfClose(slot int) [4]byte          { return [4]byte{lfCloseOp, byte(slot), 0, 0} }
func lfCrash(slot int) [4]byte          { return [4]byte{lfCrashOp, byte(slot), 0, 0} }
func lfReload() [4]byte                 { return [4]byte{lfReloadOp, 0, 0, 0} }
func lfRefund(slot, key, n int) [4]byte { return [4]byte{lfRefundOp, lfWho(slot, key), byte(n), 0} }
func lfPeek(slot, key int) [4]byte      { return [4]byte{lfPeekOp, lfWho(slot, key), 0, 0} }
func lfOps(ops ...[4]byte) [][4]byte    { return ops }
func lfRepeat(n int, o [4]byte) [][4]byte {
	out := make([][4]byte, n)
	for i := range out {
		out[i] = o
	}
	return out
}

var lfSeeds = []lfSeed{
	// Exact: takes to the bottom, a reservation overrun into debt, the
	// takes it refuses, a refund, a peek, a reload, a take beyond the
	// burst, Close and crash.
	{a: 1, b: 4, ops: lfOps(
		lfTake(0, 0, 3), lfTake(0, 0, 0), lfReserve(0, 0, 2), lfTake(0, 0, 15), lfTake(0, 0, 1),
		lfSettle(0, 30), lfTake(0, 0, 1), lfReserve(0, 0, 0), lfAdvance(500*time.Millisecond), lfPeek(0, 0),
		lfAdvance(3*time.Second), lfTake(0, 0, 2), lfRefund(0, 0, 5), lfReserve(0, 0, 3), lfReload(),
		lfTake(0, 0, 21), lfTake(0, 0, 17), lfSettle(0, 1), lfStale(lfTake(0, 0, 4)), lfClose(0),
		lfTake(0, 0, 1), lfCrash(0), lfPeek(0, 0), lfReserve(0, 0, 3), lfSettle(0, 40),
	)},
	// Exact, two keys, batching and the deny cache: cached refusals, and
	// ReserveAll admitted, refused by the script's group, and refused by
	// the cache.
	{twoKeys: true, opts: 0b11, a: 3, b: 6, ops: lfOps(
		lfTake(0, 0, 6), lfTake(0, 0, 3), lfTake(0, 0, 3), lfAll(0, [2]int{0, 1}, [2]int{1, 2}),
		lfAdvance(2*time.Second), lfAll(0, [2]int{0, 1}, [2]int{1, 3}, [2]int{0, 1}), lfTake(0, 1, 3),
		lfTake(0, 1, 3), lfAll(0, [2]int{1, 3}, [2]int{0, 0}), lfAdvance(250*time.Millisecond),
		lfTake(0, 0, 3), lfSettle(1, 9), lfReload(), lfTake(0, 1, 20), lfAll(0, [2]int{1, 2}, [2]int{1, 3}),
		lfTake(0, 1, 3), lfRefund(0, 1, 3), lfTake(0, 1, 3), lfPeek(0, 1), lfAll(0, [2]int{0, 3}),
	)},
	// Exact, the deny cache's blind spot: a refusal cached under a slow
	// rate, a write under a fast one, and the cache refuses a take that
	// Redis would now admit.
	{opts: 0b10, a: 8, b: 7, ops: lfOps(
		lfStale(lfTake(0, 0, 85)), lfAdvance(4900*time.Millisecond), lfTake(0, 0, 44), lfStale(lfTake(0, 0, 1)),
		lfTake(0, 0, 53), lfTake(0, 0, 64), lfAdvance(20*time.Second), lfTake(0, 0, 53),
	)},
	// Leases: three stores build leases on two keys and spend them, one
	// closes (giving its lease back), time passes a little and a lot.
	{leases: true, twoKeys: true, stores: 3, lease: 100 * time.Millisecond, a: 0, b: 2, ops: append(append(
		lfRepeat(4, lfTake(0, 0, 1)), lfRepeat(4, lfTake(1, 0, 2))...), lfOps(
		lfTake(2, 1, 1), lfTake(2, 1, 1), lfTake(2, 1, 3), lfPeek(0, 0), lfAdvance(30*time.Millisecond),
		lfTake(0, 0, 1), lfTake(1, 0, 1), lfClose(1), lfTake(2, 0, 40), lfTake(2, 0, 30),
		lfAdvance(60*time.Millisecond), lfTake(0, 0, 3), lfTake(1, 0, 1), lfTake(1, 0, 1),
		lfAdvance(2*time.Second), lfTake(2, 1, 40), lfPeek(1, 1), lfTake(0, 0, 80),
	)...)},
	// A crash with a live lease: store 0 leases, spends a little and
	// dies; the others drain the bucket while its lease is out, and again
	// after it expired on Redis.
	{leases: true, stores: 2, lease: time.Second, opts: 0b0100, a: 2, b: 0, ops: lfOps(
		lfTake(0, 0, 1), lfTake(0, 0, 1), lfTake(0, 0, 1), lfCrash(0), lfTake(1, 0, 30), lfTake(1, 0, 10),
		lfTake(1, 0, 1), lfAdvance(100*time.Millisecond), lfTake(1, 0, 10), lfTake(1, 0, 10), lfTake(0, 0, 5),
		lfAdvance(2*time.Second), lfTake(1, 0, 40), lfTake(0, 0, 1), lfTake(0, 0, 1), lfTake(1, 0, 3),
	)},
	// A limit change with a live lease: stores 0 and 1 lease under the
	// first limit, the limit changes, store 1 still uses the old one a
	// while, reservations made before the change are settled after it.
	{leases: true, stores: 4, lease: 500 * time.Millisecond, opts: 0b10011000, a: 7, b: 5, ops: lfOps(
		lfTake(0, 0, 1), lfTake(0, 0, 1), lfReserve(1, 0, 1), lfReserve(1, 0, 2), lfReserve(1, 0, 1),
		lfReload(), lfTake(0, 0, 2), lfStale(lfTake(1, 0, 1)), lfStale(lfReserve(1, 0, 1)), lfTake(2, 0, 30),
		lfTake(3, 0, 30), lfSettle(0, 9), lfSettle(1, 0), lfTake(3, 0, 1), lfAdvance(20*time.Millisecond),
		lfTake(3, 0, 2), lfTake(3, 0, 1), lfReload(), lfTake(0, 0, 1), lfTake(0, 0, 50), lfSettle(0, 60),
		lfStale(lfTake(2, 0, 1)), lfAdvance(700*time.Millisecond), lfTake(1, 0, 1), lfPeek(1, 0),
	)},
	// A lease spent just before it ends and left to lapse on Redis (1 s
	// later, the client clock's slack); then another store takes 75 in
	// all, just within what the bound leaves it in that window.
	{leases: true, stores: 2, lease: 2 * time.Second, a: 0, b: 0, ops: lfOps(
		lfTake(0, 0, 1), lfTake(0, 0, 1), lfAdvance(1900*time.Millisecond), lfTake(0, 0, 10),
		lfAdvance(1100*time.Millisecond), lfTake(1, 0, 70), lfTake(1, 0, 5), lfPeek(1, 0),
	)},
	// Leases, reservations and ReserveAll on two keys, with batching and
	// the deny cache, debt and refunds.
	{leases: true, twoKeys: true, stores: 2, lease: 250 * time.Millisecond, opts: 0b1110, a: 2, b: 1, ops: lfOps(
		lfAll(0, [2]int{0, 1}, [2]int{1, 1}), lfAll(0, [2]int{0, 1}, [2]int{1, 1}), lfAll(0, [2]int{0, 2}, [2]int{1, 3}),
		lfReserve(1, 1, 3), lfReserve(1, 1, 3), lfReserve(1, 1, 3), lfSettle(2, 50), lfAll(0, [2]int{0, 1}, [2]int{1, 1}),
		lfTake(1, 1, 1), lfRefund(1, 1, 7), lfTake(1, 1, 1), lfAdvance(100*time.Millisecond), lfReserve(0, 0, 3),
		lfTake(1, 0, 35), lfAll(1, [2]int{0, 3}, [2]int{1, 0}), lfSettle(0, 0), lfSettle(0, 2), lfPeek(0, 0),
		lfAdvance(time.Second), lfAll(1, [2]int{0, 3}, [2]int{1, 3}, [2]int{0, 2}), lfClose(0), lfTake(0, 1, 1),
	)},
}
