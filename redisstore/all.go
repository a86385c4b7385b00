package redisstore

import (
	"context"
	"time"

	"github.com/floodgate-go/floodgate"
)

var _ floodgate.AllReserver = (*Store)(nil)

// ReserveAll reserves the takes of one request all or none
// ([floodgate.AllReserver]). Takes that this store's leases cover are
// decided in process; a take the deny cache refuses refuses the request
// without a take; the others go to Redis together as one all-or-nothing
// group of the script, in one round trip (batched with other callers'
// decisions when [WithBatching] is on): either every bucket is taken or
// none is. On a Cluster a group whose keys fall in several slots is one
// group per slot, and what one slot took is given back when another
// refused. When Redis cannot decide, the takes are decided one by one by
// the failure policy (see [floodgate.ReserveAll]).
//
// When the request is refused, every rs[i] holds no tokens and reports
// what its bucket decided alone; a take the deny cache refused leaves the
// takes after it reported by a peek of their buckets (on Redis, in one
// round trip), and the leased takes before it as their leases decided.
func (s *Store) ReserveAll(ctx context.Context, takes []floodgate.Take, rs []floodgate.Reservation) (int, error) {
	if len(rs) < len(takes) {
		return floodgate.ReserveAll(ctx, sequential{s}, takes, rs)
	}
	for i, t := range takes {
		if err := check(t.Key, t.Limit, t.N); err != nil {
			res := floodgate.Result{}
			if err == errExceedsBurst {
				res = floodgate.Result{Limit: t.Limit, RetryAfter: floodgate.Never, Source: floodgate.SourceRedis}
			}
			for j := range takes {
				rs[j] = floodgate.Reservation{}
			}
			rs[i] = floodgate.NewReservation(nil, t.Key, t.Limit, 0, res)
			return i, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// In process: leases, and the deny cache's refusals.
	var remote []int
	spent := make([]bool, len(takes))
	inf := make([]bool, len(takes))
	for i, t := range takes {
		switch {
		case t.Limit.IsInf():
			inf[i] = true
			rs[i] = floodgate.NewReservation(nil, t.Key, t.Limit, t.N,
				floodgate.Result{Allowed: true, Limit: t.Limit, Remaining: t.Limit.Burst, Source: floodgate.SourceRedis})
			continue
		case t.N > 0 && s.leases != nil:
			if res, ok := s.spend(t.Key, t.Limit, t.N); ok {
				rs[i] = floodgate.NewReservation(s, t.Key, t.Limit, t.N, res)
				spent[i] = true
				continue
			}
		}
		if t.N > 0 && s.cache != nil {
			if res, ok := s.cache.lookup(t.Key, t.Limit, t.N, s.local()); ok {
				// Refused without a take: the takes not decided are
				// peeked, and the first that does not fit refuses.
				s.decided(floodgate.SourceCache)
				rs[i] = floodgate.NewReservation(nil, t.Key, t.Limit, 0, res)
				s.undoSpent(takes, rs, spent)
				for j := i + 1; j < len(takes); j++ {
					remote = append(remote, j)
				}
				s.peekAt(ctx, takes, rs, remote)
				s.countLocal(spent, inf)
				for j := range takes[:i] {
					if !rs[j].Result.Allowed {
						return j, nil
					}
				}
				return i, nil
			}
		}
		remote = append(remote, i)
	}
	if len(remote) == 0 {
		s.countLocal(spent, inf)
		return -1, nil
	}
	if s.br.isOpen() {
		s.undoSpent(takes, rs, spent)
		return floodgate.ReserveAll(ctx, sequential{s}, takes, rs)
	}
	grp := 0 // a lone op is all or nothing by itself
	if len(remote) > 1 {
		grp = int(s.groups.Add(1))
	}
	ops := make([]op, len(remote))
	ptrs := make([]*op, len(remote))
	leasing := make([]bool, len(remote))
	for k, i := range remote {
		t := takes[i]
		ops[k] = op{key: s.Key(t.Key), lim: t.Limit, n: t.N, mode: modeTake, grp: grp}
		if t.N > 0 && s.leases != nil {
			leasing[k] = s.leaseOp(t.Key, &ops[k])
		}
		ptrs[k] = &ops[k]
	}
	out := make([]result1, len(ops))
	var sent int64
	if s.cache != nil {
		sent = s.local()
	}
	s.callAll(ctx, ptrs, out)
	refused, failed := -1, false
	for k, i := range remote {
		switch {
		case !leasing[k]:
		case grp == 0: // a lone op: a refusal closed the old lease
			s.leased(takes[i].Key, &ops[k], out[k].r, out[k].err)
		default:
			s.leasedGroup(takes[i].Key, &ops[k], out[k].r, out[k].err)
		}
		if out[k].err != nil {
			failed = true
			continue
		}
		if !out[k].r.allowed && !out[k].r.fitted && refused < 0 {
			refused = i
		}
	}
	if failed {
		// Whatever Redis took goes back; the failure policy decides
		// each take.
		s.undoTaken(ctx, remote, ops, out)
		s.undoSpent(takes, rs, spent)
		if cerr := ended(ctx); cerr != nil {
			return 0, cerr
		}
		return floodgate.ReserveAll(ctx, sequential{s}, takes, rs)
	}
	for k, i := range remote {
		t, r := takes[i], out[k].r
		s.counts[floodgate.SourceRedis].Add(1)
		res := ops[k].result(r)
		if leasing[k] && r.allowed {
			res.Remaining += int(r.taken) - t.N
		}
		if r.fitted {
			res.Allowed = true
		}
		rs[i] = floodgate.NewReservation(s, t.Key, t.Limit, t.N, res)
		if s.cache != nil && !r.allowed && !r.fitted && t.N > 0 {
			s.cache.insert(t.Key, t.Limit, r.tokens*unit, sent, res.RetryAfter)
		}
	}
	if refused < 0 {
		s.countLocal(spent, inf)
		return -1, nil
	}
	// Refused: nothing holds tokens. Takes in other script calls (other
	// Cluster slots) that Redis applied are given back.
	s.undoTaken(ctx, remote, ops, out)
	s.undoSpent(takes, rs, spent)
	s.countLocal(spent, inf)
	for k, i := range remote {
		res := rs[i].Result
		if out[k].r.allowed { // applied in another slot's call, and given back
			res.Remaining = min(res.Remaining+takes[i].N, takes[i].Limit.Burst)
		}
		rs[i] = floodgate.NewReservation(nil, takes[i].Key, takes[i].Limit, 0, res)
	}
	return refused, nil
}

// sequential hides Store's ReserveAll from floodgate.ReserveAll, whose
// take-after-take path it uses when Redis cannot decide.
type sequential struct{ floodgate.Reserver }

// callAll runs ops, one group, under the breaker and the deadline: in one
// batch with other callers' ops when batching is on, else in one round
// trip (one per slot on a Cluster).
func (s *Store) callAll(ctx context.Context, ops []*op, out []result1) {
	if s.batch == nil {
		copied := make([]op, len(ops))
		for i, o := range ops {
			copied[i] = *o
		}
		copy(out, s.sendAll(copied))
		return
	}
	now := time.Now()
	s.batch.doAll(ctx, ops, out)
	var failure error
	for _, a := range out {
		if a.err != nil && a.err != errNotBucket {
			failure = a.err
			break
		}
	}
	switch {
	case failure == nil:
		s.br.success(now)
		s.register()
	case ended(ctx) != nil:
	case s.starvedTimeout(failure, now):
		s.starved1()
	default:
		s.br.failure(time.Now(), failure)
		s.failed(failure)
	}
}

// undoTaken gives back the takes among ops that Redis applied: the
// request's tokens, not what a lease took beyond them, which stays leased.
func (s *Store) undoTaken(ctx context.Context, remote []int, ops []op, out []result1) {
	var back []op
	for k := range remote {
		if out[k].err == nil && out[k].r.allowed && ops[k].n > 0 {
			back = append(back, op{key: ops[k].key, lim: ops[k].lim, n: ops[k].n, mode: modeRefund})
		}
	}
	if len(back) > 0 {
		s.sendAll(back)
	}
}

// countLocal counts the takes decided in process: those spent from leases
// as the leases' decisions, those under floodgate.Inf as Redis's (which
// admits them without a call). ReserveAll counts them only once they
// stand, since a failure of Redis or an open breaker hands every take,
// these too, to the failure policy, which counts its own.
func (s *Store) countLocal(spent, inf []bool) {
	for i := range spent {
		switch {
		case spent[i]:
			s.decided(floodgate.SourceLease)
		case inf[i]:
			s.counts[floodgate.SourceRedis].Add(1)
		}
	}
}

// undoSpent gives the tokens spent from leases back to them.
func (s *Store) undoSpent(takes []floodgate.Take, rs []floodgate.Reservation, spent []bool) {
	for i, ok := range spent {
		if ok {
			s.unspend(takes[i].Key, takes[i].Limit, takes[i].N)
			rs[i] = floodgate.NewReservation(nil, takes[i].Key, takes[i].Limit, 0, rs[i].Result)
		}
	}
}

// peekAt reports the buckets of the takes at idx, taking nothing, in one
// round trip: what each holds, Allowed when its take would fit (a bucket
// Redis cannot report counts as full).
func (s *Store) peekAt(ctx context.Context, takes []floodgate.Take, rs []floodgate.Reservation, idx []int) {
	if len(idx) == 0 {
		return
	}
	ops := make([]op, len(idx))
	ptrs := make([]*op, len(idx))
	for k, i := range idx {
		ops[k] = op{key: s.Key(takes[i].Key), lim: takes[i].Limit, mode: modePeek}
		ptrs[k] = &ops[k]
	}
	out := make([]result1, len(idx))
	open := s.br.isOpen()
	if !open {
		s.callAll(ctx, ptrs, out)
	}
	for k, i := range idx {
		t := takes[i]
		res := floodgate.Result{Limit: t.Limit, Remaining: t.Limit.Burst}
		if !open && out[k].err == nil {
			res = withLease(ops[k].result(out[k].r), s.leaseTokens(t.Key, t.Limit))
		}
		res.Allowed = res.Remaining >= t.N && res.Owed == 0
		rs[i] = floodgate.NewReservation(nil, t.Key, t.Limit, 0, res)
	}
}
