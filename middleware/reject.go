package middleware

import (
	"context"
	"strconv"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

// PushbackKey is the trailer through which a rejection tells grpc-go's
// retrying client how many milliseconds to wait before its next attempt,
// or -1 not to retry (gRFC A6).
const PushbackKey = "grpc-retry-pushback-ms"

// ErrorInfo reasons of rejections, in the domain set by WithDomain.
const (
	// ErrorReasonRateLimited: the caller is over its quota.
	ErrorReasonRateLimited = "RATE_LIMITED"
	// ErrorReasonOverloaded: the server is overloaded (ReasonOverload): the
	// overload controller shed the call, or the tap handle turned it away,
	// or the caller is over its quota while the CPU gate scales limits
	// down.
	ErrorReasonOverloaded = "OVERLOADED"
	// ErrorReasonUnavailable: the store could not decide, and the Limiter
	// fails closed (WithFailClosed).
	ErrorReasonUnavailable = "LIMITER_UNAVAILABLE"
	// ErrorReasonInDebt: the caller's metered quota is in debt
	// (ReasonDebt): its calls cost more than they reserved. RetryInfo
	// says when the debt is repaid and the call's estimate is back.
	ErrorReasonInDebt = "IN_DEBT"
	// ErrorReasonInvalidEstimate: the call's estimate header was not a
	// whole number within the quota's burst (ReasonInvalidEstimate); a
	// BadRequest detail names the header and the values it may hold.
	ErrorReasonInvalidEstimate = "INVALID_COST_ESTIMATE"
)

// MetadataKeyUnit is the ErrorInfo metadata key of a rejection by a
// metered quota (tenant.Meter): its value is the quota's unit, such as
// "tokens", so that a client can tell it from a rejection by its call
// limit, which carries no unit.
const MetadataKeyUnit = "quota_unit"

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
	msgDebt     = "quota in debt"
	msgEstimate = "invalid cost estimate"
)

// Retry delays are rounded up onto a grid, so that each rejection status
// with its details is built once and then shared: milliseconds up to 1 s,
// 10 ms up to 10 s, then seconds. Rounding up never asks a client to come
// back before its tokens have.
func gridCeil(d time.Duration) time.Duration {
	switch {
	case d <= time.Millisecond:
		return time.Millisecond
	case d <= time.Second:
		return ceil(d, time.Millisecond)
	case d <= 10*time.Second:
		return ceil(d, 10*time.Millisecond)
	}
	return ceil(d, time.Second)
}

func ceil(d, unit time.Duration) time.Duration { return (d + unit - 1) / unit * unit }

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

// An entry is a shared rejection: its status error and the pushback
// trailer asking for d, or telling the client not to retry when d is 0, or
// none for a failed store.
type entry struct {
	err error
	md  metadata.MD
	d   time.Duration
}

type entryKey struct {
	k Reason // a rejection's: ReasonQuota, ReasonOverload, ReasonStoreError, ReasonDebt or ReasonInvalidEstimate
	n keyNote
	d time.Duration // on the grid, or 0 for no retry delay
	// For a metered quota's rejection, its unit; and for an invalid
	// estimate, the header and the largest estimate it may state.
	unit, header string
	max          int
}

// entryCacheSize bounds the rejections kept built: distinct retry delays,
// on the grid, in use at once.
const entryCacheSize = 4096

// abortMD tells a retrying client not to retry: the wait exceeds its
// deadline or the cap, or no wait will do.
var abortMD = metadata.MD{PushbackKey: {"-1"}}

// A rejecter builds rejections and keeps them, so that a rejection costs
// no proto marshalling and allocates nothing.
type rejecter struct {
	o       *options
	entries *lru.Cache[entryKey, *entry]
}

func newRejecter(o *options) *rejecter {
	return &rejecter{o: o, entries: newLRU[entryKey, *entry](entryCacheSize)}
}

func (r *rejecter) code(k Reason) codes.Code {
	switch k {
	case ReasonQuota, ReasonDebt:
		return r.o.quotaCode
	case ReasonInvalidEstimate:
		return codes.InvalidArgument
	}
	return r.o.overCode
}

func message(k Reason) string {
	switch k {
	case ReasonQuota:
		return msgQuota
	case ReasonOverload:
		return msgOverload
	case ReasonDebt:
		return msgDebt
	case ReasonInvalidEstimate:
		return msgEstimate
	}
	return msgStore
}

func reasonOf(k Reason) string {
	switch k {
	case ReasonQuota:
		return ErrorReasonRateLimited
	case ReasonOverload:
		return ErrorReasonOverloaded
	case ReasonDebt:
		return ErrorReasonInDebt
	case ReasonInvalidEstimate:
		return ErrorReasonInvalidEstimate
	}
	return ErrorReasonUnavailable
}

// build returns the rejection error of key: for reason key.k with a retry
// delay of key.d, or without RetryInfo for 0, for a caller whose key was
// ignored as key.n says, by a metered quota in key.unit or else by the
// call limit.
func (r *rejecter) build(key entryKey) error {
	k, d, n := key.k, key.d, key.n
	st := status.New(r.code(k), message(k))
	if !r.o.details {
		return st.Err()
	}
	info := &errdetails.ErrorInfo{Reason: reasonOf(k), Domain: r.o.domain}
	if n != noteNone || key.unit != "" {
		info.Metadata = map[string]string{}
		if n != noteNone {
			info.Metadata[MetadataKeyIgnored] = noteNames[n]
		}
		if key.unit != "" {
			info.Metadata[MetadataKeyUnit] = key.unit
		}
	}
	details := []protoadapt.MessageV1{info}
	if d > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	}
	quota := "request"
	if key.unit != "" {
		quota = key.unit
	}
	switch k {
	case ReasonQuota:
		details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     "client",
			Description: "the caller's " + quota + " quota is exhausted",
		}}})
	case ReasonDebt:
		details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     "client",
			Description: "the caller's " + quota + " quota is in debt: its calls cost more than they reserved",
		}}})
	case ReasonInvalidEstimate:
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field:       key.header,
			Description: "must be a whole number of " + quota + " from 0 to " + strconv.Itoa(key.max),
		}}})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// lookup returns the shared rejection of a call rejected for reason k,
// whose caller may retry after d (none when d ≤ 0 or Never), and whose key
// was ignored as n says; m is the call's metered quota, or nil, for the
// rejections it decided (debt, quota and overload, whose unit they name,
// and an invalid estimate). A store error offers no retry delay and no
// pushback, so that clients back off by their own policy; an invalid
// estimate neither, and a pushback that says not to retry.
func (r *rejecter) lookup(k Reason, d time.Duration, n keyNote, m *tenant.Meter) *entry {
	key := entryKey{k: k, n: n}
	if d > 0 && d != floodgate.Never && k != ReasonStoreError && k != ReasonInvalidEstimate {
		key.d = gridCeil(d)
	}
	if m != nil && k != ReasonStoreError {
		key.unit = m.Unit
		if k == ReasonInvalidEstimate {
			key.header, key.max = m.EstimateHeader, m.Limit.Burst
		}
	}
	if e, ok := r.entries.Get(key); ok {
		return e
	}
	// Racing builders make equal entries; whichever is added last stays.
	e := &entry{d: key.d, err: r.build(key)}
	switch {
	case k == ReasonStoreError:
	case key.d == 0:
		e.md = abortMD
	default:
		e.md = metadata.MD{PushbackKey: {strconv.FormatInt(int64(key.d/time.Millisecond), 10)}}
	}
	r.entries.Add(key, e)
	return e
}

// pushback returns the trailer a gRPC rejection sends with e, or nil for
// none. The cap and the deadline are checked against the delay the trailer
// asks for, which the grid rounds up: grpc-go sleeps for the pushback
// without checking the deadline. A wait past the cap is too long for
// grpc-go to sleep through, but RetryInfo still tells the caller when to
// come back: an hourly quota says when it resets.
func (r *rejecter) pushback(ctx context.Context, e *entry) metadata.MD {
	if dl, ok := ctx.Deadline(); e.md != nil && (e.d > r.o.maxPushback || ok && time.Until(dl) < e.d) {
		return abortMD
	}
	return e.md
}
