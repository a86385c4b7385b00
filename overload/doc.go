// Package overload keeps a server at its capacity under any overload,
// without being told that capacity: it runs a bounded number of calls at
// once, queues a few more where their wait is visible, and sheds the rest,
// from the flows (tenants) over their fair share first.
//
//	ctrl, err := overload.New(overload.WithLogger(logger))
//	f := overload.Flow{Key: tenantID, Weight: 1}
//	ctx, in := ctrl.Enter(ctx, f) // where the call enters, before its request is read
//	if !in {
//		return errOverloaded
//	}
//	p, err := ctrl.Acquire(ctx, f)
//	if err != nil {
//		return err // *overload.ShedError, or ctx's error
//	}
//	defer p.Done()
//
// middleware.NewOverload puts a Controller in front of a gRPC server's
// handlers (middleware.WithOverload, after the tenants' quotas), and its
// ServerOptions install the tap handle that calls Enter. A controller whose
// calls reach Acquire without Enter logs a warning once and counts them in
// [Snapshot].Untapped.
//
// # The law
//
// A controller runs at most a concurrency limit of calls at once, holds
// beyond them what they complete in a few milliseconds, counting each call
// from the moment it enters, sheds the rest, and moves the limit by the
// calls' own service times, not by a CPU reading. The law is stated once,
// rule by rule with its constants and their reasons, in package
// [github.com/floodgate-go/floodgate/overload/internal/law]; docs/DESIGN.md
// (decision 4c) records why it is this law.
//
// # Fair shedding
//
// A freed slot goes to the highest [floodgate.Priority] waiting, then by
// start-time fair queueing to the [Flow] whose calls have started least for
// its weight. A call never waits for slots that lower priorities hold: while
// its own and higher priorities hold fewer slots than the limit and none of
// them waits, it runs at once beside them, and no waiting call gets a slot
// until the calls running are back within the limit. When the queue is
// full, the flow holding the most slots and places for its weight loses its
// oldest waiting call to a call of a flow further below its share, or the
// arriving call is shed when its own flow is the one over its share. The
// tap handle asks the same question ([Controller.Enter]) before a request
// is read. A flow that asks for no more than an equal split of what the
// server completes (for its weight, among the flows seen in the last few
// seconds) is never shed for room nor displaced: it enters beyond the
// places, since what all such flows ask fits in the capacity. So a tenant
// under its weighted max-min fair share keeps its calls while another
// floods. These rules are the controller's, not the law's: fairqueue.go
// hands out freed slots, shed.go chooses whose place or waiting call a
// call takes, and index.go keeps the flows in the orders both ask for.
//
// # Concurrency
//
// A Controller is safe for concurrent use and starts no goroutine: the
// calls themselves step the law when they complete. Each Acquire and Done
// takes one short lock; a call that waits also makes a channel and a
// timer. Callbacks ([WithOnChange]) and log lines run after the lock is
// released.
//
// # Zero values
//
// The zero Controller is not usable: make one with [New]. The zero
// [Permit]'s Done does nothing.
package overload
