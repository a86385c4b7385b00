// Package rlsproc finds, builds and runs the rate-limit-service servers
// that the bench module's experiments measure: floodgate-rls, built from
// the repository's rls module, and envoyproxy/ratelimit's service_cmd,
// installed at a pinned version.
//
// # Binaries
//
// Both binaries live under one cache directory, floodgate-bench under the
// user's cache directory, so that every experiment reuses what another
// built or installed. [RatelimitBinary] installs service_cmd there once,
// at [RatelimitVersion]; [FloodgateBinary] rebuilds floodgate-rls on every
// call, since the point is to measure the store as it is edited. An error
// wrapping [ErrUnavailable] says why a binary cannot be had on this
// machine, as opposed to a build that failed.
//
// # Processes
//
// [Start] starts a server as the leader of a new process group, which the
// kernel kills when the driver dies; [Proc.Stop] and [Proc.Kill] signal
// the whole group. A Proc keeps the end of the server's output for the
// error that says why it stopped. Its methods may be called from any
// goroutine.
package rlsproc
