package main

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	completionv1 "github.com/floodgate-go/floodgate/proto/completion/v1"
)

// simTarget calls a strategy's interceptor directly, in simulated time,
// over the service's own handler and model, on the simulated clock: the
// server's decisions and streams without gRPC's transport, for runs of
// minutes in seconds.
type simTarget struct {
	clock   *simClock
	start   time.Time
	model   *model
	workers []simWorker
}

// A simWorker is one server process: its strategy's interceptor, over a
// store of its own, and the time it is killed (0: never).
type simWorker struct {
	intercept grpc.StreamServerInterceptor
	killAt    time.Duration
}

var completeInfo = &grpc.StreamServerInfo{FullMethod: completionv1.Completion_Complete_FullMethodName, IsServerStream: true}

// completeHandler is the generated handler of Complete.
var completeHandler = completionv1.Completion_ServiceDesc.Streams[0].Handler

func (s *simTarget) call(ctx context.Context, w int, tenant string, n, estimate int) (int, outcome) {
	wk := s.workers[w]
	if wk.killAt > 0 && s.since() >= wk.killAt {
		return 0, failed // connection refused
	}
	md := metadata.Pairs(tenantHeader, tenant)
	if estimate != noEstimate {
		md.Append(estimateHeader, strconv.Itoa(estimate))
	}
	ss := &simStream{ctx: metadata.NewIncomingContext(ctx, md), n: n, dead: func() bool {
		return wk.killAt > 0 && s.since() >= wk.killAt
	}}
	if err := wk.intercept(s.model, ss, completeInfo, completeHandler); err != nil {
		return ss.got, classify(err)
	}
	return ss.got, served
}

func (s *simTarget) since() time.Duration { return s.clock.Now().Sub(s.start) }

// simStream is the server stream of a simulated call: it reads a request
// for a reply of n tokens, and counts the tokens the handler sends, until
// its worker is dead.
type simStream struct {
	grpc.ServerStream // nil: only the methods below are called
	ctx               context.Context
	n                 int
	dead              func() bool
	got               int
}

func (s *simStream) Context() context.Context { return s.ctx }

func (s *simStream) RecvMsg(m any) error {
	m.(*completionv1.CompleteRequest).ReplyTokens = int32(s.n)
	return nil
}

func (s *simStream) SendMsg(m any) error {
	if s.dead() {
		return status.Error(codes.Unavailable, "worker killed")
	}
	s.got += int(m.(*completionv1.CompleteResponse).GetTokens())
	return nil
}

func (s *simStream) SetHeader(metadata.MD) error  { return nil }
func (s *simStream) SendHeader(metadata.MD) error { return nil }
func (s *simStream) SetTrailer(metadata.MD)       {}

// errKilled is every call of a killed worker's store.
var errKilled = errors.New("tokens: worker killed")

// mortal is a simulated worker's store: from its kill time on, nothing
// reaches the store, as nothing does from a killed process. Its
// reservations then keep their estimates charged, and its takes after
// the call never happen.
type mortal struct {
	store
	dead func() bool
}

func (m *mortal) TakeN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Result, error) {
	if m.dead() {
		return floodgate.Result{}, errKilled
	}
	return m.store.TakeN(ctx, key, lim, n)
}

func (m *mortal) Peek(ctx context.Context, key string, lim floodgate.Limit) (floodgate.Result, error) {
	if m.dead() {
		return floodgate.Result{}, errKilled
	}
	return m.store.Peek(ctx, key, lim)
}

func (m *mortal) SettleN(ctx context.Context, key string, lim floodgate.Limit, reserved, actual int) (floodgate.Result, error) {
	if m.dead() {
		return floodgate.Result{}, errKilled
	}
	return m.store.SettleN(ctx, key, lim, reserved, actual)
}

// ReserveN reserves on the store; the Reservation settles through m, so
// that a settle after the kill is lost.
func (m *mortal) ReserveN(ctx context.Context, key string, lim floodgate.Limit, n int) (floodgate.Reservation, error) {
	if m.dead() {
		return floodgate.Reservation{}, errKilled
	}
	r, err := m.store.ReserveN(ctx, key, lim, n)
	if !r.Result.Allowed {
		return r, err
	}
	return floodgate.NewReservation(&mortalSettle{m, &r}, key, lim, n, r.Result), err
}

// mortalSettle settles a reservation where its store would, unless the
// worker is dead.
type mortalSettle struct {
	m *mortal
	r *floodgate.Reservation
}

func (s *mortalSettle) SettleN(ctx context.Context, _ string, _ floodgate.Limit, _, actual int) (floodgate.Result, error) {
	if s.m.dead() {
		return floodgate.Result{}, errKilled
	}
	return s.r.Settle(ctx, actual)
}
