package redisstore

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/floodgate-go/floodgate"
)

// leaseTable holds the tokens this process leased from hot buckets.
//
// A key is hot when it sees a second decision within the lease time. A
// decision on a hot key without enough leased tokens asks Redis for its own
// tokens plus up to rate×d more, in one atomic take (no more than the key's
// pace here would spend within d: see paced); the extra tokens are spent
// locally until d after the request was sent, then dropped. Every
// leased token was taken from the shared bucket no earlier than it was sent,
// and is spent within d of that, so over any window of length t all
// instances admit at most burst + rate×(t+d). A reservation served from a
// lease settles on the shared bucket, whose debt limit adds to that bound
// as it does without leases; a settle that leaves the bucket in debt drops
// this process's lease on the key, while other processes may spend theirs
// for up to d more, tokens taken before the debt, which rate×d counts.
type leaseTable struct {
	mu sync.Mutex // guards m and its entries: a decision reads and updates its lease at once
	d  int64      // ns
	m  *simplelru.LRU[string, *lease]

	// With credit (WithCredit): the entries holding tokens taken on credit
	// and not yet sent, oldest first, and whether a flusher sends them.
	credit   bool
	queue    []*lease
	flushing bool
}

type lease struct {
	key       string // the subject, for the credit flusher
	lim       floodgate.Limit
	tokens    int   // whole tokens left to spend
	expires   int64 // local ns
	seen      int64 // local ns of the last decision on the key
	remaining int   // the shared bucket's whole tokens by Redis's last answer here (negative: owed)
	known     bool  // remaining holds an answer under lim
	owed      int   // tokens taken on credit, not yet sent
	sending   int   // tokens taken on credit, being charged
	charged   int64 // tokens whose charges have been answered, ever
	queued    bool  // in the table's queue
}

// newLeaseTable returns a table of keys ≥ 1 entries, which evicts the key
// whose last decision is oldest: its lease is spent or expired, or the key
// is the coldest.
func newLeaseTable(d time.Duration, keys int) *leaseTable {
	m, _ := simplelru.NewLRU[string, *lease](keys, nil) // fails only for keys ≤ 0
	return &leaseTable{d: int64(d), m: m}
}

// remove drops key's entry, and the tokens it took on credit and has not
// sent: a reset bucket is full.
func (l *leaseTable) remove(key string) {
	l.mu.Lock()
	if e, ok := l.m.Peek(key); ok {
		e.owed = 0
	}
	l.m.Remove(key)
	l.mu.Unlock()
}

// entryLocked returns key's entry, adding one if there is none.
func (l *leaseTable) entryLocked(key string) *lease {
	e, ok := l.m.Get(key)
	if !ok {
		e = &lease{key: key, seen: math.MinInt64 / 2}
		l.m.Add(key, e)
	}
	return e
}

// answered records Redis's answer for e under lim: the shared bucket's
// whole tokens after it (negative while the bucket owes).
func (e *lease) answered(lim floodgate.Limit, res floodgate.Result) {
	e.lim, e.known = lim, true
	e.remaining = res.Remaining - res.Owed
}

// answeredSince records the answer to a take sent when e.charged was mark:
// charges answered since may have landed after it, so they count as taken
// from what it says (which errs toward less credit).
func (e *lease) answeredSince(lim floodgate.Limit, res floodgate.Result, mark int64) {
	e.answered(lim, res)
	e.remaining -= int(e.charged - mark)
}

// creditLocked reports whether e may take n tokens on credit under lim
// (see WithCredit), and if so takes them and reports whether a flusher must
// be started.
func (l *leaseTable) creditLocked(e *lease, lim floodgate.Limit, n int) (ok, start bool) {
	if e.lim != lim {
		if e.owed+e.sending > 0 {
			return false, false // charges under the old limit are on their way
		}
		e.lim, e.known, e.tokens = lim, false, 0
	}
	if e.owed+e.sending+n > l.creditOf(lim) || n > e.room(lim) {
		return false, false
	}
	e.owed += n
	if !e.queued {
		e.queued = true
		l.queue = append(l.queue, e)
	}
	if !l.flushing {
		l.flushing = true
		return true, true
	}
	return true, false
}

// creditOf returns the most tokens an entry may hold on credit under lim:
// ⌊rate×d⌋, at most the burst and the debt the bucket may carry.
func (l *leaseTable) creditOf(lim floodgate.Limit) int {
	x := lim.Rate * float64(l.d) / 1e9
	if !(x < float64(lim.Burst)) {
		x = float64(lim.Burst)
	}
	return min(int(x), lim.DebtLimit())
}

// cancelLocked gives back up to n tokens that key took on credit and has
// not sent, under lim, and returns how many.
func (l *leaseTable) cancelLocked(key string, lim floodgate.Limit, n int) int {
	e, ok := l.m.Peek(key)
	if !ok || e.lim != lim || e.owed == 0 {
		return 0
	}
	k := min(e.owed, n)
	e.owed -= k
	return k
}

// cancelCredit gives back up to n tokens that key took on credit under lim
// and has not sent, and returns how many: a refund of those is exact
// without a round trip.
func (s *Store) cancelCredit(key string, lim floodgate.Limit, n int) int {
	l := s.leases
	if l == nil || !l.credit {
		return 0
	}
	l.mu.Lock()
	k := l.cancelLocked(key, lim, n)
	l.mu.Unlock()
	return k
}

// room returns what e's shared bucket holds under lim by this process's
// count: Redis's last answer (the burst without one), less the tokens
// taken on credit and not yet charged; negative while it owes.
func (e *lease) room(lim floodgate.Limit) int {
	r := lim.Burst
	if e.known {
		r = e.remaining
	}
	return r - e.owed - e.sending
}

// creditResult is the Result of a take on credit from e.
func (e *lease) creditResult(lim floodgate.Limit) floodgate.Result {
	return floodgate.Result{Allowed: true, Limit: lim, Remaining: max(e.room(lim), 0), Source: floodgate.SourceLease}
}

// extra returns how many tokens beyond n to lease under lim.
func (l *leaseTable) extra(lim floodgate.Limit, n int) int {
	x := lim.Rate * float64(l.d) / 1e9
	if x > float64(lim.Burst-n) {
		return lim.Burst - n
	}
	return int(x)
}

// paced caps a lease's extra tokens x at what this process would spend
// within the lease time d at the pace of its last two decisions on the
// key, gap apart, n tokens each, less one decision's worth for the pace's
// jitter: a replica that sees a third of a key's demand leases a third as
// much, instead of tokens that expire unspent while the other replicas
// are refused. A key decided less than twice a lease time here leases
// nothing.
func paced(x int, d, gap int64, n int) int {
	if gap <= 0 {
		return x
	}
	if want := ((d-1)/gap - 1) * int64(n); want < int64(x) {
		return int(max(want, 0))
	}
	return x
}

// takeLeased decides a take of 1 ≤ n ≤ burst with leases on.
func (s *Store) takeLeased(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	l := s.leases
	now := s.local()
	l.mu.Lock()
	e := l.entryLocked(key)
	res, from, x, start := s.localLocked(e, lim, n, now)
	if from != fromNone {
		l.mu.Unlock()
		s.spentLocally(from, start)
		return res, nil
	}
	e.seen = now
	mark := e.charged
	o := op{key: s.Key(key), lim: lim, n: n, mode: modeTake}
	if x > 0 {
		// A hot key at a pace that leases: one round trip buys its
		// decisions for the lease time. It takes at least half the extra
		// tokens or nothing, so that a key at its limit costs a round trip
		// every half lease time, not one a refilled token (the deny cache
		// holds the refusal until the bucket holds the half).
		o.mode, o.n, o.min = modeLease, n+x, n+x/2
	}
	l.mu.Unlock()

	r, err := s.call(ctx, &o)
	if err != nil {
		if cerr := ended(ctx); cerr != nil {
			return floodgate.Result{}, cerr
		}
		return s.fail(ctx, &o, key, err)
	}
	s.counts[floodgate.SourceRedis].Add(1)
	res = o.result(r)
	if o.mode == modeLease && r.allowed {
		x := int(r.taken) - n
		res.Remaining += x
		l.mu.Lock()
		e := l.entryLocked(key)
		if e.lim != lim && e.owed+e.sending > 0 {
			// Credit under the old limit is on its way: the entry keeps
			// it, and this lease's extra tokens go unspent, an
			// under-admission, until those charges are answered.
			l.mu.Unlock()
			return res, nil
		}
		if e.lim == lim && now < e.expires && e.tokens > 0 {
			// Another lease of this key landed while this one was in
			// flight (both were sent while the lease ran short): keep its
			// tokens, which the shared bucket no longer holds, and spend
			// them all by the earlier expiry, so that no token is spent
			// later than d after the request that took it was sent.
			e.tokens += x
			e.expires = min(e.expires, now+l.d)
		} else {
			e.tokens, e.expires = x, now+l.d
		}
		e.lim, e.remaining, e.known = lim, res.Remaining-x-int(e.charged-mark), true
		l.mu.Unlock()
	} else {
		if l.credit {
			l.mu.Lock()
			if e := l.entryLocked(key); e.owed+e.sending == 0 || e.lim == lim {
				e.answeredSince(lim, res, mark)
			}
			l.mu.Unlock()
		}
		if s.cache != nil && !r.allowed {
			least := 0
			if o.mode == modeLease {
				least = o.min
			}
			s.cache.insertLeast(key, lim, r.tokens*unit, now, res.RetryAfter, least)
		}
	}
	return res, nil
}

// Where localLocked took tokens from.
const (
	fromNone = iota
	fromLease
	fromCredit
)

// localLocked decides a take of 1 ≤ n ≤ burst from e without a round
// trip when it can: from e's lease, or on credit unless the key is hot at
// a pace that leases. It reports where it took the tokens from; fromNone
// for a take that needs Redis, which leaves e as it was, with the extra
// tokens its round trip should lease (0: a plain take). And it reports
// whether a credit flusher must be started.
func (s *Store) localLocked(e *lease, lim floodgate.Limit, n int, now int64) (res floodgate.Result, from, lease int, start bool) {
	l := s.leases
	if e.lim == lim && now < e.expires && e.tokens >= n {
		e.tokens -= n
		e.seen = now
		return floodgate.Result{Allowed: true, Limit: lim, Remaining: e.tokens + e.remaining, Source: floodgate.SourceLease}, fromLease, 0, false
	}
	if gap := now - e.seen; gap <= l.d {
		if x := paced(l.extra(lim, n), l.d, gap, n); x > 0 {
			return floodgate.Result{}, fromNone, x, false
		}
	}
	if !l.credit || s.br.isOpen() {
		return floodgate.Result{}, fromNone, 0, false
	}
	ok, start := l.creditLocked(e, lim, n)
	if !ok {
		return floodgate.Result{}, fromNone, 0, false
	}
	e.seen = now
	return e.creditResult(lim), fromCredit, 0, start
}

// spentLocally counts a take localLocked decided, and starts the credit
// flusher when it must.
func (s *Store) spentLocally(from int, start bool) {
	if from == fromCredit {
		if start {
			go s.flushCredit()
		}
		s.credits.Add(1)
	}
	s.decided(floodgate.SourceLease)
}

// ReserveLocal reserves n tokens of key under lim as [Store.ReserveN]
// does, when it can decide without a round trip: from this instance's
// share ([WithShares]), tokens leased ahead ([WithLeases]) or on credit
// ([WithCredit]). It reports false, having taken nothing, when the take
// needs Redis: for n < 1 or an n ReserveN would refuse as invalid, under
// floodgate.Inf, for a take the deny cache refuses, and when neither a
// share, a lease nor credit covers it. A
// caller deciding several keys for one request takes what it can this way
// first, and sends only the rest to Redis, concurrently.
func (s *Store) ReserveLocal(key string, lim floodgate.Limit, n int) (floodgate.Reservation, bool) {
	if n < 1 || check(key, lim, n) != nil || lim.IsInf() || n > lim.Burst {
		return floodgate.Reservation{}, false
	}
	share, pool, ok := s.split(lim)
	var sh floodgate.Result
	if ok {
		r, res, took := s.reserveShare(key, lim, share, n)
		if took {
			return r, true
		}
		sh = res
	}
	res, took := s.leasedLocally(key, pool, n)
	if !took {
		return floodgate.Reservation{}, false
	}
	if pool != lim {
		res = s.pooled(res, lim, sh)
	}
	return floodgate.NewReservation(s, key, lim, n, res), true
}

// leasedLocally is ReserveLocal's take from a lease or on credit, under
// the part of the limit Redis holds.
func (s *Store) leasedLocally(key string, lim floodgate.Limit, n int) (floodgate.Result, bool) {
	l := s.leases
	if l == nil || n > lim.Burst {
		return floodgate.Result{}, false
	}
	now := s.local()
	if s.cache != nil {
		if _, denied := s.cache.lookup(key, lim, n, now); denied {
			return floodgate.Result{}, false
		}
	}
	l.mu.Lock()
	e := l.entryLocked(key)
	res, from, _, start := s.localLocked(e, lim, n, now)
	l.mu.Unlock()
	if from == fromNone {
		return floodgate.Result{}, false
	}
	s.spentLocally(from, start)
	return res, true
}

// flushEvery returns how long the credit flusher waits before each batch
// of charges: long enough that a batch carries many keys, short against
// the lease time, which bounds how long credit goes uncharged.
func (l *leaseTable) flushEvery() time.Duration {
	return time.Duration(max(l.d/20, int64(100*time.Microsecond)))
}

// flushCredit charges the tokens taken on credit to their shared buckets,
// batch after batch, until none are left unsent; then it ends. One runs at
// a time: the take that finds none running starts it.
func (s *Store) flushCredit() {
	l := s.leases
	var (
		es  []*lease
		ops []op
	)
	for {
		time.Sleep(l.flushEvery())
		l.mu.Lock()
		q := l.queue
		l.queue = nil
		if len(q) == 0 {
			l.flushing = false
			l.mu.Unlock()
			return
		}
		es, ops = es[:0], ops[:0]
		for _, e := range q {
			e.queued = false
			if e.owed == 0 {
				continue // given back before it was sent
			}
			es = append(es, e)
			ops = append(ops, op{key: s.Key(e.key), lim: e.lim, n: e.owed, mode: modeSettle})
			e.sending += e.owed
			e.owed = 0
		}
		l.mu.Unlock()
		replies := s.charge(ops)
		l.mu.Lock()
		for i, e := range es {
			e.sending -= ops[i].n
			e.charged += int64(ops[i].n)
			switch a := replies[i]; {
			case a.err == nil:
				e.answered(ops[i].lim, ops[i].result(a.r))
			case e.known:
				// The charge is lost: the tokens were admitted all the
				// same, so the count keeps them taken.
				e.remaining -= ops[i].n
			default:
				e.lim, e.known, e.remaining = ops[i].lim, true, ops[i].lim.Burst-ops[i].n
			}
		}
		l.mu.Unlock()
	}
}

// charge sends ops, settles of tokens taken on credit, in batches of one
// round trip each, and returns their answers in order. The breaker and the
// failure counts see them as they see decisions' calls.
func (s *Store) charge(ops []op) []result1 {
	out := make([]result1, len(ops))
	if len(ops) == 0 {
		return out
	}
	now := time.Now()
	if ok, probe := s.br.allow(now); !ok {
		if probe {
			// This call is the first since the cooldown: it owes the
			// breaker its half-open probe.
			s.probe(op{key: ops[0].key, lim: ops[0].lim}, true)
		}
		for i := range out {
			out[i].err = errBreakerOpen
		}
		return out
	}
	b := s.batch
	if b == nil {
		b = newBatcher(s, maxCharges)
	}
	ps := make([]*pending, len(ops))
	for i := range ops {
		ps[i] = &pending{op: &ops[i], done: make(chan result1, 1)}
	}
	for i := 0; i < len(ps); i += b.max {
		// Each round trip gets the whole budget: the chunks go one after
		// another.
		chunk := ps[i:min(i+b.max, len(ps))]
		due := time.Now().Add(s.budget + s.stretch())
		for _, p := range chunk {
			p.due = due
		}
		b.send(chunk)
	}
	var failure error
	for i, p := range ps {
		out[i] = <-p.done
		if err := out[i].err; err != nil && err != errNotBucket && failure == nil {
			failure = err
		}
	}
	if failure == nil {
		s.br.success(now)
		s.register()
	} else {
		s.br.failure(time.Now(), failure)
		s.failed(failure)
	}
	return out
}

// maxCharges is the most charges per round trip without WithBatching.
const maxCharges = 128

// owes records that a settle left key's bucket owing under lim, with
// Redis's answer res: the lease is dropped, so that this process's takes
// are refused, and the balance is what credit then counts; tokens taken on
// credit and not yet charged stay to be charged.
func (l *leaseTable) owes(key string, lim floodgate.Limit, res floodgate.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m.Peek(key)
	if !ok {
		return
	}
	e.tokens, e.expires = 0, 0
	if e.lim == lim || e.owed+e.sending == 0 {
		e.answered(lim, res)
	}
}

// creditRoom returns what key's shared bucket holds under lim by this
// process's count (see room), at least 0.
func (s *Store) creditRoom(key string, lim floodgate.Limit) int {
	l := s.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m.Peek(key)
	if !ok || e.lim != lim {
		return lim.Burst
	}
	return max(e.room(lim), 0)
}

// peekCredit answers a take of 0 tokens (a peek) from this process's count
// with credit on (see WithCredit): Redis's last answer for key, less the
// tokens taken on credit since and plus those leased and unspent, or a
// full bucket for a key it has no answer for. It reports false without
// credit, or while the breaker is open.
func (s *Store) peekCredit(key string, lim floodgate.Limit) (floodgate.Result, bool) {
	l := s.leases
	if l == nil || !l.credit || s.br.isOpen() {
		return floodgate.Result{}, false
	}
	now := s.local()
	l.mu.Lock()
	res := floodgate.Result{Allowed: true, Limit: lim, Remaining: lim.Burst, Source: floodgate.SourceLease}
	if e, ok := l.m.Peek(key); ok && e.lim == lim {
		room := e.room(lim)
		if now < e.expires {
			room += e.tokens
		}
		res.Remaining, res.Owed = max(room, 0), max(-room, 0)
	}
	l.mu.Unlock()
	s.decided(floodgate.SourceLease)
	return res, true
}
