// Package remote is the vocabulary of stores that call a server to decide
// (redisstore): how a call to the server failed, the state of the breaker
// that spares it, and the rounds of a rate shared among members
// ([ShareRequest]). It lives apart from the stores so that a metrics
// package (promfloodgate) can observe them, and the RLQS server (rls) share
// its limits through them, without importing them or their client library.
package remote

// An ErrorKind classifies the error of a remote store's call to its server
// into a small fixed set, so that it can label a metric without adding
// series per message.
type ErrorKind uint8

const (
	// KindNone: the call succeeded.
	KindNone ErrorKind = iota
	// KindTimeout: the call missed its deadline (the context's, a network
	// timeout, or the wait for a pooled connection).
	KindTimeout
	// KindCanceled: the caller's context ended (canceled, or its deadline,
	// earlier than the store's, passed) before the server answered.
	KindCanceled
	// KindConnection: the connection was refused, reset or closed, the
	// address did not resolve, or the client is closed.
	KindConnection
	// KindCluster: the server cannot serve the key now: a cluster
	// redirection, a failover in progress, or a data set still loading
	// (for Redis: MOVED, ASK, TRYAGAIN, CLUSTERDOWN, CROSSSLOT, READONLY,
	// MASTERDOWN, LOADING).
	KindCluster
	// KindScript: the server-side script or command failed (for Redis: a
	// Lua error, WRONGTYPE on a key that is not a bucket, BUSY) or its
	// reply was short.
	KindScript
	// KindOther: any other error.
	KindOther
	// KindBreakerOpen: no call was made, as the open breaker spared the
	// server.
	KindBreakerOpen
)

var kindNames = [...]string{"none", "timeout", "canceled", "connection", "cluster", "script", "other", "breaker_open"}

// String returns the kind's lower-case name, such as "timeout".
func (k ErrorKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// A BreakerState is a state of a remote store's circuit breaker.
type BreakerState uint8

const (
	// BreakerClosed: decisions go to the server.
	BreakerClosed BreakerState = iota
	// BreakerOpen: decisions go to the failure policy without a call, until
	// the cooldown ends.
	BreakerOpen
	// BreakerHalfOpen: the cooldown ended and a decision probes the server;
	// the others still go to the failure policy. The probe's success closes
	// the breaker, its failure opens it again.
	BreakerHalfOpen
)

var breakerNames = [...]string{"closed", "open", "half-open"}

// String returns the state's lower-case name: "closed", "open" or
// "half-open".
func (s BreakerState) String() string {
	if int(s) < len(breakerNames) {
		return breakerNames[s]
	}
	return "unknown"
}
