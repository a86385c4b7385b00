package middleware_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// fakeStream is a server stream whose messages go nowhere and come from
// nowhere, as many as are asked for.
type fakeStream struct {
	ctx            context.Context
	sent, received int
}

func (s *fakeStream) Context() context.Context     { return s.ctx }
func (s *fakeStream) SendMsg(any) error            { s.sent++; return nil }
func (s *fakeStream) RecvMsg(any) error            { s.received++; return nil }
func (s *fakeStream) SetHeader(metadata.MD) error  { return nil }
func (s *fakeStream) SendHeader(metadata.MD) error { return nil }
func (s *fakeStream) SetTrailer(metadata.MD)       {}

// openStream runs handler as acme's stream to llmStream through the
// stream interceptor, and returns its fake stream, its transport (for the
// trailer) and the interceptor's error.
func openStream(l *middleware.Limiter, handler grpc.StreamHandler) (*fakeStream, *transportStream, error) {
	ctx, ts := acmeCall.context(llmStream)
	fs := &fakeStream{ctx: ctx}
	err := l.StreamServerInterceptor()(nil, fs, &grpc.StreamServerInfo{FullMethod: llmStream, IsServerStream: true}, handler)
	return fs, ts, err
}

// costOf says each message costs what it holds, for WithActualCost.
func costOf(_ context.Context, _ string, msg any) (int64, bool) {
	n, ok := msg.(int64)
	return n, ok
}

// sendForever is a stream that sends messages of cost each until a send
// fails, and returns that error.
func sendForever(cost int64, report bool) grpc.StreamHandler {
	return func(_ any, ss grpc.ServerStream) error {
		for {
			if err := ss.SendMsg(cost); err != nil {
				return err
			}
			if report {
				middleware.ReportCost(ss.Context(), cost)
			}
		}
	}
}

// TestStreamChunks: a stream that never ends reserves its estimate, then
// chunks as its messages' costs use them up, and ends with the rejection
// at the first chunk the bucket cannot cover, having sent no message
// beyond what it reserved.
func TestStreamChunks(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute, middleware.WithActualCost(costOf))
	fs, ts, err := openStream(f.l, sendForever(1000, false))
	st, det := detailsOf(t, err)
	if st.Code() != codes.ResourceExhausted || det.info.GetReason() != middleware.ReasonQuota.ErrorReason() || det.info.Metadata["quota_unit"] != "tokens" {
		t.Fatalf("stream ended with %v, %v; want RESOURCE_EXHAUSTED in tokens", err, det.info)
	}
	// The chunk of 4,000 at 100,000 a minute.
	if det.retry == nil || det.retry.RetryDelay.AsDuration() != 2400*time.Millisecond {
		t.Errorf("RetryInfo = %v, want 2.4s", det.retry)
	}
	if got := ts.trailer.Get(pushbackKey); !cmp.Equal(got, []string{"2400"}) {
		t.Errorf("pushback = %q, want 2400", got)
	}
	if got, want := fs.sent, 20; got != want { // the burst of 20,000, 1,000 a message
		t.Errorf("the stream sent %d messages, want %d", got, want)
	}
	if got := f.tokens(); got != 0 {
		t.Errorf("bucket holds %v after the stream, want 0", got)
	}
	// The refused chunk carries the bucket's answer; the settle, at what
	// the stream reserved, made no store call and carries none.
	lim, id := f.meter.Limit, f.meter.ID
	want := []middleware.Event{
		{Decision: middleware.Decision{Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonAdmitted, Allowed: true, Reserved: 4000,
			Metered: floodgate.Result{Allowed: true, Limit: lim, Remaining: 16000, ResetAfter: 2400 * time.Millisecond}},
			Method: llmStream, Unit: "tokens", MeterID: id},
		{Decision: middleware.Decision{Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonQuota, Reserved: 20000,
			Metered: floodgate.Result{Limit: lim, RetryAfter: 2400 * time.Millisecond, ResetAfter: 12 * time.Second}},
			Method: llmStream, Unit: "tokens", MeterID: id,
			Rejection: &middleware.Rejection{Reason: middleware.ReasonQuota, Code: codes.ResourceExhausted, RetryAfter: 2400 * time.Millisecond, Unit: "tokens"}},
		{Decision: middleware.Decision{Tenant: "acme", Subject: "t:acme", Reason: middleware.ReasonSettled, Allowed: true, Reserved: 20000},
			Method: llmStream, Unit: "tokens", Settled: 20000, MeterID: id},
	}
	if diff := cmp.Diff(want, f.events.take(), eventOpts); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got, want := f.tally.counts(), (counts{Admitted: 1, Quota: 1, Settled: 1}); got != want {
		t.Errorf("counts() = %+v, want %+v", got, want)
	}
}

// TestStreamReportsAfterSending: a handler that reports each message's
// cost after sending it runs past its reservations by at most the message
// it reported last, charged into debt, which refuses the next stream.
func TestStreamReportsAfterSending(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	fs, _, err := openStream(f.l, sendForever(1500, true))
	if st, _ := detailsOf(t, err); st.Code() != codes.ResourceExhausted {
		t.Fatalf("stream ended with %v, want RESOURCE_EXHAUSTED", err)
	}
	// 20,000 reserved; the 14th message reported 21,000.
	if got, want := fs.sent, 14; got != want {
		t.Errorf("the stream sent %d messages, want %d", got, want)
	}
	if got, want := f.tokens(), -1000.0; got != want {
		t.Errorf("bucket holds %v, want %v", got, want)
	}
	_, _, err = openStream(f.l, sendForever(1500, true))
	if _, det := detailsOf(t, err); det.info.GetReason() != middleware.ReasonDebt.ErrorReason() {
		t.Errorf("the next stream: %v, want IN_DEBT", err)
	}
}

// TestStreamReceives: a stream that reports the cost of what it receives
// is checked before each receive.
func TestStreamReceives(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	fs, _, err := openStream(f.l, func(_ any, ss grpc.ServerStream) error {
		for {
			if err := ss.RecvMsg(nil); err != nil {
				return err
			}
			middleware.ReportCost(ss.Context(), 1000)
		}
	})
	if st, _ := detailsOf(t, err); st.Code() != codes.ResourceExhausted {
		t.Fatalf("stream ended with %v, want RESOURCE_EXHAUSTED", err)
	}
	if got, want := fs.received, 21; got != want {
		t.Errorf("the stream received %d messages, want %d", got, want)
	}
	if got, want := f.tokens(), -1000.0; got != want {
		t.Errorf("bucket holds %v, want %v", got, want)
	}
}

// TestStreamWindow: a client that reopens its stream whenever it ends,
// after the wait the rejection states, consumes at most the quota, one
// burst and one chunk in any 60 s, and gets most of the quota.
func TestStreamWindow(t *testing.T) {
	f := newMeterFixture(t, tokensPerMinute)
	type sent struct {
		at   time.Duration
		cost int64
	}
	var log []sent
	start := f.clock.Now()
	const run = 10 * time.Minute
	handler := func(_ any, ss grpc.ServerStream) error {
		for f.clock.Now().Sub(start) < run {
			if err := ss.SendMsg(nil); err != nil {
				return err
			}
			middleware.ReportCost(ss.Context(), 1000)
			log = append(log, sent{f.clock.Now().Sub(start), 1000})
			f.clock.Advance(100 * time.Millisecond) // 10,000 a second: 6 × the quota
		}
		return nil
	}
	streams := 0
	for f.clock.Now().Sub(start) < run {
		streams++
		_, _, err := openStream(f.l, handler)
		if err == nil {
			break
		}
		_, det := detailsOf(t, err)
		if det.retry == nil {
			t.Fatalf("stream %d ended with %v, without a retry delay", streams, err)
		}
		f.clock.Advance(det.retry.RetryDelay.AsDuration())
	}
	const quota, burst, chunk = 100000, 20000, 4000
	var total, worst int64
	for i, s := range log {
		var window int64
		for _, r := range log[i:] {
			if r.at-s.at >= time.Minute {
				break
			}
			window += r.cost
		}
		worst = max(worst, window)
		total += s.cost
	}
	if worst > quota+burst+chunk {
		t.Errorf("%d tokens in the worst minute, want at most %d", worst, quota+burst+chunk)
	}
	if min := int64(0.9 * quota * 10); total < min {
		t.Errorf("%d tokens in 10 minutes, want at least %d (90%% of the quota)", total, min)
	}
	if streams < 2 {
		t.Errorf("%d streams, want the stream stopped and reopened", streams)
	}
}

// TestStreamRevokedKey: a reload that revokes the caller's key, with no
// anonymous policy, ends its stream at the next chunk, as a new call
// would be refused, rather than let it run on unmetered.
func TestStreamRevokedKey(t *testing.T) {
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	reg.Set(meteredTable(t, tokensPerMinute))
	revoked, err := tenant.Compile(&tenant.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := keyed.New(keyed.WithClock(newClock()))
	if err != nil {
		t.Fatal(err)
	}
	l, err := middleware.New(store, reg)
	if err != nil {
		t.Fatal(err)
	}
	fs, _, err := openStream(l, func(_ any, ss grpc.ServerStream) error {
		for i := range 1000 { // 1,000,000 tokens: far past any reservation
			if i == 2 {
				reg.Set(revoked)
			}
			if err := ss.SendMsg(nil); err != nil {
				return err
			}
			middleware.ReportCost(ss.Context(), 1000)
		}
		return nil
	})
	st, det := detailsOf(t, err)
	if st.Code() != codes.ResourceExhausted || det.info.GetReason() != middleware.ReasonQuota.ErrorReason() || det.retry != nil {
		t.Fatalf("stream ended with %v, %v; want RESOURCE_EXHAUSTED without a retry delay", err, det.retry)
	}
	// The estimate of 4,000 covers five messages of 1,000 reported after
	// sending; the sixth needs a chunk.
	if got, want := fs.sent, 5; got != want {
		t.Errorf("the stream sent %d messages, want %d", got, want)
	}
}

// ctxReserver is a keyed.Map whose reservations honour their context, as a
// networked store's do: a done context fails them with its error.
type ctxReserver struct{ *keyed.Map }

func (s ctxReserver) ReserveN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Reservation, error) {
	if err := ctx.Err(); err != nil {
		return floodgate.Reservation{}, err
	}
	return s.Map.ReserveN(ctx, key, lim, n)
}

// TestStreamCancelledMidChunk: a client that cancels its stream while a
// chunk is due ends the stream with CANCELED, whatever the fail policy,
// and the store that gave up on the dead context is no store error.
func TestStreamCancelledMidChunk(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []middleware.Option
	}{
		{"fail open", nil},
		{"fail closed", []middleware.Option{middleware.WithFailClosed(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			store, err := keyed.New(keyed.WithClock(c))
			if err != nil {
				t.Fatal(err)
			}
			ev, ty := &eventLog{}, &tally{}
			l, err := middleware.New(ctxReserver{store}, middleware.Static(meteredTable(t, tokensPerMinute)),
				append([]middleware.Option{middleware.WithClock(c), ty.option(ev.add), middleware.WithActualCost(costOf)}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, _ := acmeCall.context(llmStream)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			fs := &fakeStream{ctx: ctx}
			err = l.StreamServerInterceptor()(nil, fs, &grpc.StreamServerInfo{FullMethod: llmStream, IsServerStream: true}, func(_ any, ss grpc.ServerStream) error {
				for i := range 100 {
					if i == 2 {
						cancel() // within the estimate of 4,000: the next chunk is due at the fifth message
					}
					if err := ss.SendMsg(int64(1000)); err != nil {
						return err
					}
				}
				return nil
			})
			if got, want := status.Code(err), codes.Canceled; got != want {
				t.Fatalf("stream ended with %v, want %v", err, want)
			}
			if got, want := fs.sent, 4; got != want {
				t.Errorf("the stream sent %d messages, want %d", got, want)
			}
			if got, want := ty.counts(), (counts{Admitted: 1, Settled: 1}); got != want {
				t.Errorf("counts() = %+v, want %+v", got, want)
			}
			for _, e := range ev.take() {
				if e.Reason == middleware.ReasonStoreError {
					t.Errorf("event %+v, want no store error", e)
				}
			}
		})
	}
}

// TestStreamChunkAfterReload: the first chunk after a reload that changed
// the chunk's size reserves the new size.
func TestStreamChunkAfterReload(t *testing.T) {
	reg, err := tenant.New(tenant.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	reg.Set(meteredTable(t, tokensPerMinute))
	small := tokensPerMinute
	small.Chunk = 1000
	c := newClock()
	store, err := keyed.New(keyed.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	l, err := middleware.New(store, reg, middleware.WithClock(c), middleware.WithActualCost(costOf))
	if err != nil {
		t.Fatal(err)
	}
	acme, _ := meteredTable(t, tokensPerMinute).TenantByID("acme")
	mt := acme.Rule(llmStream).Meter
	var left float64
	_, _, err = openStream(l, func(_ any, ss grpc.ServerStream) error {
		for i := range 5 { // the estimate of 4,000 covers four
			if i == 2 {
				reg.Set(meteredTable(t, small))
			}
			if err := ss.SendMsg(int64(1000)); err != nil {
				return err
			}
		}
		left = store.Tokens("t:acme:"+mt.ID, mt.Limit)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := left, 15000.0; got != want { // 20,000 less 4,000 and a chunk of 1,000
		t.Errorf("bucket holds %v after the fifth message, want %v", got, want)
	}
}
