// Package overload keeps a server at its real capacity under any overload:
// it admits calls up to an adaptive concurrency limit, lets the next few
// wait briefly for a slot, and sheds the rest, from the flows (tenants) that
// hold more than their fair share first.
//
//	ctrl, err := overload.New(overload.WithLogger(logger))
//	p, err := ctrl.Acquire(ctx, overload.Flow{Key: tenantID, Weight: 1})
//	if err != nil {
//		return err // *overload.ShedError, or ctx's error
//	}
//	defer p.Done()
//
// middleware.WithOverload puts a Controller in front of a gRPC server's
// handlers, after the tenants' quotas; nothing else is needed.
//
// # The model
//
// A server completes calls at some rate, its capacity, which nobody tells
// it and which moves with the cost of a call, the other processes on the
// host and its dependencies. Calls admitted beyond what it can run at once
// do not make it faster: they queue inside it (in the Go scheduler, on a
// lock, in a connection pool), every call gets slower, and past the callers'
// deadlines all of them fail. The controller measures that queueing where
// it happens:
//
//   - Before the handlers. A gRPC server starts a goroutine per call, and a
//     handler that computes runs to its end once started, so when the CPU
//     is saturated calls wait for the Go scheduler before any interceptor
//     runs. The tap handle stamps each call's arrival ([Arrived]); when the
//     wait from arrival to Acquire exceeds a target ([Law.QueueTarget], a
//     few calls' worth), the controller limits admissions to what the
//     server completes, and steers that rate by the wait.
//   - Inside the handlers. A handler that waits on a pool, a lock or a
//     dependency queues there; the controller keeps a concurrency limit
//     that grows while calls complete within [Law.Tolerance] times a
//     baseline (the latency of a call that does not queue, measured in
//     short probes at a reduced limit) and shrinks when they queue.
//
// See [Law] for the control law and docs/DESIGN.md for why this law.
//
// CPU use is not the target. A host's other processes, a CPU quota and the
// time a dependency takes all move a CPU reading without moving what the
// server can complete, and on a shared host the reading a sampler gets may
// not even be this server's. A cpugate.Gate given with [WithGuard]
// supplies readings that explain the controller's decisions in its logs
// and snapshots, and check them: a long queueing delay while this
// server's own CPU is low is a neighbour's and sets no rate
// ([Law.RateCPU]; a gate whose sampler can peek, such as the cgroup and
// process samplers, is asked for the use since its latest reading, which
// may predate the queue), and a pinned reading trims a rate the queueing delay
// has set towards what the server completes and keeps it from growing,
// because a Go server whose CPU never idles reads its sockets late
// ([Law.SaturatedCPU]). [Law.GuardCPU] makes them cut the
// concurrency limit too.
//
// A cut that does not bring the latency down means the calls are slow, not
// queued: the controller then measures its baseline again instead of
// cutting further, so a noisy neighbour or a slow dependency does not
// ratchet the server down to its floor. An idle server is never shed: the
// limit changes only in intervals in which it bound.
//
// # Fair shedding
//
// Calls that find every slot taken wait in a queue about as long as the
// limit. A freed slot goes to the highest [Priority] waiting, then to the
// [Flow] with the fewest calls in flight for its weight. When the queue is
// full, the flow that holds the most slots and places for its weight loses
// its newest waiting call to a call of a flow further below its share, or
// the arriving call is shed when its own flow is the one over its share.
// So a tenant under its weighted max-min fair share keeps its calls while
// another floods, and the flood gets whatever the others leave.
//
// A limited admission rate is divided the same way, over the flows' arrival
// rates smoothed over about a second: each flow admits up to the water level
// times its weight from a bucket of its own, and what a full bucket would
// overflow with is spare, for a flow out of tokens to take: the share a
// quiet flow leaves unused goes to the flows asking for more. The tap
// handle asks
// [Controller.Overloaded], which turns a flow over its share away before its
// request is read and takes a passing call's token, so that a server that
// reads many calls at once lets no more of them through than the rate.
//
// # Concurrency
//
// A Controller is safe for concurrent use and starts no goroutine: the
// calls themselves update the limit, at most once per [Law.Interval], when
// they complete. Each Acquire and Done takes one short lock; a call that
// waits also makes a channel and a timer. Callbacks ([WithOnChange]) and
// log lines run after the lock is released.
//
// # Zero values
//
// The zero [Law] is the default law. The zero Controller is not usable:
// make one with [New]. The zero [Permit]'s Done does nothing.
package overload
