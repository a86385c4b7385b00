package rls

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-go/floodgate"
)

// An Option configures a [Service]. [New] applies the options in order to
// a copy of the defaults, skipping nil ones, then validates the result
// (the convention of floodgate.ErrInvalidOption).
type Option func(*options)

type options struct {
	headers    bool
	near       float64
	resvMax    int
	resvTTL    time.Duration
	topK       int
	registerer prometheus.Registerer
	logger     *slog.Logger
	clock      floodgate.Clock
	onReload   func(path string, cfg *Config, err error)
	merge      bool
}

func defaults() options {
	return options{near: 0.8, resvMax: 1 << 16, resvTTL: 5 * time.Minute, topK: 64}
}

// WithResponseHeaders sets whether responses carry the x-ratelimit-limit,
// x-ratelimit-remaining and x-ratelimit-reset headers (Envoy adds them to
// the client's response), as envoyproxy/ratelimit does with
// LIMIT_RESPONSE_HEADERS_ENABLED. Off by default; a repeated call replaces
// the setting.
func WithResponseHeaders(on bool) Option { return func(o *options) { o.headers = on } }

// WithNearLimitRatio sets the share of a bucket's burst past which an
// admitted decision counts as near the limit: it does when the bucket is
// left with fewer than (1 − ratio) × burst tokens. 0.8 by default, as
// envoyproxy/ratelimit's NEAR_LIMIT_RATIO; it must be in (0, 1]. A repeated
// call replaces it.
func WithNearLimitRatio(ratio float64) Option { return func(o *options) { o.near = ratio } }

// WithReservations sets how many reservations (requests naming themselves
// with a [ReservationKey] entry) the service keeps for the charge on their
// response, and for how long: 65536 and 5 minutes by default. A
// reservation pushed out or expired keeps its estimate charged. max must
// be ≥ 1 and ttl > 0; a repeated call replaces both.
func WithReservations(max int, ttl time.Duration) Option {
	return func(o *options) { o.resvMax, o.resvTTL = max, ttl }
}

// WithTopK sets how many descriptors the over-limit summary tracks, in
// [1, 10000], 64 by default: every descriptor with more than 1/k of the
// over-limit decisions is listed (Space-Saving). A repeated call replaces
// it.
func WithTopK(k int) Option { return func(o *options) { o.topK = k } }

// WithRegisterer registers the service's metrics with reg. nil (the
// default) registers them nowhere; [Service.Collectors] still returns
// them. A repeated call replaces the registerer.
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.registerer = reg } }

// WithLogger sets the logger of config reloads: one line per load, at Info
// when it applied and at Error, with the problems, when it was rejected.
// nil (the default) logs nothing; a repeated call replaces it.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithOnReload sets a function called after every [Service.Load] (so
// every reload of [Service.Watch]) with the path, the config put in force
// and nil, or nil and the error that kept the previous config: for tests,
// health checks and alerts. It runs on the loading goroutine. nil, the
// default, calls nothing; a repeated call replaces the function.
func WithOnReload(f func(path string, cfg *Config, err error)) Option {
	return func(o *options) { o.onReload = f }
}

// WithMergeDomains sets whether the files of a config directory that name
// one domain are merged into it, as envoyproxy/ratelimit does with
// MERGE_DOMAIN_CONFIG=true: each file's top-level descriptors join the
// domain's, in file name order. A descriptor (key and value) at the top
// level of two files is still refused, naming both; the descriptors below
// it are not merged. The files must not set failure_policy differently;
// a tenant config's domain is never merged. Off by default (a second file
// naming a domain is refused); it applies to [Service.Load],
// [Service.Watch] and [LoadConfig]. A repeated call replaces the setting.
func WithMergeDomains(on bool) Option { return func(o *options) { o.merge = on } }

// WithClock sets the clock that times reservations, the system clock by
// default (nil). Buckets are timed by the store. A repeated call replaces
// it.
func WithClock(c floodgate.Clock) Option { return func(o *options) { o.clock = c } }

func (o *options) validate() error {
	switch {
	case math.IsNaN(o.near) || o.near <= 0 || o.near > 1:
		return invalid("WithNearLimitRatio(%v): not in (0, 1]", o.near)
	case o.resvMax < 1:
		return invalid("WithReservations(%d, %v): max below 1", o.resvMax, o.resvTTL)
	case o.resvTTL <= 0:
		return invalid("WithReservations(%d, %v): ttl not positive", o.resvMax, o.resvTTL)
	case o.topK < 1 || o.topK > 10000:
		return invalid("WithTopK(%d): not in [1, 10000]", o.topK)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("rls: %s: %w", fmt.Sprintf(format, args...), floodgate.ErrInvalidOption)
}
