package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/tenant"
)

// ---- user code ----
//
// Three ways to hold tenants to a quota of tokens a minute when a call's
// tokens are known only when it ends. The first two are what gateways do
// today, written with floodgate's buckets as they stand without
// reservations; the third is floodgate's metered quota, which reserves an
// estimate and settles the actual. The model reports a call's tokens to
// all three with reportCost (model.go).

const (
	// tenantHeader names the caller's tenant.
	tenantHeader = "x-tenant"
	// estimateHeader states, optionally, the tokens the caller expects the
	// call to cost; the server's estimate, its maximum, otherwise.
	estimateHeader = "x-token-estimate"
)

// A quota is a tenant's tokens-per-minute quota: its bucket, and a call's
// estimate when the caller states none (the most a call can cost), which
// also caps the estimates callers state.
type quota struct {
	Limit    floodgate.Limit
	Estimate int
}

// A bucketStore is a store whose buckets can be read without taking: both
// of floodgate's stores are.
type bucketStore interface {
	floodgate.Store
	floodgate.Peeker
}

// chargeAtEnd admits a call while the tenant's bucket holds a token, and
// charges the call's tokens when it ends. A bucket never goes below zero by
// a take, so it charges what the bucket still holds and the rest is never
// counted. Envoy AI Gateway and agentgateway limit tokens this way: a
// check that costs nothing before, the usage applied after.
func chargeAtEnd(store bucketStore, q quota) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		tenant := tenantOf(ctx)
		res, err := store.Peek(ctx, tenant, q.Limit)
		switch {
		case err != nil:
			return status.Error(codes.Unavailable, "token quota: "+err.Error())
		case res.Remaining < 1:
			return errOverQuota
		}
		ctx, u := withUsage(ctx)
		err = handler(srv, &usageStream{ss, ctx})
		charge(context.WithoutCancel(ctx), store, tenant, q.Limit, u.tokens())
		return err
	}
}

// checkThenCount admits a call when the tenant's bucket holds its
// estimate, without taking it, and counts the call's tokens when it ends,
// as chargeAtEnd does. Calls that start together all pass the check: at
// LiteLLM (issue 18730), 5 concurrent requests used 663 tokens of a
// 100-a-minute limit.
func checkThenCount(store bucketStore, q quota) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		tenant := tenantOf(ctx)
		res, err := store.Peek(ctx, tenant, q.Limit)
		switch {
		case err != nil:
			return status.Error(codes.Unavailable, "token quota: "+err.Error())
		case res.Remaining < estimateOf(ctx, q.Estimate):
			return errOverQuota
		}
		ctx, u := withUsage(ctx)
		err = handler(srv, &usageStream{ss, ctx})
		charge(context.WithoutCancel(ctx), store, tenant, q.Limit, u.tokens())
		return err
	}
}

// charge takes n tokens from the tenant's bucket, or all it holds when it
// holds fewer.
func charge(ctx context.Context, store floodgate.Store, tenant string, lim floodgate.Limit, n int) {
	res, err := store.TakeN(ctx, tenant, lim, n)
	if (err == nil || errors.Is(err, floodgate.ErrExceedsBurst)) && !res.Allowed && res.Remaining > 0 {
		_, _ = store.TakeN(ctx, tenant, lim, res.Remaining)
	}
}

// tenantConfig is floodgate's tenant config for tenants with a quota of
// rate tokens a minute in bursts of burst, owing at most debt tokens
// (empty: the default, one burst; "0": none), each call reserving 4,000
// tokens unless it states its estimate in estimateHeader. Calls are not
// limited: the tokens are the quota.
func tenantConfig(tenants []string, rate, burst int, debt string) string {
	var b strings.Builder
	b.WriteString("tenants:\n")
	for _, t := range tenants {
		fmt.Fprintf(&b, `  %s:
    default: {rate: inf}
    methods:
      "/completion.v1.Completion/*":
        metered:
          unit: tokens
          rate: %d
          per: 1m
          burst: %d
          estimate: %d
          estimate_header: %s
`, t, rate, burst, maxReply, estimateHeader)
		if debt != "" {
			fmt.Fprintf(&b, "          debt: %s\n", debt)
		}
	}
	return b.String()
}

// reserveSettle is floodgate's Limiter over the metered quotas of table:
// each call reserves its estimate from its tenant's bucket as it starts,
// and settles at the tokens it reported (middleware.ReportCost) when it
// ends, refunding what it did not use and charging what it used beyond,
// below zero if need be, down to the quota's debt limit. A bucket in debt
// admits no call until the debt is repaid, so over any time t a tenant
// gets at most burst + rate·t + debt tokens, however many calls run at
// once. The caller names its tenant in tenantHeader (behind a gateway that
// sets it; API keys are middleware.WithAPIKeyHeaders).
func reserveSettle(store floodgate.Reserver, table *tenant.Table, clk floodgate.Clock) (*middleware.Limiter, error) {
	return middleware.New(store, middleware.Static(table), middleware.WithClock(clk),
		middleware.WithKeyFunc(func(ctx context.Context, _ string) (string, bool) {
			id := tenantOf(ctx)
			return id, id != ""
		}))
}

// tenantOf returns the caller's tenant, "" when it names none (a bucket of
// its own for the anonymous).
func tenantOf(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, tenantHeader); len(v) > 0 {
		return v[0]
	}
	return ""
}

// estimateOf returns the estimate the caller states, at most max, or max.
func estimateOf(ctx context.Context, max int) int {
	if v := metadata.ValueFromIncomingContext(ctx, estimateHeader); len(v) > 0 {
		if n, err := strconv.Atoi(v[0]); err == nil && n >= 0 && n < max {
			return n
		}
	}
	return max
}

// errOverQuota is the error of a call the quota refused.
var errOverQuota = status.Error(codes.ResourceExhausted, "tenant over its tokens-per-minute quota")

// reportCost reports that the call of ctx cost n more tokens: to
// floodgate's Limiter, and to the usage of the first two strategies.
func reportCost(ctx context.Context, n int) {
	middleware.ReportCost(ctx, int64(n))
	if u, ok := ctx.Value(usageKey{}).(*usage); ok {
		u.n.Add(int64(n))
	}
}

// usage counts the tokens a call reports (reportCost).
type usage struct{ n atomic.Int64 }

type usageKey struct{}

func withUsage(ctx context.Context) (context.Context, *usage) {
	u := new(usage)
	return context.WithValue(ctx, usageKey{}, u), u
}

func (u *usage) tokens() int { return int(u.n.Load()) }

// usageStream is a stream whose context carries the call's usage.
type usageStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *usageStream) Context() context.Context { return s.ctx }

// ---- end of user code ----
