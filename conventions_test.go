package floodgate_test

// The option convention (floodgate.ErrInvalidOption) in every package of
// the core module that takes options.

import (
	"math"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
	"github.com/floodgate-go/floodgate/httplimit"
	"github.com/floodgate-go/floodgate/internal/optiontest"
	"github.com/floodgate-go/floodgate/keyed"
	"github.com/floodgate-go/floodgate/loadreport"
	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/overload"
	"github.com/floodgate-go/floodgate/tenant"
	"github.com/floodgate-go/floodgate/throttle"
)

func TestOptionConventionKeyed(t *testing.T) {
	optiontest.Check(t, func(opts ...keyed.Option) error {
		_, err := keyed.New(opts...)
		return err
	}, []optiontest.Case[keyed.Option]{
		{Option: "WithCapacity", Bad: keyed.WithCapacity(0), Good: keyed.WithCapacity(10)},
		{Option: "WithShards", Bad: keyed.WithShards(3), Good: keyed.WithShards(4)},
		{Option: "WithPressure", Bad: keyed.WithPressure(keyed.Pressure(9)), Good: keyed.WithPressure(keyed.Evict)},
	})
}

func TestOptionConventionCPUGate(t *testing.T) {
	sampler := cpugate.SamplerFunc(func() (cpugate.Reading, error) { return cpugate.Reading{}, nil })
	optiontest.Check(t, func(opts ...cpugate.Option) error {
		_, err := cpugate.New(sampler, opts...)
		return err
	}, []optiontest.Case[cpugate.Option]{
		{Option: "WithInterval", Bad: cpugate.WithInterval(0), Good: cpugate.WithInterval(time.Second)},
		{Option: "WithPolicy", Bad: cpugate.WithPolicy(nil), Good: cpugate.WithPolicy(cpugate.Fixed{})},
		// A policy is a config struct: its error names the field.
		{Option: "Fixed.Factor", Bad: cpugate.WithPolicy(cpugate.Fixed{Factor: 2}), Good: cpugate.WithPolicy(cpugate.Fixed{})},
	})
}

func TestOptionConventionTenant(t *testing.T) {
	optiontest.Check(t, func(opts ...tenant.Option) error {
		_, err := tenant.New(opts...)
		return err
	}, []optiontest.Case[tenant.Option]{
		{Option: "WithPollInterval", Bad: tenant.WithPollInterval(0), Good: tenant.WithPollInterval(time.Second)},
	})
}

func TestOptionConventionOverload(t *testing.T) {
	optiontest.Check(t, func(opts ...overload.Option) error {
		_, err := overload.New(opts...)
		return err
	}, []optiontest.Case[overload.Option]{
		{Option: "WithLimits", Bad: overload.WithLimits(-1, 0), Good: overload.WithLimits(1, 2)},
		{Option: "WithQueueTarget", Bad: overload.WithQueueTarget(-time.Millisecond), Good: overload.WithQueueTarget(time.Millisecond)},
		{Option: "WithRetryAfter", Bad: overload.WithRetryAfter(-time.Second), Good: overload.WithRetryAfter(time.Second)},
	})
}

// anyone is a tenant table that admits every caller.
func anyone(t *testing.T) middleware.Tables {
	t.Helper()
	tbl, err := tenant.Compile(&tenant.Config{
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: math.Inf(1)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return middleware.Static(tbl)
}

func TestOptionConventionMiddleware(t *testing.T) {
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	tables := anyone(t)
	var invalidPrefix netip.Prefix
	prefix := netip.MustParsePrefix("10.0.0.0/8")
	optiontest.Check(t, func(opts ...middleware.Option) error {
		_, err := middleware.New(store, tables, opts...)
		return err
	}, []optiontest.Case[middleware.Option]{
		{Option: "WithTrustedProxies", Bad: middleware.WithTrustedProxies(invalidPrefix), Good: middleware.WithTrustedProxies(prefix), Adds: true},
		{Option: "WithPriorityFromPeers", Bad: middleware.WithPriorityFromPeers(invalidPrefix), Good: middleware.WithPriorityFromPeers(prefix), Adds: true},
		{Option: "WithPriorityFromTenants", Bad: middleware.WithPriorityFromTenants(""), Good: middleware.WithPriorityFromTenants("front"), Adds: true},
		{Option: "WithClientAddressHeader", Bad: middleware.WithClientAddressHeader("x-client"), Good: middleware.WithClientAddressHeader("x-real-ip")},
		{Option: "WithAddressBits", Bad: middleware.WithAddressBits(0, 64), Good: middleware.WithAddressBits(24, 48)},
		{Option: "WithAPIKeyHeaders", Bad: middleware.WithAPIKeyHeaders("X-Key"), Good: middleware.WithAPIKeyHeaders("x-key")},
		{Option: "WithCodes", Bad: middleware.WithCodes(codes.OK, codes.Unavailable), Good: middleware.WithCodes(codes.ResourceExhausted, codes.Unavailable)},
		{Option: "WithMaxPushback", Bad: middleware.WithMaxPushback(0), Good: middleware.WithMaxPushback(time.Second)},
		{Option: "WithDomain", Bad: middleware.WithDomain(""), Good: middleware.WithDomain("example.com")},
		{Option: "WithExemptions", Bad: middleware.WithExemptions("health"), Good: middleware.WithExemptions("/grpc.health.v1.Health/")},
		{Option: "WithTapFloor", Bad: middleware.WithTapFloor(0), Good: middleware.WithTapFloor(0.5)},
	})
}

func TestOptionConventionHTTPLimit(t *testing.T) {
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	l, err := middleware.New(store, anyone(t))
	if err != nil {
		t.Fatal(err)
	}
	optiontest.Check(t, func(opts ...httplimit.Option) error {
		_, err := httplimit.New(l, opts...)
		return err
	}, []optiontest.Case[httplimit.Option]{
		{Option: "WithMethod", Bad: httplimit.WithMethod(nil), Good: httplimit.WithMethod(func(*http.Request) string { return "" })},
		{Option: "WithCORS", Bad: httplimit.WithCORS("example.com"), Good: httplimit.WithCORS("https://example.com"), Adds: true},
	})
}

func TestOptionConventionThrottle(t *testing.T) {
	optiontest.Check(t, func(opts ...throttle.Option) error {
		_, err := throttle.New(opts...)
		return err
	}, []optiontest.Case[throttle.Option]{
		{Option: "WithWindow", Bad: throttle.WithWindow(0), Good: throttle.WithWindow(time.Second)},
		{Option: "WithK", Bad: throttle.WithK(0), Good: throttle.WithK(2)},
		{Option: "WithRetries", Bad: throttle.WithRetries(0), Good: throttle.WithRetries(3)},
		{Option: "WithRetryBudget", Bad: throttle.WithRetryBudget(-1, 0), Good: throttle.WithRetryBudget(0.1, 1)},
		{Option: "WithBackoff", Bad: throttle.WithBackoff(0), Good: throttle.WithBackoff(time.Millisecond)},
	})
	// NewAdaptive and NewBudget take their own options the same way.
	window := []optiontest.Case[throttle.Option]{{Option: "WithWindow", Bad: throttle.WithWindow(0), Good: throttle.WithWindow(time.Second)}}
	optiontest.Check(t, func(opts ...throttle.Option) error {
		_, err := throttle.NewAdaptive(2, opts...)
		return err
	}, window)
	optiontest.Check(t, func(opts ...throttle.Option) error {
		_, err := throttle.NewBudget(0.1, 1, opts...)
		return err
	}, window)
	store, err := keyed.New()
	if err != nil {
		t.Fatal(err)
	}
	optiontest.Check(t, func(opts ...throttle.Option) error {
		_, err := throttle.NewQuota(store, floodgate.PerSecond(10, 10), opts...)
		return err
	}, []optiontest.Case[throttle.Option]{
		{Option: "WithQuotaCost", Bad: throttle.WithQuotaCost(0), Good: throttle.WithQuotaCost(2)},
	})
}

func TestOptionConventionLoadReport(t *testing.T) {
	ctrl, err := overload.New()
	if err != nil {
		t.Fatal(err)
	}
	optiontest.Check(t, func(opts ...loadreport.Option) error {
		_, err := loadreport.New(ctrl, append([]loadreport.Option{loadreport.WithSampler(nil)}, opts...)...)
		return err
	}, []optiontest.Case[loadreport.Option]{
		{Option: "WithInterval", Bad: loadreport.WithInterval(0), Good: loadreport.WithInterval(time.Second)},
	})
}
