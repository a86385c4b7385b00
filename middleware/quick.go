package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"

	"google.golang.org/grpc"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
)

// The short forms of New, for the common cases. Each returns a Limiter
// whose ServerOptions wire it into a gRPC server in one call:
//
//	l, err := middleware.NewPerAddress(100, 200)
//	if err != nil {
//		return err
//	}
//	srv := grpc.NewServer(l.ServerOptions()...)
//
// The long form, New, takes any store (redisstore for limits shared by a
// fleet), tables and gate.

// ServerOptions returns what a gRPC server needs to run every call through
// the Limiter: its tap handle and its unary and stream interceptors,
// chained (grpc.ChainUnaryInterceptor, grpc.ChainStreamInterceptor), so
// that other interceptors, go-grpc-middleware/v2's among them, compose with
// them in the order the server options list them. A server has one tap
// handle: a server that needs its own calls the Limiter's TapHandle from it.
func (l *Limiter) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(l.TapHandle),
		grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(l.StreamServerInterceptor()),
	}
}

// Overload returns the overload controller the Limiter puts in front of
// the handlers (WithOverload, or NewOverload's own), for its Snapshot and
// for load reports (package loadreport); nil if it has none.
func (l *Limiter) Overload() *overload.Controller { return l.o.overload }

// NewPerAddress returns a Limiter that gives every client address its own
// token bucket of rate calls a second holding at most burst, for every
// method but the exempt ones (WithExemptions). An address is the peer's
// IP (IPv6 by /64, WithAddressBits); behind a proxy, WithTrustedProxies
// reads the client's from the header it sets. The buckets live in memory
// (keyed.New's defaults). opts are New's options.
func NewPerAddress(rate float64, burst int, opts ...Option) (*Limiter, error) {
	tbl, err := tenant.Compile(&tenant.Config{
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: rate, Burst: burst}},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: middleware: NewPerAddress(%v, %d): %w", floodgate.ErrInvalidOption, rate, burst, err)
	}
	return inMemory(Static(tbl), opts...)
}

// inMemory returns a Limiter over tables with its buckets in a keyed map
// of keyed.New's defaults.
func inMemory(tables Tables, opts ...Option) (*Limiter, error) {
	store, err := keyed.New()
	if err != nil {
		return nil, err
	}
	return New(store, tables, opts...)
}

// NewOverload returns a Limiter that keeps the server at its capacity and
// sets no quota: every call but the exempt ones goes through an
// overload.Controller, its defaults' or the one WithOverload gives, which
// sheds what the server cannot complete, from the client addresses above
// their fair share first. It needs no store and no CPU reading: the
// controller reads only the server's own calls. opts are New's options.
func NewOverload(opts ...Option) (*Limiter, error) {
	tbl, err := tenant.Compile(&tenant.Config{
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: math.Inf(1)}},
	})
	if err != nil {
		return nil, err
	}
	ctrl, err := overload.New()
	if err != nil {
		return nil, err
	}
	// The caller's WithOverload, if any, comes later and replaces ctrl.
	return inMemory(Static(tbl), append([]Option{WithOverload(ctrl)}, opts...)...)
}

// NewFromFile returns a Limiter over the tenant config at path (YAML or
// JSON; see package tenant) with its buckets in memory. It returns the
// config's error when the first load fails. Then it watches the file
// (tenant.Registry.Watch) from a goroutine of its own, and reloads the
// config when the file changes, until ctx ends: cancel ctx to stop the
// watch, and its goroutine with it; the Limiter keeps the table last
// loaded. The watch logs to slog.Default (as it is when NewFromFile is
// called): each reload at Info; a version that fails to load, which
// leaves the table in force, at Error; and the watch's end with its error,
// at Info when it is ctx's. opts are New's options: WithAPIKeyHeaders
// names the headers that carry the tenants' keys.
func NewFromFile(ctx context.Context, path string, opts ...Option) (*Limiter, error) {
	log := slog.Default()
	reg, err := tenant.New(tenant.WithLogger(log))
	if err != nil {
		return nil, err
	}
	if err := reg.Load(path); err != nil {
		return nil, err
	}
	l, err := inMemory(reg, opts...)
	if err != nil {
		return nil, err
	}
	go func() {
		err := reg.Watch(ctx, path)
		level := slog.LevelError
		if errors.Is(err, ctx.Err()) {
			level = slog.LevelInfo
		}
		log.Log(context.Background(), level, "middleware: tenant config watch ended; the table in force stays", "path", path, "err", err)
	}()
	return l, nil
}
