package redisstore

import (
	"context"
	"github.com/floodgate-go/floodgate/remote"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher coalesces concurrent decisions. A caller queues its op; when
// fewer than maxInFlight batches are on the wire, it sends the queue itself
// as one round trip (from a new goroutine with a client that ignores
// deadlines) and hands out the replies; ops queued meanwhile go out with the
// next sender, and a flusher goroutine sends batch after batch until the
// queue is empty, then ends. Every op is answered by its due time; a caller
// that stops waiting earlier (its context ended) leaves its op in the batch,
// and Redis may still apply it: a take its caller was not told of, which
// under-admits, never over-admits, or the settle its caller asked for.
//
// While batches are on the wire the next one accumulates, so batches grow
// with concurrency and the round trips per decision fall.
type batcher struct {
	s    *Store
	max  int
	pool sync.Pool // of *pending, per batcher: see newBatcher

	mu      sync.Mutex
	queue   []*pending
	spare   []*pending
	running int // batches being sent, at most maxInFlight
}

// maxInFlight batches may be on the wire at once: with one, Redis idles
// while the client encodes, decodes and wakes callers; with a few, it stays
// busy and batches stay large.
const maxInFlight = 2

// minSecond is the queue length that starts a batch while another is on the
// wire: a smaller one would spend a round trip on a few ops.
const minSecond = 32

type pending struct {
	op   *op
	due  time.Time // when the caller stops waiting: queued + the (stretched) budget
	done chan result1
}

type result1 struct {
	r   reply
	err error
}

// newBatcher returns a batcher with a pool of its own: a pending holds a
// channel, which must not pass from a store in a testing/synctest bubble to
// one outside it.
func newBatcher(s *Store, max int) *batcher {
	b := &batcher{s: s, max: max}
	b.pool.New = func() any { return &pending{done: make(chan result1, 1)} }
	return b
}

// do queues o and waits for its reply. With a client that honours
// deadlines, senders answer every op by its due time (see send), so callers
// wait without a timer of their own: timers cost more CPU than anything else
// on this path. With a client that ignores them, each caller keeps a timer.
func (b *batcher) do(ctx context.Context, o *op) (reply, error) {
	p := b.pool.Get().(*pending)
	p.op = o
	p.due = time.Now().Add(b.s.budget + b.s.stretch())
	b.mu.Lock()
	b.queue = append(b.queue, p)
	lead := b.leadLocked()
	b.mu.Unlock()
	if lead {
		b.lead(ctx, p.due)
	}
	return b.wait(ctx, p)
}

// doAll queues ops together, so that they go in one batch (see sendNext),
// and waits for their replies, into out.
func (b *batcher) doAll(ctx context.Context, ops []*op, out []result1) {
	ps := make([]*pending, len(ops))
	due := time.Now().Add(b.s.budget + b.s.stretch())
	for i, o := range ops {
		ps[i] = b.pool.Get().(*pending)
		ps[i].op, ps[i].due = o, due
	}
	b.mu.Lock()
	b.queue = append(b.queue, ps...)
	lead := b.leadLocked()
	b.mu.Unlock()
	if lead {
		b.lead(ctx, due)
	}
	for i, p := range ps {
		out[i].r, out[i].err = b.wait(ctx, p)
	}
}

// leadLocked reports whether the caller that just queued sends a batch,
// and counts it.
func (b *batcher) leadLocked() bool {
	lead := b.running == 0 || b.running < maxInFlight && len(b.queue) >= min(minSecond, b.max)
	if lead {
		b.running++
	}
	return lead
}

// lead sends the queue as a leading caller whose op is due at due.
func (b *batcher) lead(ctx context.Context, due time.Time) {
	if dl, ok := ctx.Deadline(); b.s.guard || ok && dl.Before(due) {
		// The client may block past the deadline, or the caller must
		// leave before the batch's due time: flush elsewhere.
		go b.flush()
		return
	}
	// Send the first batch (ours) from this goroutine, which saves two
	// goroutine switches when there is no contention; hand any later
	// batches to a flusher. Yield first: goroutines already runnable
	// (callers just woken) queue their ops and go in this batch instead
	// of the next round trip. With none, it costs a scheduler check.
	runtime.Gosched()
	if b.sendNext() {
		b.mu.Lock()
		more := len(b.queue) > 0
		if !more {
			b.running--
		}
		b.mu.Unlock()
		if more {
			go b.flush()
		}
	}
}

// wait waits for p's reply, until its due time or ctx's end.
func (b *batcher) wait(ctx context.Context, p *pending) (reply, error) {
	done := ctx.Done()
	var timer <-chan time.Time
	if b.s.guard {
		t := time.NewTimer(time.Until(p.due))
		defer t.Stop()
		timer = t.C
	}
	select {
	case a := <-p.done:
		return b.early(ctx, p, a)
	case <-done:
	case <-timer:
	}
	select {
	case a := <-p.done: // the reply came with the end of the wait
		return b.early(ctx, p, a)
	default:
	}
	// p stays with its sender, which answers on the buffered channel; it
	// is not returned to the pool.
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	return reply{}, context.DeadlineExceeded
}

// early releases p and returns its answer a. A batch goes out with the
// deadline of its oldest op, so a timeout can reach a younger op before its
// own due time: that op had less than its budget, and its caller, with
// more time to spend, would take it for Redis's failure. Such a caller
// waits out its own due time (or its context) first, as it would have
// without batching.
func (b *batcher) early(ctx context.Context, p *pending, a result1) (reply, error) {
	due := p.due
	r, err := b.release(p, a)
	if err == nil || KindOf(err) != remote.KindTimeout {
		return r, err
	}
	if wait := time.Until(due); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return reply{}, ctx.Err()
		case <-t.C:
		}
	}
	return r, err
}

func (b *batcher) release(p *pending, a result1) (reply, error) {
	p.op = nil
	b.pool.Put(p)
	return a.r, a.err
}

// flush sends batches until the queue is empty. It yields before each, as
// a leading caller does, so that runnable goroutines' ops join the batch.
func (b *batcher) flush() {
	runtime.Gosched()
	for b.sendNext() {
		// The callers just answered are runnable and most will queue
		// their next op at once: let them, so the next batch is full.
		runtime.Gosched()
	}
}

// sendNext sends the queued ops, at most max of them, and reports whether
// there were any; with none it ends this sender's turn.
func (b *batcher) sendNext() bool {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return false
	}
	batch := b.queue
	if len(batch) > b.max {
		// An all-or-nothing group (doAll) goes in one batch whole.
		cut := b.max
		for g := batch[cut-1].op.grp; g != 0 && cut < len(batch) && batch[cut].op.grp == g; cut++ {
		}
		b.queue = append([]*pending(nil), batch[cut:]...)
		batch = batch[:cut]
	} else {
		b.queue, b.spare = b.spare, nil
	}
	b.mu.Unlock()

	b.send(batch)

	clear(batch)
	b.mu.Lock()
	if cap(batch) > cap(b.spare) {
		b.spare = batch[:0]
	}
	b.mu.Unlock()
	return true
}

// send runs one batch and answers every op in it by the op's due time:
// ops already due are answered at once with a deadline error, the rest are
// sent with the earliest due time as the deadline.
func (b *batcher) send(batch []*pending) {
	start := time.Now()
	if !start.Before(batch[0].due) { // the oldest op is due: drop the due ones
		live := make([]*pending, 0, len(batch))
		for _, p := range batch {
			if start.Before(p.due) {
				live = append(live, p)
			} else {
				p.done <- result1{err: context.DeadlineExceeded}
			}
		}
		if len(live) == 0 {
			return
		}
		batch = live
	}
	ctx, cancel := context.WithDeadline(context.Background(), batch[0].due)
	defer cancel()
	now := b.s.now()
	ops := make([]*op, len(batch))
	for i, p := range batch {
		ops[i] = p.op
	}
	groups := b.s.group(ops)
	replies := make([]result1, len(batch))
	if b.s.obs != nil {
		// The round trip starts now, not when the batch was taken.
		start = time.Now()
	}
	var err error
	if len(groups) == 1 {
		var vals []int64
		vals, err = b.s.evalOps(ctx, b.s.client, now, ops)
		fill(replies, groups[0], vals, err)
	} else {
		err = b.pipelined(ctx, now, ops, groups, replies)
	}
	if b.s.obs != nil {
		b.s.observe(start, err)
	}
	for i, p := range batch {
		p.done <- replies[i]
	}
}

// pipelined sends one script call per group in one pipeline, and resends
// the groups that met NOSCRIPT with EVAL in a second one. It returns the
// last pipeline's first error.
func (b *batcher) pipelined(ctx context.Context, now int64, ops []*op, groups [][]int, replies []result1) error {
	cmds := make([]*redis.Cmd, len(groups))
	pipe := b.s.client.Pipeline()
	for g, idx := range groups {
		keys, args := b.s.groupArgs(ops, idx, now)
		cmds[g] = pipe.EvalSha(ctx, bucketScript.Hash(), keys, args...)
	}
	_, err := pipe.Exec(ctx)
	var retry []int
	for g, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, g)
		}
	}
	if len(retry) > 0 {
		pipe := b.s.client.Pipeline()
		for _, g := range retry {
			keys, args := b.s.groupArgs(ops, groups[g], now)
			cmds[g] = pipe.Eval(ctx, bucketLua, keys, args...)
		}
		_, err = pipe.Exec(ctx)
	}
	// Each command carries its own error; err is for the observer.
	for g, cmd := range cmds {
		vals, err := cmd.Int64Slice()
		fill(replies, groups[g], vals, err)
	}
	return err
}

func (s *Store) groupArgs(ops []*op, idx []int, now int64) ([]string, []any) {
	keys := make([]string, len(idx))
	args := make([]any, 0, headArgs+argsPerOp*len(idx))
	args = s.appendHead(args, now)
	for i, j := range idx {
		keys[i] = ops[j].key
		args = ops[j].appendArgs(args)
	}
	return keys, args
}

func fill(replies []result1, idx []int, vals []int64, err error) {
	for i, j := range idx {
		if err != nil {
			replies[j].err = err
			continue
		}
		replies[j].r, replies[j].err = parse(vals, i)
	}
}

// group splits ops into the sets that one script call may carry: all of
// them on a standalone server, one set per hash slot on a Cluster, one op per
// set on a Ring or an unknown client (whose sharding the store cannot see).
func (s *Store) group(ops []*op) [][]int {
	switch s.client.(type) {
	case *redis.Client:
		all := make([]int, len(ops))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	case *redis.ClusterClient:
		bySlot := make(map[uint16]int, len(ops))
		var groups [][]int
		for i, o := range ops {
			sl := slot(o.key)
			g, ok := bySlot[sl]
			if !ok {
				g = len(groups)
				bySlot[sl] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], i)
		}
		return groups
	}
	groups := make([][]int, len(ops))
	for i := range ops {
		groups[i] = []int{i}
	}
	return groups
}
