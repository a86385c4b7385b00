package redisstore

import (
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/floodgate-go/floodgate"
)

// leaseTable holds the tokens Redis leased to this store, per key.
//
// A lease is recorded on Redis, in the bucket's own key, by the script that
// takes its tokens: the bucket and the leases out of it never hold more
// than the burst (bucketLua). Redis counts a lease out until the lease
// time d after it recorded it; here it is spent for d/2 after the request
// that took it was sent (no later than Redis recorded it), and what is
// left goes back with the key's next round trip within d, under a new
// limit, or at Close. Its size follows this store's demand on the key
// (see size), so a key whose requests all reach one instance leases as
// much as it needs. A lease this store no longer knows of (evicted, or the
// process died) leaves G when it expires on Redis.
type leaseTable struct {
	mu sync.Mutex // guards m and its entries
	d  int64      // ns
	m  *simplelru.LRU[string, *lease]
}

type lease struct {
	lim       floodgate.Limit
	tokens    int   // whole tokens of the live lease, unspent
	spendBy   int64 // local ns; the lease is spent before it, half the lease time after it was asked for
	expires   int64 // local ns; before it, Redis still counts the lease out, and it goes back
	remaining int   // the bucket's whole tokens (less what is leased out) by Redis's last answer here; negative: owed
	since     int64 // local ns of the last round trip on the key, 0 before one
	asked     int   // tokens asked for on the key since then
	rate      float64
	busy      bool  // a lease round trip is on its way
	seen      int64 // local ns when the op that remaining answers was sent, 0 before one
}

// newLeaseTable returns a table of keys ≥ 1 entries, which evicts the key
// decided on least recently: its lease, if still live, is then left to
// expire on Redis.
func newLeaseTable(d time.Duration, keys int) *leaseTable {
	m, _ := simplelru.NewLRU[string, *lease](keys, nil) // fails only for keys ≤ 0
	return &leaseTable{d: int64(d), m: m}
}

func (l *leaseTable) entryLocked(key string) *lease {
	e, ok := l.m.Get(key)
	if !ok {
		e = &lease{}
		l.m.Add(key, e)
	}
	return e
}

// remove drops key's entry: its lease, if live, expires on Redis unspent.
func (l *leaseTable) remove(key string) {
	l.mu.Lock()
	l.m.Remove(key)
	l.mu.Unlock()
}

// live reports whether e holds a lease under lim at now.
func (e *lease) live(lim floodgate.Limit, now int64) bool {
	return e.lim == lim && now < e.spendBy
}

// size returns how many tokens beyond n to lease under lim: what this
// store's demand on the key, smoothed over its round trips, asks for in a
// quarter of the lease time, at most an eighth of the burst. A key on its
// first round trip leases nothing: most keys of a large key space are
// seen once in a while, and a lease would only hold their tokens back.
func (l *leaseTable) size(e *lease, lim floodgate.Limit, n int, now int64) int {
	if e.since == 0 {
		return 0
	}
	rate := float64(e.asked) * 1e9 / float64(max(now-e.since, 1))
	if e.rate > 0 {
		rate = (rate + e.rate) / 2
	}
	e.rate = rate
	x := min(rate*float64(l.d)/4e9, float64(lim.Burst)/8, float64(lim.Burst-n))
	return max(int(x), 0)
}

// result is the Result of a take from e's lease under lim: the bucket's
// tokens by Redis's last answer, plus this lease's.
func (e *lease) result(lim floodgate.Limit) floodgate.Result {
	res := withLease(floodgate.Result{Allowed: true, Limit: lim, Source: floodgate.SourceLease, Remaining: max(e.remaining, 0), Owed: max(-e.remaining, 0)}, e.tokens)
	res.ResetAfter = waitFor(lim, int64(lim.Burst-e.remaining-e.tokens)*1e9)
	return res
}

// spend takes n tokens of key's live lease under lim, and reports whether
// it could: a decision made without a round trip, which the caller counts
// (decided) once it stands.
func (s *Store) spend(key string, lim floodgate.Limit, n int) (floodgate.Result, bool) {
	l := s.leases
	now := s.local()
	l.mu.Lock()
	e := l.entryLocked(key)
	e.asked += n
	if !e.live(lim, now) || e.tokens < n {
		l.mu.Unlock()
		return floodgate.Result{}, false
	}
	e.tokens -= n
	res := e.result(lim)
	l.mu.Unlock()
	return res, true
}

// leaseOp turns o, a take of 1 ≤ n ≤ burst that no lease covered, into the
// round trip that leases too: it closes this store's lease on the key
// (giving back what is left of it) and asks for a new one sized to the
// demand. It returns false, leaving o a plain take, when a lease round
// trip on the key is already on its way or there is nothing to close and
// nothing to lease.
func (s *Store) leaseOp(key string, o *op) bool {
	l := s.leases
	now := s.local()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entryLocked(key)
	s.hint(e, o, now)
	if e.busy {
		return false
	}
	x := l.size(e, o.lim, o.n, now)
	e.since, e.asked = now, 0
	held := now < e.expires
	if x == 0 && !held {
		return false
	}
	o.mode, o.a1, o.a2, o.a3 = modeLease, x, x/2, -1
	if held {
		o.a3 = e.tokens
	}
	o.exp = e.expires
	e.busy, e.tokens, e.expires, e.spendBy = true, 0, 0, 0
	o.sent = now
	return true
}

// leased records Redis's answer r to o, a lease round trip (or, with err,
// its failure: the tokens it gave back are lost, which under-admits).
func (s *Store) leased(key string, o *op, r reply, err error) {
	s.leasedIn(key, o, r, err, false)
}

// leasedGroup is leased for o in an all-or-nothing group: a group Redis
// refused applied nothing, not even the close of the old lease, which this
// store keeps spending.
func (s *Store) leasedGroup(key string, o *op, r reply, err error) {
	s.leasedIn(key, o, r, err, true)
}

func (s *Store) leasedIn(key string, o *op, r reply, err error, group bool) {
	l := s.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entryLocked(key)
	e.busy = false
	if err != nil {
		return
	}
	if group && !r.allowed {
		if o.a3 > 0 && e.expires == 0 {
			e.tokens, e.expires, e.spendBy = o.a3, o.exp, o.exp-l.d/2
		}
		return
	}
	e.lim = o.lim
	e.remaining, e.seen = wholeTokens(r.tokens), o.sent
	if x := int(r.taken) - o.n; r.allowed && x > 0 {
		e.tokens, e.expires, e.spendBy = x, o.sent+l.d, o.sent+l.d/2
	}
}

// observed records what Redis answered for key under lim to a round trip
// sent at sent that leased nothing: for the Results of later leased
// decisions, and for hints.
func (s *Store) observed(key string, lim floodgate.Limit, r reply, sent int64) {
	l := s.leases
	l.mu.Lock()
	if e, ok := l.m.Peek(key); ok && !e.busy {
		if e.lim != lim {
			e.lim, e.tokens, e.expires, e.spendBy = lim, 0, 0, 0
		}
		if e.since == 0 {
			e.since = sent
		}
		e.remaining, e.seen = wholeTokens(r.tokens), sent
	}
	l.mu.Unlock()
}

// hint sets o's hint from e, what Redis last answered here for the bucket
// and the refill since, when that answer is recent (see bucketLua): the
// bucket held at most that, less this store's live lease.
func (s *Store) hint(e *lease, o *op, now int64) {
	if e.seen == 0 || now-e.seen >= int64(hintAge) || e.lim != o.lim {
		return
	}
	h := float64(e.remaining) + o.lim.Rate*float64(now-e.seen)/1e9
	if now < e.expires {
		h -= float64(e.tokens)
	}
	o.hint, o.hinted = int(max(min(h, float64(o.lim.Burst)), 0)), true
}

// wholeTokens converts micro-tokens to whole tokens, rounding toward
// minus infinity: a bucket that owes part of a token owes a token.
func wholeTokens(micro int64) int {
	if micro >= 0 {
		return int(micro / 1e6)
	}
	return -int((-micro + 1e6 - 1) / 1e6)
}

// owes drops key's lease after a settle left its bucket owing: this store
// refuses the key's takes until Redis admits one. The lease's tokens stay
// counted out on Redis until it expires, which errs toward the limit.
func (l *leaseTable) owes(key string) {
	l.mu.Lock()
	if e, ok := l.m.Peek(key); ok {
		e.tokens, e.expires, e.spendBy = 0, 0, 0
	}
	l.mu.Unlock()
}

// giveBack closes every live lease of this store, in batched round trips,
// returning their unspent tokens. Close calls it.
func (s *Store) giveBack() {
	l := s.leases
	now := s.local()
	var ops []op
	l.mu.Lock()
	for _, key := range l.m.Keys() {
		e, _ := l.m.Peek(key)
		if e.busy || now >= e.expires {
			continue
		}
		ops = append(ops, op{key: s.Key(key), lim: e.lim, mode: modeLease, a3: e.tokens})
		e.tokens, e.expires, e.spendBy = 0, 0, 0
	}
	l.mu.Unlock()
	s.sendAll(ops)
}

// sendAll sends ops in batches of one round trip each, and returns their
// answers in order. The breaker and the failure counts see them as they
// see decisions' calls.
func (s *Store) sendAll(ops []op) []result1 {
	out := make([]result1, len(ops))
	if len(ops) == 0 {
		return out
	}
	now := time.Now()
	if ok, probe := s.br.allow(now); !ok {
		if probe {
			s.probe(op{key: ops[0].key, lim: ops[0].lim}, true)
		}
		for i := range out {
			out[i].err = errBreakerOpen
		}
		return out
	}
	b := s.batch
	if b == nil {
		b = newBatcher(s, maxSendAll)
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

// maxSendAll is the most ops per round trip of sendAll without
// WithBatching.
const maxSendAll = 128

// leaseTokens returns the tokens of key's live lease under lim, 0 without
// one.
func (s *Store) leaseTokens(key string, lim floodgate.Limit) int {
	l := s.leases
	if l == nil {
		return 0
	}
	now := s.local()
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.m.Peek(key); ok && e.live(lim, now) {
		return e.tokens
	}
	return 0
}

// unspend gives n tokens spent from key's lease under lim back to it, when
// it is still live: a request another bucket refused took nothing.
func (s *Store) unspend(key string, lim floodgate.Limit, n int) {
	l := s.leases
	now := s.local()
	l.mu.Lock()
	if e, ok := l.m.Peek(key); ok && e.live(lim, now) {
		e.tokens += n
	}
	l.mu.Unlock()
}

// withLease adds this store's lease of n tokens to res, a report of the
// bucket on Redis: it pays what the bucket owes first.
func withLease(res floodgate.Result, n int) floodgate.Result {
	room := res.Remaining - res.Owed + n
	res.Remaining, res.Owed = max(room, 0), max(-room, 0)
	return res
}
