// Package rlqsclient makes a Go server a subscriber of an RLQS server
// (envoy.service.rate_limit_quota.v3, such as floodgate-rls's
// [rls.QuotaServer]), so that a fleet of servers shares one global quota per
// key, as Envoys running the rate_limit_quota filter do, with no RPC on the
// request path.
//
// # Model
//
// A [Client] is a [floodgate.Store]: middleware.New(client, tables) uses it
// as it uses the keyed store. Each key is one RLQS bucket, named by a
// BucketId ([WithBucketID]). The decision is local, in a token bucket per
// BucketId at the rate and burst the server assigned this process, its
// share of the key's limit; every take is counted, allowed or denied, and
// the counts are reported on one gRPC stream every report interval
// ([Client.Run]). The server divides each limit among the processes that
// report it, by their demand, and pushes the shares on the stream.
//
// A key's first take subscribes it: a one-bucket report goes out at once,
// as Envoy's filter sends it. Until the first assignment arrives, and after
// an assignment's time to live lapses, the key is decided by the
// no-assignment behaviour ([WithNoAssignment]). An abandon action forgets
// the key; its next take subscribes it again.
//
// # Concurrency
//
// A Client is safe for concurrent use. A take reads the key's assignment
// and takes from an in-memory bucket: it never waits on the network. The
// stream, once [Client.Report] or [Client.Run] has opened it, runs two
// goroutines, one receiving assignments and one sending subscriptions,
// which end with the stream; the periodic report is sent on Run's
// goroutine. A stream that fails is opened again by the next report.
// [Client.Close] ends the stream and waits for its goroutines.
//
// # Deviations from Envoy
//
//   - A take of n tokens is reported as n requests: RLQS counts requests,
//     and a server dividing by demand then sees a weighted caller's demand
//     in tokens, which is what it divides.
//   - Before the first assignment the default is the key's own limit,
//     enforced per process, not Envoy's allow-all (see [WithNoAssignment]).
//   - An assignment without a time to live never expires, as the API says;
//     Envoy expires it at once. Fill intervals and TTLs are read to the
//     nanosecond, not in whole seconds.
//   - A changed assignment keeps the bucket's tokens, capped at the new
//     burst; Envoy may refill it.
//   - requests_per_time_unit is ignored, as Envoy ignores it.
//
// [rls.QuotaServer]: https://pkg.go.dev/github.com/floodgate-go/floodgate/rls#QuotaServer
package rlqsclient
