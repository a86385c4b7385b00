package middleware

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate-go/floodgate"
)

// PushbackKey is the trailer through which a rejection tells grpc-go's
// retrying client how many milliseconds to wait before its next attempt,
// or -1 not to retry (gRFC A6).
const PushbackKey = "grpc-retry-pushback-ms"

// ErrorInfo reasons of rejections, in the domain set by WithDomain.
const (
	// ErrorReasonRateLimited: the caller is over its quota.
	ErrorReasonRateLimited = "RATE_LIMITED"
	// ErrorReasonOverloaded: the caller is over its share while the CPU
	// gate sheds load.
	ErrorReasonOverloaded = "OVERLOADED"
	// ErrorReasonUnavailable: the store could not decide, and the Limiter
	// fails closed (WithFailClosed).
	ErrorReasonUnavailable = "LIMITER_UNAVAILABLE"
)

// MetadataKeyIgnored is the ErrorInfo metadata key of a rejection whose
// caller sent an API key header the Limiter ignored, which made it
// anonymous and judged by its address; its value says why.
const MetadataKeyIgnored = "api_key_ignored"

// Values of MetadataKeyIgnored.
const (
	// KeyIgnoredRepeated: the header had more than one value, as
	// metadata.AppendToOutgoingContext makes when a key is already set.
	// The Limiter does not guess which one is the caller's.
	KeyIgnoredRepeated = "repeated"
	// KeyIgnoredTooLong: the value was longer than any API key.
	KeyIgnoredTooLong = "too_long"
)

// Rejection messages: short and static, so that they never carry a key, an
// address, a method or a backend's error text, and cost nothing to build.
const (
	msgQuota    = "rate limit exceeded"
	msgOverload = "server overloaded"
	msgStore    = "rate limiter unavailable"
)

type kind uint8

const (
	kindQuota kind = iota
	kindOverload
	kindStore
	nKinds
)

// Retry delays are rounded up onto a fixed grid, so that each rejection
// status with its details is built once and then shared: milliseconds up
// to 1 s, 10 ms up to 10 s, seconds up to maxPushbackLimit. Rounding up
// never asks a client to come back before its tokens have.
const (
	gridFine   = 1000
	gridMedium = gridFine + (10_000-1_000)/10
	gridSize   = gridMedium + int((maxPushbackLimit-10*time.Second)/time.Second)
)

// gridFloor rounds d down to the grid, or returns it when it is below the
// grid's first step.
func gridFloor(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d
	case d <= time.Second:
		return d.Truncate(time.Millisecond)
	case d <= 10*time.Second:
		return d.Truncate(10 * time.Millisecond)
	}
	return d.Truncate(time.Second)
}

func gridIndex(d time.Duration) (int, time.Duration) {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	switch {
	case ms < 1:
		return 0, time.Millisecond
	case ms <= 1_000:
		return int(ms) - 1, ms * time.Millisecond
	case ms <= 10_000:
		r := (ms + 9) / 10
		return gridFine + int(r-100) - 1, r * 10 * time.Millisecond
	default:
		r := (ms + 999) / 1000
		return gridMedium + int(r-10) - 1, r * time.Second
	}
}

type entry struct {
	err error
	md  metadata.MD
	d   time.Duration // the delay, rounded up to the grid, that md asks for
}

// abortMD tells a retrying client not to retry: the wait exceeds its
// deadline or the cap.
var abortMD = metadata.MD{PushbackKey: {"-1"}}

type rejecter struct {
	o     *options
	plain [nKinds]error         // no details
	never [nNotes][nKinds]error // details without RetryInfo: no retry can succeed
	grid  [nKinds - 1][]atomic.Pointer[entry]
	// noted holds the entries of callers whose key was ignored, by note:
	// rare, so filled on demand rather than laid out like grid.
	noted [nNotes - 1][nKinds - 1]notedGrid
}

type notedGrid struct {
	mu sync.RWMutex
	m  map[int]*entry
}

func newRejecter(o *options) *rejecter {
	r := &rejecter{o: o}
	for k := range nKinds {
		r.plain[k] = status.New(r.code(k), message(k)).Err()
		for n := range nNotes {
			r.never[n][k] = r.build(k, 0, n)
		}
	}
	for k := range r.grid {
		r.grid[k] = make([]atomic.Pointer[entry], gridSize)
	}
	return r
}

func (r *rejecter) code(k kind) codes.Code {
	if k == kindQuota {
		return r.o.quotaCode
	}
	return r.o.overCode
}

func message(k kind) string {
	switch k {
	case kindQuota:
		return msgQuota
	case kindOverload:
		return msgOverload
	}
	return msgStore
}

func reasonOf(k kind) string {
	switch k {
	case kindQuota:
		return ErrorReasonRateLimited
	case kindOverload:
		return ErrorReasonOverloaded
	}
	return ErrorReasonUnavailable
}

// build returns the rejection error of kind k with a retry delay of d, or
// without RetryInfo for d == 0, for a caller whose key was ignored as n
// says.
func (r *rejecter) build(k kind, d time.Duration, n keyNote) error {
	if !r.o.details {
		return r.plain[k]
	}
	info := &errdetails.ErrorInfo{Reason: reasonOf(k), Domain: r.o.domain}
	if n != noteNone {
		info.Metadata = map[string]string{MetadataKeyIgnored: noteNames[n]}
	}
	details := []protoadapt.MessageV1{info}
	if d > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	}
	if k == kindQuota {
		details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     "client",
			Description: "the caller's request quota is exhausted",
		}}})
	}
	st, err := status.New(r.code(k), message(k)).WithDetails(details...)
	if err != nil {
		return r.plain[k]
	}
	return st.Err()
}

// lookup returns the shared entry for a rejection of kind k (quota or
// overload) with a retry delay of d ≤ maxPushbackLimit, for a caller
// whose key was ignored as n says.
func (r *rejecter) lookup(k kind, d time.Duration, n keyNote) *entry {
	i, rounded := gridIndex(d)
	if n != noteNone {
		return r.lookupNoted(k, i, rounded, n)
	}
	slot := &r.grid[k][i]
	if e := slot.Load(); e != nil {
		return e
	}
	e := r.newEntry(k, rounded, n)
	// Racing builders make equal entries; whichever is stored last wins.
	slot.Store(e)
	return e
}

func (r *rejecter) newEntry(k kind, rounded time.Duration, n keyNote) *entry {
	return &entry{
		d:   rounded,
		err: r.build(k, rounded, n),
		md:  metadata.MD{PushbackKey: {strconv.FormatInt(int64(rounded/time.Millisecond), 10)}},
	}
}

func (r *rejecter) lookupNoted(k kind, i int, rounded time.Duration, n keyNote) *entry {
	g := &r.noted[n-1][k]
	g.mu.RLock()
	e := g.m[i]
	g.mu.RUnlock()
	if e != nil {
		return e
	}
	e = r.newEntry(k, rounded, n)
	g.mu.Lock()
	if old := g.m[i]; old != nil {
		e = old
	} else {
		if g.m == nil {
			g.m = map[int]*entry{}
		}
		g.m[i] = e
	}
	g.mu.Unlock()
	return e
}

// reject returns the error for a rejection and sets its pushback trailer
// on ctx's call, never header metadata, so the response stays
// Trailers-Only and grpc-go's retry honours the pushback.
func (r *rejecter) reject(ctx context.Context, reason Reason, retry time.Duration, n keyNote) error {
	var k kind
	switch reason {
	case ReasonQuota:
		k = kindQuota
	case ReasonOverload:
		k = kindOverload
	default:
		// The store failed: no retry delay to offer, and no pushback, so
		// clients back off by their own policy.
		return r.never[n][kindStore]
	}
	if retry <= 0 || retry == floodgate.Never {
		_ = grpc.SetTrailer(ctx, abortMD)
		return r.never[n][k]
	}
	if retry > r.o.maxPushback {
		// Too long for grpc-go to sleep through, but the caller still
		// learns when to come back: an hourly quota says when it resets.
		_ = grpc.SetTrailer(ctx, abortMD)
		return r.beyond(k, retry, n)
	}
	// The cap and the deadline are checked against the delay the trailer
	// will ask for, which the grid rounds up: grpc-go sleeps for the
	// pushback without checking the deadline.
	e := r.lookup(k, retry, n)
	if e.d > r.o.maxPushback {
		_ = grpc.SetTrailer(ctx, abortMD)
		return e.err
	}
	md := e.md
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < e.d {
		md = abortMD
	}
	// SetTrailer fails only outside a gRPC call (a direct call in a test);
	// the status is the rejection either way.
	_ = grpc.SetTrailer(ctx, md)
	return e.err
}

// beyond returns the rejection of kind k for a wait of d past the pushback
// cap, with RetryInfo stating d: from the shared grid up to
// maxPushbackLimit, and built for the call beyond it, rounded up to the
// second (only quotas refilled over hours wait that long).
func (r *rejecter) beyond(k kind, d time.Duration, n keyNote) error {
	if d <= maxPushbackLimit {
		return r.lookup(k, d, n).err
	}
	return r.build(k, (d + time.Second - 1).Truncate(time.Second), n)
}

// tapError returns the tap handle's rejection for a caller who may retry
// after d. The tap cannot send metadata, so there is no pushback trailer.
func (r *rejecter) tapError(d time.Duration, n keyNote) error {
	if d <= 0 || d == floodgate.Never {
		return r.never[n][kindOverload]
	}
	return r.beyond(kindOverload, d, n)
}
