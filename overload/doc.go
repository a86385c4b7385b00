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
//  1. Run at most a limit of calls at once. Calls admitted beyond what the
//     server runs at once do not make it faster: they queue in the Go
//     scheduler, on a lock or in a pool, and every call slows down.
//  2. Count every call from the moment it enters (the tap handle calls
//     [Controller.Enter]) to its end. A CPU-bound handler runs to its end
//     before the next call's goroutine starts, so a CPU-bound server's
//     queue is the scheduler's run queue, where no interceptor sees it.
//     The server holds the slots plus what they complete in the queue
//     target: one completion's worth, at least 5 ms while more than a
//     tenth of the calls offered lately were shed (an overload) and 25 ms
//     otherwise, so that a server below its capacity absorbs the bursts of
//     random arrivals. The rest is shed before its request is read.
//  3. The limit starts at GOMAXPROCS, what the CPUs run at once, and never
//     goes below it. In a control step (every 100 ms with 16 completions)
//     in which a call found every slot taken, it grows (doubling until the
//     first cut, then by a quarter) while the calls' mean service time
//     stays within 1.5× of the least recent one, the baseline, and is cut
//     to what the throughput needs at the baseline when it does not (the
//     limit times baseline over mean: Little's law). After a growth that
//     was cut, it holds for twice as many steps as the last such hold, from
//     one step up to 256, before it grows again, so that a server at its
//     capacity rarely slows its calls to probe for more. A step in which no call waited
//     changes nothing, so an idle server is never cut.
//  4. A call whose deadline leaves less than its expected wait plus the
//     baseline is shed at once: its work would be wasted.
//  5. An admitted call of a millisecond or more yields the CPU once before
//     it runs, so that the connections' readers and writers, which the Go
//     scheduler would run after it, read requests and send replies first.
//
// Each step reads only the server's own calls, not a CPU reading, and
// needs no warm-up. docs/DESIGN.md (decisions 4b and 4c) records the laws
// tried before and the measurements that decided; BENCHMARKS.md, where the
// law meets its targets and where it does not yet.
//
// # Fair shedding
//
// A freed slot goes to the highest [Priority] waiting, then by start-time
// fair queueing to the [Flow] whose calls have started least for its
// weight. A call never waits for slots that lower priorities hold: while
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
// floods.
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
