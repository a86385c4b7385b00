package redisstore

import (
	"context"
	"errors"
	"github.com/floodgate-go/floodgate/remote"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/redis/go-redis/v9"
)

// clusterPrefixes start the error replies of remote.KindCluster.
var clusterPrefixes = [...]string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "CROSSSLOT", "READONLY", "MASTERDOWN", "LOADING"}

// KindOf classifies err, an error of a call to Redis such as the ones
// [WithOnError] receives or [ErrUnavailable] wraps; the error of a call the
// open breaker spared is remote.KindBreakerOpen. It allocates nothing.
func KindOf(err error) remote.ErrorKind {
	switch {
	case err == nil:
		return remote.KindNone
	case errors.Is(err, errBreakerOpen):
		return remote.KindBreakerOpen
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, errStarved):
		return remote.KindTimeout
	case errors.Is(err, context.Canceled):
		return remote.KindCanceled
	case errors.Is(err, errShortReply), errors.Is(err, errNotBucket):
		return remote.KindScript
	case errors.Is(err, redis.ErrClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return remote.KindConnection
	}
	// errors.As would allocate its target: walk the chain by hand. go-redis
	// wraps nothing in joined errors.
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch e := e.(type) {
		case redis.Error:
			msg := strings.TrimPrefix(e.Error(), "ERR ")
			for _, p := range clusterPrefixes {
				if strings.HasPrefix(msg, p) {
					return remote.KindCluster
				}
			}
			if strings.HasPrefix(msg, "WRONGTYPE") || strings.Contains(msg, "script") || strings.Contains(msg, "Script") {
				return remote.KindScript
			}
			return remote.KindOther
		case net.Error:
			if e.Timeout() {
				return remote.KindTimeout
			}
			return remote.KindConnection
		}
	}
	return remote.KindOther
}

// An Observer receives a Store's events, for metrics. Its methods are called
// on the goroutine that made the call or the decision, concurrently with
// each other, and must be fast and must not block; they must not call the
// Store. None of them receives a key.
type Observer interface {
	// ObserveCall is called once per round trip to Redis, with its
	// duration and the kind of its error (remote.KindNone on success). A batch
	// (WithBatching) is one round trip however many decisions it carries;
	// an EVALSHA retried as EVAL after NOSCRIPT counts once. Decisions that
	// the open breaker keeps from Redis make no call and are not observed.
	ObserveCall(d time.Duration, kind remote.ErrorKind)
	// ObserveBreaker is called at each transition of the breaker, in the
	// order they happen; the breaker starts closed.
	ObserveBreaker(from, to remote.BreakerState)
	// ObserveFallback is called for each decision of TakeN that Redis did
	// not make, with its source: floodgate.SourceCache, SourceLease,
	// SourceFallback, SourceFailOpen or SourceFailClosed.
	ObserveFallback(source floodgate.Source)
	// ObserveStarved is called for each call that missed its deadline
	// while this process was starved of CPU ([Stats].Starved): the
	// failure policy decided it, and it does not count against Redis.
	ObserveStarved()
	// ObserveInstances is called with the count of stores sharing this
	// store's prefix and name ([Stats].Instances) each time it is counted.
	ObserveInstances(n int)
}

// observe reports a call that started at start and ended with err.
func (s *Store) observe(start time.Time, err error) {
	s.obs.ObserveCall(time.Since(start), KindOf(err))
}

// observeFor reports a call made for a caller with context ctx: a call that
// ctx's deadline cut short is remote.KindCanceled, not a timeout of Redis.
func (s *Store) observeFor(ctx context.Context, start time.Time, err error) {
	kind := KindOf(err)
	if kind == remote.KindTimeout && ended(ctx) != nil {
		kind = remote.KindCanceled
	}
	s.obs.ObserveCall(time.Since(start), kind)
}

// decided reports a decision by source, which is not Redis.
//
// While the process is starved of CPU, it also yields the processor once.
// Such decisions cost next to nothing, so callers that retry at once can
// keep every CPU busy; the runtime then lets each run for a whole time
// slice, and a goroutine woken by the network (a probe, a call whose answer
// came) waits in the global run queue for hundreds of milliseconds, which
// is what kept the breaker open. Yielding after each cheap decision rotates
// the run queues fast enough for those goroutines to run within a few
// milliseconds.
func (s *Store) decided(source floodgate.Source) {
	s.counts[source].Add(1)
	if s.obs != nil {
		s.obs.ObserveFallback(source)
	}
	if s.starved(sched.recent()) {
		runtime.Gosched()
	}
}

// transitioned reports t to the observer and the logger. The breaker calls
// it outside its lock, one transition at a time and in order.
func (s *Store) transitioned(t transition) {
	if s.obs != nil {
		s.obs.ObserveBreaker(t.from, t.to)
	}
	l := s.opts.logger
	if l == nil {
		return
	}
	attrs := []slog.Attr{
		slog.String("from", t.from.String()),
		slog.String("to", t.to.String()),
		slog.String("prefix", s.opts.prefix),
		slog.String("name", s.opts.name),
	}
	level := slog.LevelInfo
	switch t.to {
	case remote.BreakerOpen:
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("error", t.kind.String()), slog.Duration("cooldown", s.opts.cooldown))
	case remote.BreakerClosed:
		attrs = append(attrs, slog.Duration("open_for", t.openFor))
	}
	l.LogAttrs(context.Background(), level, "redisstore: breaker state change", attrs...)
}
