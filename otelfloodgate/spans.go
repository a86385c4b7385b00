package otelfloodgate

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-go/floodgate/middleware"
)

// Span event names and attribute keys.
const (
	// EventRejected names the event of a call the Limiter rejected, or, in
	// dry-run mode, would have.
	EventRejected = "floodgate.rejected"
	// EventWaited names the event of an admitted call that waited for a
	// slot of the overload controller.
	EventWaited = "floodgate.waited"

	// AttrReason is the rejection's reason: quota, gate, overload,
	// store_error, and a metered quota's debt and invalid_estimate.
	AttrReason = attribute.Key("floodgate.reason")
	// AttrTier is the caller's tier, absent when it has none.
	AttrTier = attribute.Key("floodgate.tier")
	// AttrTenant is the caller's tenant ID, absent for an anonymous caller.
	AttrTenant = attribute.Key("floodgate.tenant")
	// AttrRetryDelay is the retry delay the rejection states, in seconds,
	// absent when it states none.
	AttrRetryDelay = attribute.Key("floodgate.retry_delay")
	// AttrCause is why the overload controller shed the call: queue_full,
	// displaced, wait_timeout, deadline; absent for other rejections.
	AttrCause = attribute.Key("floodgate.overload.cause")
	// AttrDryRun is true on a dry-run rejection: the call runs.
	AttrDryRun = attribute.Key("floodgate.dry_run")
	// AttrWait is how long the call waited for a slot, in seconds.
	AttrWait = attribute.Key("floodgate.wait")
)

// spanEvent adds e's event to the span of e's call when the span records:
// a rejection, or the wait of an admitted call that waited. Nothing else,
// and nothing without a recording span, allocates.
func spanEvent(e middleware.Event) {
	rejected := !e.Allowed // in dry-run mode too: the event says so
	if e.Context == nil || !rejected && e.Wait <= 0 {
		return
	}
	span := trace.SpanFromContext(e.Context)
	if !span.IsRecording() {
		return
	}
	if !rejected {
		span.AddEvent(EventWaited, trace.WithAttributes(AttrWait.Float64(e.Wait.Seconds())))
		return
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, AttrReason.String(e.Reason.String()))
	if e.Tier != "" {
		attrs = append(attrs, AttrTier.String(e.Tier))
	}
	if e.Tenant != "" {
		attrs = append(attrs, AttrTenant.String(e.Tenant))
	}
	if e.Rejection != nil && e.Rejection.RetryAfter > 0 {
		attrs = append(attrs, AttrRetryDelay.Float64(e.Rejection.RetryAfter.Seconds()))
	}
	if e.Shed {
		attrs = append(attrs, AttrCause.String(e.Cause.String()))
	}
	if e.DryRun {
		attrs = append(attrs, AttrDryRun.Bool(true))
	}
	span.AddEvent(EventRejected, trace.WithAttributes(attrs...))
}
