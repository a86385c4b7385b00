package middleware

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/overload"
)

// Defaults of the options.
const (
	// defaultIPv4Bits keys anonymous IPv4 callers by their whole address.
	defaultIPv4Bits = 32
	// defaultIPv6Bits keys anonymous IPv6 callers by their /64: one host
	// usually owns a whole /64, so a finer key would hand it 2⁶⁴ buckets.
	defaultIPv6Bits = 64
	// defaultMaxPushback caps the retry delay a rejection asks for; a longer
	// wait is signalled as "do not retry" (pushback -1).
	defaultMaxPushback = 30 * time.Second
	// defaultDomain is the ErrorInfo domain of rejections.
	defaultDomain = "floodgate.dev"
)

// defaultExemptions returns the method prefixes exempt from limiting
// unless WithExemptions says otherwise.
func defaultExemptions() []string {
	return []string{
		"/grpc.health.v1.Health/",
		"/grpc.reflection.",
		"/xds.service.orca.v3.",
	}
}

// commonName is the default TLS identity: the certificate subject's common
// name, when it has one.
func commonName(leaf *x509.Certificate) (string, bool) {
	cn := leaf.Subject.CommonName
	return cn, cn != ""
}

// An Option configures a Limiter. New (and NewPerAddress, NewOverload,
// NewFromFile) apply the options in order to a copy of the defaults,
// skipping nil ones, then validate the result (the convention of
// floodgate.ErrInvalidOption).
type Option func(*options)

type options struct {
	gate        Gate
	overload    *overload.Controller
	trusted     []netip.Prefix
	fwdHeader   string // "" for both, else the one header read
	v4Bits      int
	v6Bits      int
	keyHeaders  []string
	tlsIdentity func(leaf *x509.Certificate) (tenantID string, ok bool)
	keyFunc     func(ctx context.Context, fullMethod string) (tenantID string, ok bool)
	quotaCode   codes.Code
	overCode    codes.Code
	details     bool
	maxPushback time.Duration
	domain      string
	rateHeaders bool
	dryRun      bool
	exempt      []string
	observer    func(Event)
	perMessage  bool
	tapFloor    float64
	failClosed  bool
	clock       floodgate.Clock
	prioPeers   []netip.Prefix
	prioTenants map[string]bool
	estimate    func(ctx context.Context, method string, req any) (n int64, ok bool)
	actualCost  func(ctx context.Context, method string, resp any) (n int64, ok bool)
}

func defaults() options {
	return options{
		v4Bits:      defaultIPv4Bits,
		v6Bits:      defaultIPv6Bits,
		keyHeaders:  []string{"x-api-key", "authorization"},
		tlsIdentity: commonName,
		quotaCode:   codes.ResourceExhausted,
		overCode:    codes.Unavailable,
		details:     true,
		maxPushback: defaultMaxPushback,
		domain:      defaultDomain,
		exempt:      defaultExemptions(),
		tapFloor:    1,
		clock:       floodgate.ClockFunc(time.Now),
	}
}

// validate checks the options New was given and normalizes the trusted
// prefixes and the pushback cap. The error names the first invalid option.
func (o *options) validate() error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: middleware: "+format, append([]any{floodgate.ErrInvalidOption}, args...)...)
	}
	for i, p := range o.trusted {
		if !p.IsValid() {
			return invalid("WithTrustedProxies: invalid prefix %v", p)
		}
		o.trusted[i] = p.Masked()
	}
	for i, p := range o.prioPeers {
		if !p.IsValid() {
			return invalid("WithPriorityFromPeers: invalid prefix %v", p)
		}
		o.prioPeers[i] = p.Masked()
	}
	for id := range o.prioTenants {
		if id == "" {
			return invalid("WithPriorityFromTenants: empty tenant ID")
		}
	}
	if o.fwdHeader != "" && o.fwdHeader != "x-forwarded-for" && o.fwdHeader != "forwarded" && o.fwdHeader != "x-real-ip" {
		return invalid("WithClientAddressHeader(%q): not x-forwarded-for, forwarded or x-real-ip", o.fwdHeader)
	}
	if o.v4Bits < 1 || o.v4Bits > 32 || o.v6Bits < 1 || o.v6Bits > 128 {
		return invalid("WithAddressBits(%d, %d): want v4 in [1, 32] and v6 in [1, 128]", o.v4Bits, o.v6Bits)
	}
	for _, n := range o.keyHeaders {
		if n == "" || n != strings.ToLower(n) || strings.HasSuffix(n, "-bin") || strings.HasPrefix(n, "grpc-") {
			return invalid("WithAPIKeyHeaders(%q): want a lower-case name, not binary and not reserved", n)
		}
	}
	if o.quotaCode == codes.OK || o.overCode == codes.OK || o.quotaCode > codes.Unauthenticated || o.overCode > codes.Unauthenticated {
		return invalid("WithCodes(%v, %v): want valid codes other than OK", o.quotaCode, o.overCode)
	}
	if o.maxPushback < time.Millisecond || o.maxPushback > time.Hour {
		return invalid("WithMaxPushback(%v): want [1ms, 1h]", o.maxPushback)
	}
	o.maxPushback = gridFloor(o.maxPushback)
	if o.domain == "" {
		return invalid("WithDomain: empty domain")
	}
	for _, p := range o.exempt {
		if !strings.HasPrefix(p, "/") {
			return invalid("WithExemptions(%q): want a prefix starting with '/'", p)
		}
	}
	if !(o.tapFloor > 0 && o.tapFloor <= 1) {
		return invalid("WithTapFloor(%v): want (0, 1]", o.tapFloor)
	}
	return nil
}

// WithGate scales every limit by g's scale, so that all tenants shed load
// together while the CPU is saturated, and lets the tap handle reject early
// while the gate sheds (WithTapFloor). A nil g, the default, scales
// nothing. A repeated call replaces the gate.
func WithGate(g Gate) Option { return func(o *options) { o.gate = g } }

// WithOverload puts an overload controller in front of the handlers of
// unary calls: a call admitted by its tenant's quota then takes one of the
// controller's slots for as long as its handler runs, waits briefly for
// one, or is shed with the overload code (UNAVAILABLE by default), ErrorInfo
// reason "OVERLOADED" and the controller's retry delay. Each tenant is
// one flow of its tier's weight and priority (a method entry's priority
// overrides it); anonymous callers are one flow per address prefix, of the
// anonymous policy's weight. The tap handle counts every call into the
// controller as it enters (so install it: grpc.InTapHandle), and while the
// server holds all it can run and queue, turns away callers at their share
// before their request is read, once the unary interceptor has seen the
// call's method. Install the stream interceptor too: the controller does
// not hold streams, and once it has seen a stream method the tap handle
// stops counting that method's calls in; without it, every stream keeps
// the place the tap counted for as long as it lasts.
//
// This is the recommended overload protection: the controller finds how
// many calls the server runs at once from their service times, and sheds the tenants over
// their fair share first, where WithGate cuts every tenant by one factor.
// Streams are not held to it: a stream's lifetime says nothing about the
// server's load. WithDryRun leaves the controller out. A nil c, the
// default, means no controller; a repeated call replaces it.
func WithOverload(c *overload.Controller) Option { return func(o *options) { o.overload = c } }

// WithPriorityFromPeers honours the priority a call carries in its
// PriorityHeader metadata when the caller's address (the peer, or
// the client a trusted proxy names) is within one of prefixes: the
// services in front of this one, whose PropagatePriority interceptors pass
// on the priority of the call they serve. From anyone else the header is
// ignored and the tenant's configured priority stands. A repeated call
// adds prefixes.
func WithPriorityFromPeers(prefixes ...netip.Prefix) Option {
	return func(o *options) { o.prioPeers = append(o.prioPeers, prefixes...) }
}

// WithPriorityFromTenants honours the priority a call carries in its
// PriorityHeader metadata when its caller is one of the tenants named (by
// ID): services that authenticate as a tenant, with an API key or a
// certificate. A repeated call adds tenants.
func WithPriorityFromTenants(ids ...string) Option {
	return func(o *options) {
		if o.prioTenants == nil {
			o.prioTenants = map[string]bool{}
		}
		for _, id := range ids {
			o.prioTenants[id] = true
		}
	}
}

// WithTrustedProxies adds the networks whose x-forwarded-for, forwarded
// (RFC 7239) and x-real-ip headers are believed. Only when the immediate
// peer is in one of them is x-forwarded-for read, right to left, skipping
// further trusted hops; the first untrusted address is the client. Without
// it, forwarded's for= parameters are walked the same way, and without
// either, the last x-real-ip line names the client; WithClientAddressHeader
// picks one header when the proxy sets only one of them. Repeated calls add to the list; the
// default is empty: headers are never believed.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return func(o *options) { o.trusted = append(o.trusted, prefixes...) }
}

// WithClientAddressHeader names the one header in which the trusted proxies
// (WithTrustedProxies) pass on the client's address: "x-forwarded-for" or
// "forwarded" (walked right to left) or "x-real-ip" (its last line). By
// default the first of them present is read, in that order, which suits
// proxies that append to x-forwarded-for: Envoy, HAProxy's forwardfor,
// nginx with $proxy_add_x_forwarded_for. A proxy that sets x-real-ip but
// passes the client's own x-forwarded-for through (nginx with only
// "proxy_set_header X-Real-IP $remote_addr") needs "x-real-ip", and one
// that appends only to forwarded needs "forwarded": otherwise each client
// names its own address, and picks its own bucket. A repeated call
// replaces the header.
func WithClientAddressHeader(name string) Option {
	return func(o *options) { o.fwdHeader = strings.ToLower(name) }
}

// WithAddressBits sets how anonymous callers' addresses are aggregated:
// an IPv4 caller is keyed by its first v4 bits (1–32, default 32), an IPv6
// caller by its first v6 bits (1–128, default 64). A repeated call replaces
// both values.
func WithAddressBits(v4, v6 int) Option {
	return func(o *options) { o.v4Bits, o.v6Bits = v4, v6 }
}

// WithAPIKeyHeaders sets the metadata keys an API key is read from, in
// order; the first present wins. The value of "authorization" must be
// "Bearer <key>"; other keys carry the key as is. Names must be lower-case,
// as gRPC metadata keys are. The default is x-api-key, then authorization.
// A repeated call replaces the list; no names turns API keys off.
//
// A key no tenant owns costs a SHA-256 on every call. If your clients send
// bearer tokens that are not floodgate API keys (OAuth access tokens, say),
// leave "authorization" out.
func WithAPIKeyHeaders(names ...string) Option {
	return func(o *options) { o.keyHeaders = append([]string(nil), names...) }
}

// WithTLSIdentity sets how a verified client certificate names its tenant
// ID. The default is the certificate subject's common name, when it has
// one; nil ignores client certificates. Only certificates the server
// verified (tls.ConnectionState.VerifiedChains) count. A repeated call
// replaces the function.
func WithTLSIdentity(f func(leaf *x509.Certificate) (tenantID string, ok bool)) Option {
	return func(o *options) { o.tlsIdentity = f }
}

// WithKeyFunc sets a hook consulted before TLS identities and API keys,
// that names the tenant of a call from its context, for identities the
// middleware does not read itself (a JWT subject checked by an earlier
// interceptor, a header set by a trusted gateway). It returns ok false to
// fall through to TLS, API key and address. An ID the table does not know
// is treated as anonymous, keyed by the client address: the hook cannot
// hand a caller a fresh bucket by naming a made-up tenant. The default is
// none. A repeated call replaces the hook; nil removes it. The tap handle
// does not call it, and so, with a hook set, passes every call to the
// interceptors.
func WithKeyFunc(f func(ctx context.Context, fullMethod string) (tenantID string, ok bool)) Option {
	return func(o *options) { o.keyFunc = f }
}

// WithCodes sets the status codes of rejections: quota for a caller over its
// quota at full limits (ReasonQuota; default RESOURCE_EXHAUSTED), overload
// for the rest (default UNAVAILABLE): a call the overload controller sheds
// or the tap handle turns away (ReasonOverload), a caller over its quota
// while the CPU gate scales limits down (ReasonGate), and a failed store under
// WithFailClosed. Neither may be OK. A repeated call replaces both.
func WithCodes(quota, overload codes.Code) Option {
	return func(o *options) { o.quotaCode, o.overCode = quota, overload }
}

// WithDetails sets whether rejections carry status details (ErrorInfo,
// RetryInfo, and QuotaFailure for quota rejections). The default is true;
// without details a rejection is a bare status, which costs less to send
// and to parse, and its retry delay is only in the pushback trailer. A
// repeated call replaces the setting.
func WithDetails(on bool) Option { return func(o *options) { o.details = on } }

// WithMaxPushback caps the retry delay a rejection's pushback trailer asks
// for, in [1ms, 1h] (pushback counts milliseconds). A wait beyond it (or
// beyond the caller's deadline) is sent as pushback -1, so that grpc-go's
// retry does not sleep through it; RetryInfo still states the whole wait,
// so that a client can tell when, say, an hourly quota resets. Pushbacks are rounded up to a grid (whole milliseconds up
// to 1 s, tens of them up to 10 s, whole seconds beyond), and the cap is
// rounded down to it, so that no wait within the cap asks for more. The
// default is 30 s. A repeated call replaces the cap.
func WithMaxPushback(d time.Duration) Option {
	return func(o *options) { o.maxPushback = d }
}

// WithDomain sets the ErrorInfo domain of rejections, typically the
// service's name. It must not be empty; the default is "floodgate.dev". A
// repeated call replaces it.
func WithDomain(domain string) Option {
	return func(o *options) { o.domain = domain }
}

// WithRateLimitHeaders sets whether accepted unary calls and streams carry
// header metadata ratelimit-limit (the burst), ratelimit-remaining and
// ratelimit-reset (seconds until the bucket is full). It costs a few
// allocations per call and is off by default. Rejections never carry header
// metadata whatever this says. A repeated call replaces the setting.
func WithRateLimitHeaders(on bool) Option { return func(o *options) { o.rateHeaders = on } }

// WithDryRun sets whether the Limiter only decides and reports: every call
// is admitted, and the decision (in the context and the Event) says
// what would have happened. Tokens are still taken; those of metered
// quotas from buckets of the dry run's own (see the package doc), so that
// enforcement never inherits its debt. The tap handle rejects nothing in
// dry-run mode. A repeated call replaces the setting.
func WithDryRun(on bool) Option { return func(o *options) { o.dryRun = on } }

// WithExemptions sets the full-method prefixes that are never limited, such
// as "/pkg.Svc/Method" or "/pkg.Svc/". Exempt calls take no tokens and
// carry no decision. The default is gRPC's health checks, server
// reflection (both versions) and ORCA load reports ("/grpc.health.v1.Health/",
// "/grpc.reflection.", "/xds.service.orca.v3."): limiting them would make
// an overloaded server look dead to its load balancer, or hide it from its
// operators. A repeated call replaces the list, so list those along to keep
// them.
func WithExemptions(prefixes ...string) Option {
	return func(o *options) { o.exempt = append([]string(nil), prefixes...) }
}

// WithObserver sets a function called once per decision, on the request
// path, after the decision is made: keep it fast and do not block. A
// repeated call replaces it; nil removes it.
func WithObserver(f func(Event)) Option { return func(o *options) { o.observer = f } }

// WithPerMessage sets whether each message a client sends on an admitted
// stream also takes the method's cost from the caller's bucket. A message
// over quota ends the stream: RecvMsg returns the rejection. The default is
// false: streams are admitted once, at their start. A repeated call replaces
// the setting.
func WithPerMessage(on bool) Option { return func(o *options) { o.perMessage = on } }

// WithTapFloor sets the gate scale, in (0, 1], at or below which the tap
// handle rejects callers still inside a retry delay the interceptor gave
// them, with a CPU gate (WithGate): without an overload controller, or for
// the calls the controller does not hold (streams). The
// default, 1, lets the tap reject them whenever the gate sheds: such a
// caller would find its bucket empty and be rejected by the interceptor
// anyway, at the cost of a stream, a goroutine and a trailer. A lower
// value, such as the policy's floor, keeps the tap out of the way until
// limits are cut that far, for callers that ignore pushback but honour the
// interceptor's details. A repeated call replaces it.
func WithTapFloor(f float64) Option {
	return func(o *options) { o.tapFloor = f }
}

// WithFailClosed sets what happens when the store cannot decide (a Redis
// store unreachable without a fallback): false, the default, admits the
// call; true rejects it with the overload code. Either way the Event
// reports a store error. A repeated call replaces the setting.
func WithFailClosed(on bool) Option { return func(o *options) { o.failClosed = on } }

// WithClock sets the clock of the Limiter's own timing: the retry windows
// the tap handle remembers. It changes neither the store's clock (give the
// store the same clock in simulations) nor the deadline check, which
// compares with the real deadline of the call. nil restores the default,
// time.Now. For tests and simulations; a repeated call replaces it.
func WithClock(c floodgate.Clock) Option {
	return func(o *options) {
		o.clock = c
		if c == nil {
			o.clock = floodgate.ClockFunc(time.Now)
		}
	}
}
