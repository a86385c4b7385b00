// Package rlqstest provides Envoy, an RLQS (rate_limit_quota) client for tests
// that behaves as Envoy's rate_limit_quota HTTP filter does, quirks included,
// so that an RLQS server can be tested against what Envoy really does rather
// than what the API documents.
//
// # Sources
//
// Every behaviour cites the Envoy source it reproduces, with the tags of the
// research brief (rlqs-brief.md, "What Envoy's filter does"):
//
//   - GC: source/extensions/filters/http/rate_limit_quota/global_client_impl.cc @c33e7f8
//   - F:  source/extensions/filters/http/rate_limit_quota/filter.cc @1736899
//   - P:  source/extensions/filters/http/rate_limit_quota/filter_persistence.cc @93e15bf
//   - TB: source/common/common/token_bucket_impl.cc (AtomicTokenBucketImpl, with the ENVOY_BUG guard)
//
// These were read, not run against a real Envoy.
//
// # Model
//
// An Envoy holds one stream and one set of buckets, as Envoy holds one client
// per (RLQS target, domain) for the whole process (P:57-61). A bucket is
// named by its BucketId map; Request decides one request of it. The first
// request of a bucket creates it, opens the stream if this is the first
// bucket ever (GC:166-178) and sends a one-bucket report at once (GC:207-218).
// Report sends the periodic report of every bucket (GC:130-147); Run calls it
// every Settings.ReportInterval. Responses from the server are applied as they
// arrive: assignments, abandons, TTLs and the expiry fallback (GC:292-551).
//
// Envoy's timers (assignment TTL, fallback timeout) are evaluated lazily
// against Settings.Now whenever the Envoy is used, as if each had fired at its
// deadline, so a fake clock drives them without sleeping.
//
// # Concurrency
//
// All methods of Envoy are safe for concurrent use. Responses are applied by
// one goroutine per stream, started when the stream opens (at the first
// Request, or at a Report that reconnects) and stopped by Close. Periodic
// reporting runs only inside Run, which the caller owns. Tests that must see a
// response applied before going on wait with WaitReceived.
//
// # Zero value
//
// The zero Envoy is not usable; build one with NewEnvoy. The zero Settings
// behave as an Envoy configured with no no_assignment_behavior and no
// expired_assignment_behavior: allow all before the first assignment and
// after it expires, reports every 5 s.
package rlqstest
