package redisstore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// batcher coalesces concurrent decisions. A caller queues its op; when no
// flush is running it starts one, a goroutine that sends everything queued
// as one round trip, hands out the replies, and loops until the queue is
// empty, then ends. Callers wait for their reply or their deadline,
// whichever comes first: a caller that stops waiting leaves its op in the
// batch (Redis may still apply it, which under-admits, never over-admits).
//
// While one flush is on the wire the next batch accumulates, so batches
// grow with concurrency and the round trips per decision fall.
type batcher struct {
	s   *Store
	max int

	mu      sync.Mutex
	queue   []*pending
	spare   []*pending
	running bool
}

type pending struct {
	op   *op
	done chan result1
}

type result1 struct {
	r   reply
	err error
}

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan result1, 1)} }}

func newBatcher(s *Store, max int) *batcher { return &batcher{s: s, max: max} }

func (b *batcher) do(ctx context.Context, o *op) (reply, error) {
	dctx, cancel := context.WithTimeout(ctx, b.s.opts.deadline)
	defer cancel()
	p := pendingPool.Get().(*pending)
	p.op = o
	b.mu.Lock()
	b.queue = append(b.queue, p)
	start := !b.running
	b.running = true
	b.mu.Unlock()
	if start {
		go b.flush()
	}
	select {
	case a := <-p.done:
		p.op = nil
		pendingPool.Put(p)
		return a.r, a.err
	case <-dctx.Done():
		// p stays with the flusher, which sends to its buffered channel;
		// it is not returned to the pool.
		return reply{}, dctx.Err()
	}
}

func (b *batcher) flush() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := b.queue
		if len(batch) > b.max {
			b.queue = append([]*pending(nil), batch[b.max:]...)
			batch = batch[:b.max]
		} else {
			b.queue, b.spare = b.spare, nil
		}
		b.mu.Unlock()

		b.send(batch)

		clear(batch)
		b.mu.Lock()
		b.spare = batch[:0]
		b.mu.Unlock()
	}
}

// send runs one batch within one deadline and answers every op in it.
func (b *batcher) send(batch []*pending) {
	ctx, cancel := context.WithTimeout(context.Background(), b.s.opts.deadline)
	defer cancel()
	now := b.s.now()
	ops := make([]*op, len(batch))
	for i, p := range batch {
		ops[i] = p.op
	}
	groups := b.s.group(ops)
	replies := make([]result1, len(batch))
	if len(groups) == 1 {
		vals, err := evalOps(ctx, b.s.client, now, ops)
		fill(replies, groups[0], vals, err)
	} else {
		b.pipelined(ctx, now, ops, groups, replies)
	}
	for i, p := range batch {
		p.done <- replies[i]
	}
}

// pipelined sends one script call per group in one pipeline, and resends
// the groups that met NOSCRIPT with EVAL in a second one.
func (b *batcher) pipelined(ctx context.Context, now int64, ops []*op, groups [][]int, replies []result1) {
	cmds := make([]*redis.Cmd, len(groups))
	pipe := b.s.client.Pipeline()
	for g, idx := range groups {
		keys, args := groupArgs(ops, idx, now)
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
			keys, args := groupArgs(ops, groups[g], now)
			cmds[g] = pipe.Eval(ctx, bucketLua, keys, args...)
		}
		_, err = pipe.Exec(ctx)
	}
	_ = err // each command carries its own error
	for g, cmd := range cmds {
		vals, err := cmd.Int64Slice()
		fill(replies, groups[g], vals, err)
	}
}

func groupArgs(ops []*op, idx []int, now int64) ([]string, []any) {
	keys := make([]string, len(idx))
	args := make([]any, 0, 3+5*len(idx))
	args = appendHead(args, now)
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
		r, ok := parse(vals, i)
		if !ok {
			replies[j].err = errShortReply
			continue
		}
		replies[j].r = r
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
