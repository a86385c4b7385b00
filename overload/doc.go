// Package overload keeps a server at its capacity under any overload,
// without being told that capacity: it runs a bounded number of calls at
// once, queues a few more where their wait is visible, and sheds the rest,
// from the flows (tenants) over their fair share first.
//
//	ctrl, err := overload.New(overload.WithLogger(logger))
//	p, err := ctrl.Acquire(ctx, overload.Flow{Key: tenantID, Weight: 1})
//	if err != nil {
//		return err // *overload.ShedError, or ctx's error
//	}
//	defer p.Done()
//
// middleware.WithOverload puts a Controller in front of a gRPC server's
// handlers, after the tenants' quotas, and its tap handle turns away calls
// that would be shed before their requests are read.
//
// # The law
//
//  1. Run at most a limit of calls at once; queue the next in the
//     controller. Calls admitted beyond what the server runs at once do not
//     make it faster: they queue in the Go scheduler, on a lock or in a
//     pool, where nobody sees the wait, and every call slows down.
//  2. The limit starts at GOMAXPROCS, what the CPUs run at once, and never
//     goes below it. In a control step (every 100 ms with 16 completions)
//     where a call found every slot taken, it grows by a quarter while the
//     calls' mean service time stays within 1.5× of the least recent one
//     (the baseline), and is cut to where it would be within 1.5× when it
//     does not. A CPU-bound handler thus runs about one call per CPU; one
//     that waits on a pool of N runs about N.
//  3. A call waits at most twice the target: three completions' worth of
//     time, and at least 20 ms, since a busy Go server reads its sockets
//     about every 10 ms. The queue holds what the slots complete in the
//     target; past that, calls are shed. A call whose deadline leaves less
//     than its expected wait plus the service time is shed at once.
//  4. A step in which no call waited changes nothing, so an idle server,
//     however slow a neighbour makes it, is never cut.
//
// Each step reads only the server's own calls, so the law holds from the
// first call of a server started under load, whatever a call costs and
// wherever the process runs. docs/DESIGN.md (decision 4b) records the
// laws tried before and the measurements that decided.
//
// # Fair shedding
//
// A freed slot goes to the highest [Priority] waiting, then by start-time
// fair queueing to the [Flow] whose calls have started least for its
// weight. When the queue is full, the flow holding the most slots and
// places for its weight loses its oldest waiting call to a call of a flow
// further below its share, or the arriving call is shed when its own flow
// is the one over its share. So a tenant under its weighted max-min fair
// share keeps its calls while another floods. A tap handle asks
// [Controller.Overloaded] the same question before a request is read.
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
