package overload

import (
	"errors"
	"fmt"
	"time"

	"github.com/floodgate-go/floodgate"
)

// ErrShed is wrapped by every [ShedError]: errors.Is(err, ErrShed) tells a
// call the controller turned away from one whose context ended.
var ErrShed = errors.New("overload: shed")

// ShedCause says why a call was shed.
type ShedCause uint8

const (
	// ShedQueueFull: every slot was taken, the queue was full, and the
	// call's flow held at least its fair share of it.
	ShedQueueFull ShedCause = iota
	// ShedDisplaced: the call waited, and a call of a flow further under
	// its fair share (or of a higher priority) took its place.
	ShedDisplaced
	// ShedTimeout: the call waited for a slot for the longest wait.
	ShedTimeout
	// ShedDeadline: the call's deadline left less than its expected wait
	// plus its service time: the work would have been wasted.
	ShedDeadline
	// ShedTap: the call was turned away as it entered the server, before
	// its request was read ([Controller.Enter]).
	ShedTap
	nShedCauses
)

var shedNames = [...]string{"queue_full", "displaced", "wait_timeout", "deadline", "tap"}

// String returns the cause's lower-case name, such as "queue_full", fit for
// a metric label.
func (s ShedCause) String() string {
	if int(s) < len(shedNames) {
		return shedNames[s]
	}
	return "unknown"
}

// A ShedError is the error of a call the controller shed. It wraps
// [ErrShed].
type ShedError struct {
	Cause ShedCause
	// RetryAfter is a hint of when capacity may be free again.
	RetryAfter time.Duration
}

func (e *ShedError) Error() string { return "overload: shed (" + e.Cause.String() + ")" }

// Unwrap returns ErrShed.
func (e *ShedError) Unwrap() error { return ErrShed }

const nPriorities = 3

// prioIndex returns the index of p, one of the three priorities (a flow
// key's: Controller.flow clamps any other value to the nearest).
func prioIndex(p floodgate.Priority) int { return int(p) + 1 }

// A Flow says whose a call is, for fairness: calls of one Key share a fair
// share of the server in proportion to Weight.
type Flow struct {
	// Key names the flow: a tenant, or an anonymous caller's address. The
	// controller keeps it only while the flow has calls in flight or
	// waiting, so it must not be a buffer the caller reuses.
	Key string
	// Weight is the flow's share relative to other flows; ≤ 0 means 1.
	Weight float64
	// Priority ranks the call: a waiting call of a higher priority is
	// admitted before any of a lower one, and the queue makes room for it
	// by displacing the lowest. Within a priority, fairness decides.
	Priority floodgate.Priority
}

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
	// latest step, and Target the longest a call may wait.
	Wait, Target time.Duration
	// Throughput is how many calls per second complete, smoothed: while
	// calls are shed, the server's capacity.
	Throughput float64
	// CPU and SchedP99 are the guard's latest readings (WithGuard); 0
	// without a guard.
	CPU      float64
	SchedP99 time.Duration
	// Admitted counts admitted calls, Waited those of them that waited for
	// a slot, and Shed the shed calls by cause, since the controller was
	// made.
	Admitted, Waited uint64
	Shed             [nShedCauses]uint64
	// Untapped counts calls that reached Acquire without Enter having
	// counted them as they entered: a gRPC server without the tap handle
	// (use middleware's Limiter.ServerOptions), whose calls can queue in
	// the Go scheduler where the controller cannot bound them.
	Untapped uint64
}

// ShedTotal returns the shed calls of every cause.
func (s Snapshot) ShedTotal() uint64 {
	var n uint64
	for _, v := range s.Shed {
		n += v
	}
	return n
}

func invalid(name string, v any, want string) error {
	return fmt.Errorf("%w: overload: %s = %v, want %s", floodgate.ErrInvalidOption, name, v, want)
}
