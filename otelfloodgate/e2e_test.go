package otelfloodgate

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// decision is the attributes of one floodgate.decisions series of
// methodGet decided in the interceptor.
func decision(outcome, reason, code, source, tier, stage string) string {
	return "code=" + code + ",method=" + methodGet + ",outcome=" + outcome + ",reason=" + reason +
		",source=" + source + ",stage=" + stage + ",tier=" + tier
}

// TestDecisionsAndSpanEvents drives a real server through an admitted call,
// a quota rejection, calls that wait for the overload controller's slot
// and a tap rejection, then reads the metrics back with the SDK's manual
// reader and the span events with its span recorder.
func TestDecisionsAndSpanEvents(t *testing.T) {
	f := newFixture(t, time.Hour)

	// The slot held and the queue full (before any call completes, the
	// controller lets 4 calls wait for a slot): the next call is turned away
	// at the tap, before its request is read. The queued calls wait.
	var blocked []<-chan error
	blocked = append(blocked, f.async(goldKey, true))
	waitFor(t, func() bool { return f.ctrl.Snapshot().Inflight == 1 }, "a call to hold the slot")
	queueCap := f.ctrl.Snapshot().QueueCap
	if queueCap != 4 {
		t.Fatalf("queue cap %d before any call completed, want 4", queueCap)
	}
	for range queueCap {
		blocked = append(blocked, f.async(goldKey, true))
	}
	waitFor(t, func() bool { return f.ctrl.Snapshot().Queued == queueCap }, "the queue to fill")
	if err := f.call(goldKey, false); status.Code(err) != codes.Unavailable {
		t.Fatalf("call past the queue: %v, want UNAVAILABLE from the tap", err)
	}
	for range blocked {
		f.release <- struct{}{}
	}
	for _, ch := range blocked {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}

	// Admitted at once: counted, and no span event.
	if err := f.call(goldKey, false); err != nil {
		t.Fatal(err)
	}
	// The free tier holds one call: the second is over quota.
	if err := f.call(freeKey, false); err != nil {
		t.Fatal(err)
	}
	if err := f.call(freeKey, false); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second free call: %v, want RESOURCE_EXHAUSTED", err)
	}
	// One call holds the only slot; the next waits for it.
	held := f.async(goldKey, true)
	waitFor(t, func() bool { return f.ctrl.Snapshot().Inflight == 1 }, "the first call to hold the slot")
	waiting := f.async(goldKey, false)
	waitFor(t, func() bool { return f.ctrl.Snapshot().Queued == 1 }, "the second call to queue")
	f.release <- struct{}{}
	for _, ch := range []<-chan error{held, waiting} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	// Every call but the tap's reached the stats handler: one span each.
	calls := 1 + 2 + 2 + len(blocked)
	waitFor(t, func() bool { return len(f.spans.Ended()) == calls }, "every server span to end")
	spans := f.spans.Ended()

	m := collect(t, f.reader)
	gold := 1 + 2 + len(blocked)
	want := map[string]int64{
		decision("admitted", "admitted", "OK", "memory", "gold", "interceptor"):             int64(gold),
		decision("admitted", "admitted", "OK", "memory", "free", "interceptor"):             1,
		decision("rejected", "quota", "ResourceExhausted", "memory", "free", "interceptor"): 1,
		// The tap knows acme's key from the calls before: gold.
		decision("rejected", "overload", "Unavailable", LabelNone, "gold", "tap"): 1,
	}
	if diff := cmp.Diff(want, points(t, m["floodgate.decisions"])); diff != "" {
		t.Errorf("floodgate.decisions (-want +got):\n%s", diff)
	}
	waited := int64(1 + queueCap)
	for name, want := range map[string]map[string]int64{
		"floodgate.tap.rejections":    {"": 1},
		"floodgate.overload.shed":     {"cause=queue_full": 0, "cause=displaced": 0, "cause=wait_timeout": 0, "cause=deadline": 0, "cause=tap": 1},
		"floodgate.overload.admitted": {"waited=false": int64(gold+1) - waited, "waited=true": waited},
		"floodgate.overload.state":    {"state=open": 0, "state=shedding": 1},
		"floodgate.overload.inflight": {"": 0},
		"floodgate.keyed.keys":        {"": 1}, // initech's: an unlimited tier keeps no bucket
	} {
		if diff := cmp.Diff(want, points(t, m[name])); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}

	rejected := spanEvents(spans, EventRejected)
	wantRejected := []map[attribute.Key]attribute.Value{{
		AttrReason:     attribute.StringValue("quota"),
		AttrTier:       attribute.StringValue("free"),
		AttrTenant:     attribute.StringValue("initech"),
		AttrRetryDelay: attribute.Float64Value(1000), // a token per 1000 s, from empty
	}}
	if diff := cmp.Diff(wantRejected, rejected, cmp.AllowUnexported(attribute.Value{})); diff != "" {
		t.Errorf("%s events (-want +got):\n%s", EventRejected, diff)
	}
	waits := spanEvents(spans, EventWaited)
	if len(waits) != int(waited) {
		t.Errorf("%d %s events, want %d: %v", len(waits), EventWaited, waited, waits)
	}
	for _, w := range waits {
		if w[AttrWait].AsFloat64() <= 0 {
			t.Errorf("%s event %v, want a positive wait", EventWaited, w)
		}
	}
}

// TestShedSpanEvent: a call the overload controller sheds after waiting
// its longest wait gets an event with the controller's cause and retry
// delay, and counts as an overload rejection.
func TestShedSpanEvent(t *testing.T) {
	f := newFixture(t, time.Millisecond)
	held := f.async(goldKey, true)
	waitFor(t, func() bool { return f.ctrl.Snapshot().Inflight == 1 }, "the first call to hold the slot")
	if err := f.call(goldKey, false); status.Code(err) != codes.Unavailable {
		t.Fatalf("call behind the held slot: %v, want UNAVAILABLE", err)
	}
	f.release <- struct{}{}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(f.spans.Ended()) == 2 }, "both server spans to end")

	want := []map[attribute.Key]attribute.Value{{
		AttrReason:     attribute.StringValue("overload"),
		AttrTier:       attribute.StringValue("gold"),
		AttrTenant:     attribute.StringValue("acme"),
		AttrRetryDelay: attribute.Float64Value(f.ctrl.RetryAfter().Seconds()),
		AttrCause:      attribute.StringValue("wait_timeout"),
	}}
	if diff := cmp.Diff(want, spanEvents(f.spans.Ended(), EventRejected), cmp.AllowUnexported(attribute.Value{})); diff != "" {
		t.Errorf("%s events (-want +got):\n%s", EventRejected, diff)
	}
	m := collect(t, f.reader)
	wantDecisions := map[string]int64{
		decision("admitted", "admitted", "OK", "memory", "gold", "interceptor"):          1,
		decision("rejected", "overload", "Unavailable", "memory", "gold", "interceptor"): 1,
	}
	if diff := cmp.Diff(wantDecisions, points(t, m["floodgate.decisions"])); diff != "" {
		t.Errorf("floodgate.decisions (-want +got):\n%s", diff)
	}
	if got := points(t, m["floodgate.overload.shed"])["cause=wait_timeout"]; got != 1 {
		t.Errorf("floodgate.overload.shed{cause=wait_timeout} = %d, want 1", got)
	}
}
