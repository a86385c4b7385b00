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

// pushbackKey is the trailer through which a rejection tells grpc-go's
// retrying client how many milliseconds to wait before its next attempt,
// or -1 not to retry (gRFC A6).
const pushbackKey = "grpc-retry-pushback-ms"

// ErrorInfo reasons of rejections (Reason.ErrorReason).
const (
	errorReasonRateLimited     = "RATE_LIMITED"
	errorReasonOverloaded      = "OVERLOADED"
	errorReasonUnavailable     = "LIMITER_UNAVAILABLE"
	errorReasonInDebt          = "IN_DEBT"
	errorReasonInvalidEstimate = "INVALID_COST_ESTIMATE"
)

// ErrorInfo metadata keys of rejections (Rejection).
const (
	metadataKeyUnit    = "quota_unit"
	metadataKeyIgnored = "api_key_ignored"
)

// A Rejection is the error a call is turned away with, by the interceptors,
// the tap handle, Admit, Limit or Admission.Send: its gRPC status
// (GRPCStatus, which grpc-go sends as it is, with its details: ErrorInfo
// in the domain of WithDomain, RetryInfo, and QuotaFailure or BadRequest),
// and what that status says, for other transports and observers to read
// without parsing it. A remote client finds Unit in the ErrorInfo's
// metadata under "quota_unit", and KeyIgnored under "api_key_ignored".
// Rejections are shared, one for each reason, retry delay, unit and
// ignored key: read one, never modify it; find one with errors.As, never
// compare by identity.
type Rejection struct {
	// Reason is why: ReasonQuota, ReasonGate, ReasonOverload,
	// ReasonStoreError (with WithFailClosed), ReasonDebt or
	// ReasonInvalidEstimate.
	Reason Reason
	// Code is the status code (WithCodes; INVALID_ARGUMENT for an invalid
	// estimate).
	Code codes.Code
	// RetryAfter is the retry delay the status states in its RetryInfo,
	// rounded up onto the pushback grid (WithMaxPushback); 0 when it states
	// none: the store failed, the estimate was invalid, or no wait will do.
	RetryAfter time.Duration
	// Unit is the unit of the metered quota (tenant.Meter) that decided,
	// such as "tokens"; "" for the call limit.
	Unit string
	// KeyIgnored says why the caller's API key header was ignored, which
	// made it anonymous and judged by its address: "repeated" (the header
	// had more than one value, as metadata.AppendToOutgoingContext makes
	// when a key is already set; the Limiter does not guess which one is
	// the caller's) or "too_long" (longer than any API key); "" when it was
	// not.
	KeyIgnored string

	st *status.Status
	md metadata.MD // the pushback trailer; nil for none
}

// Error returns the status's error text, as status.Error's does.
func (r *Rejection) Error() string {
	return "rpc error: code = " + r.st.Code().String() + " desc = " + r.st.Message()
}

// GRPCStatus returns the rejection's status, details included.
func (r *Rejection) GRPCStatus() *status.Status { return r.st }

var _ interface{ GRPCStatus() *status.Status } = (*Rejection)(nil)

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

type entryKey struct {
	k Reason // a rejection's: ReasonQuota, ReasonGate, ReasonOverload, ReasonStoreError, ReasonDebt or ReasonInvalidEstimate
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
var abortMD = metadata.MD{pushbackKey: {"-1"}}

// A rejecter builds rejections and keeps them, so that a rejection costs
// no proto marshalling and allocates nothing.
type rejecter struct {
	o       *options
	entries *lru.Cache[entryKey, *Rejection]
}

func newRejecter(o *options) *rejecter {
	return &rejecter{o: o, entries: newLRU[entryKey, *Rejection](entryCacheSize)}
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
	case ReasonOverload, ReasonGate:
		return msgOverload
	case ReasonDebt:
		return msgDebt
	case ReasonInvalidEstimate:
		return msgEstimate
	}
	return msgStore
}

// ErrorReason returns the ErrorInfo reason of a rejection for r:
// "RATE_LIMITED" (ReasonQuota), "OVERLOADED" (ReasonGate, ReasonOverload),
// "LIMITER_UNAVAILABLE" (ReasonStoreError), "IN_DEBT" (ReasonDebt),
// "INVALID_COST_ESTIMATE" (ReasonInvalidEstimate), and "" for a reason
// that rejects nothing.
func (r Reason) ErrorReason() string {
	switch r {
	case ReasonQuota:
		return errorReasonRateLimited
	case ReasonOverload, ReasonGate:
		return errorReasonOverloaded
	case ReasonStoreError:
		return errorReasonUnavailable
	case ReasonDebt:
		return errorReasonInDebt
	case ReasonInvalidEstimate:
		return errorReasonInvalidEstimate
	}
	return ""
}

// build returns the status of key's rejection: for reason key.k with a
// retry delay of key.d, or without RetryInfo for 0, for a caller whose key
// was ignored as key.n says, by a metered quota in key.unit or else by the
// call limit.
func (r *rejecter) build(key entryKey) *status.Status {
	k, d, n := key.k, key.d, key.n
	st := status.New(r.code(k), message(k))
	if !r.o.details {
		return st
	}
	info := &errdetails.ErrorInfo{Reason: k.ErrorReason(), Domain: r.o.domain}
	if n != noteNone || key.unit != "" {
		info.Metadata = map[string]string{}
		if n != noteNone {
			info.Metadata[metadataKeyIgnored] = noteNames[n]
		}
		if key.unit != "" {
			info.Metadata[metadataKeyUnit] = key.unit
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
	return st
}

// lookup returns the shared rejection of a call rejected for reason k,
// whose caller may retry after d (none when d ≤ 0 or Never), and whose key
// was ignored as n says; m is the call's metered quota, or nil, for the
// rejections it decided (debt, quota and overload, whose unit they name,
// and an invalid estimate). A store error offers no retry delay and no
// pushback, so that clients back off by their own policy; an invalid
// estimate neither, and a pushback that says not to retry.
func (r *rejecter) lookup(k Reason, d time.Duration, n keyNote, m *tenant.Meter) *Rejection {
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
	st := r.build(key)
	e := &Rejection{Reason: k, Code: st.Code(), RetryAfter: key.d, Unit: key.unit, KeyIgnored: noteNames[n], st: st}
	switch {
	case k == ReasonStoreError:
	case key.d == 0:
		e.md = abortMD
	default:
		e.md = metadata.MD{pushbackKey: {strconv.FormatInt(int64(key.d/time.Millisecond), 10)}}
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
func (r *rejecter) pushback(ctx context.Context, e *Rejection) metadata.MD {
	if dl, ok := ctx.Deadline(); e.md != nil && (e.RetryAfter > r.o.maxPushback || ok && time.Until(dl) < e.RetryAfter) {
		return abortMD
	}
	return e.md
}
