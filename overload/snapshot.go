package overload

import (
	"time"
)

// State is the controller's regime.
type State uint8

const (
	// Open: nothing has been shed for a second.
	Open State = iota
	// Shedding: calls are being shed.
	Shedding
)

var stateNames = [...]string{"open", "shedding"}

// String returns the state's lower-case name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// A Snapshot is the controller's observable state. Its fields keep their
// meaning from release to release; new ones may be added.
type Snapshot struct {
	// State is the regime and Since when it began.
	State State
	Since time.Time
	// Limit is the concurrency limit, Inflight the calls holding a slot,
	// Queued those waiting for one in the controller and QueueCap how
	// many may wait; Inside counts the calls Enter let in that have not
	// ended, wherever they wait.
	Limit                    float64
	Inflight, Queued, Inside int
	QueueCap                 int
	// Latency is the mean service time (from admission to Done) of the
	// latest control step's calls, Baseline the least such mean of the
	// recent steps: what a call costs when it does not queue.
	Latency, Baseline time.Duration
	// Wait is the mean wait for a slot of the calls that waited in the
	// latest step, and Target the queue target: the queue holds what the
	// slots complete in it, and a call waits for a slot at most twice it.
	Wait, Target time.Duration
	// Throughput is how many calls per second complete, smoothed: while
	// calls are shed, the server's capacity.
	Throughput float64
	// CPU and SchedP99 are the guard's latest readings (WithGuard); 0
	// without a guard.
	CPU      float64
	SchedP99 time.Duration
	// Admitted counts admitted calls and Waited those of them that waited
	// for a slot, since the controller was made; ShedBy and ShedTotal
	// count the shed calls.
	Admitted, Waited uint64
	// Untapped counts calls that reached Acquire without Enter having
	// counted them as they entered: a gRPC server without the tap handle
	// (use middleware's Limiter.ServerOptions), whose calls can queue in
	// the Go scheduler where the controller cannot bound them.
	Untapped uint64

	shed [nShedCauses]uint64 // by cause
}

// ShedBy returns the calls shed for cause since the controller was made: 0
// for a cause this release does not know.
func (s Snapshot) ShedBy(cause ShedCause) uint64 {
	if int(cause) < len(s.shed) {
		return s.shed[cause]
	}
	return 0
}

// ShedTotal returns the calls shed for every cause since the controller
// was made.
func (s Snapshot) ShedTotal() uint64 {
	var n uint64
	for _, v := range s.shed {
		n += v
	}
	return n
}

// Snapshot returns the controller's observable state.
func (c *Controller) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshotLocked()
}

// snapshotLocked is Snapshot under the lock.
func (c *Controller) snapshotLocked() Snapshot {
	floor := c.floorLocked(c.o.now())
	return Snapshot{
		State: c.state, Since: c.since,
		Limit: c.st.Limit, Inflight: c.inflight, Queued: c.queued, QueueCap: c.st.QueueCap(floor), Inside: c.inside,
		Latency: c.st.Latency, Baseline: c.st.Baseline, Wait: c.wait, Target: c.st.Target(floor),
		Throughput: c.st.Throughput, CPU: c.cpu, SchedP99: c.sched,
		Admitted: c.admitted, Waited: c.waited, Untapped: c.untapped.Load(), shed: c.shed,
	}
}
