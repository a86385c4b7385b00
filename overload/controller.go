package overload

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate/overload/internal/law"
)

// A Controller runs at most a concurrency limit of calls at once, queues
// the next few in the order of their flows' fair shares, and sheds the
// rest. The limit adapts to what the server completes; it is never told
// the server's capacity. See the package doc for the law.
//
// Make one with [New]; it is safe for concurrent use and starts no
// goroutine: the calls themselves update the limit when they complete.
// The zero Controller is not usable.
type Controller struct {
	o options

	// mu guards every field below but untapped. A method named …Locked
	// expects it held and leaves it held; one named …AndUnlock releases it.
	mu       sync.Mutex
	st       law.State
	inflight int
	queued   int
	inside   int     // calls Enter let in that have not ended: queued anywhere, or running
	owed     int     // of those, places given up (the flows' owed summed)
	top      decayed // the most calls any flow was let in lately, per weight
	flows    map[flowKey]*flow
	weights  float64 // the weights of the flows remembered, summed
	holding  []*flow // the flows with calls inside; their order breaks ties
	idle     []*flow // from idleHead on: flows to forget once idle for forgetAfter, oldest first
	idleHead int
	free     []*flow
	active   [nPriorities][]*flow            // flows with waiting calls, by priority; their order breaks ties
	index    [nPriorities][nIndexes]flowHeap // the flows by what is asked of them (index.go)
	epoch    time.Time                       // the origin of the byEntered keys
	running  [nPriorities]int                // calls holding a slot, by priority
	vclock   [nPriorities]float64            // start-time fair queueing's virtual time

	// Since the latest step.
	n       int
	sum     time.Duration
	bound   bool
	waitSum time.Duration
	waitN   int

	wait                time.Duration // the latest step's mean wait
	lastShed            time.Time
	offered, shedLately decayed // calls offered (entered, or untapped at Acquire) and shed, lately
	state               State
	since               time.Time
	cpu                 float64
	sched               time.Duration
	admitted, waited    uint64
	shed                [nShedCauses]uint64
	untapped            atomic.Uint64
}

// New returns a Controller. It returns an error wrapping
// [floodgate.ErrInvalidOption], naming the option, when the configuration
// is invalid.
func New(opts ...Option) (*Controller, error) {
	o := options{now: time.Now}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.retry == 0 {
		o.retry = defaultRetryAfter
	}
	c := &Controller{o: o, flows: make(map[flowKey]*flow)}
	for i := range c.index {
		c.index[i] = newIndexes()
	}
	now := o.now()
	c.st = law.Start(c.bounds(), now)
	c.since, c.epoch = now, now
	return c, nil
}

// defaultRetryAfter is the retry delay of a shed call (WithRetryAfter):
// two control steps, by when the limit has been decided again with the
// load the shed calls left.
const defaultRetryAfter = 2 * law.Interval

// bounds returns the limit's bounds in force.
func (c *Controller) bounds() law.Bounds {
	b := law.Bounds{Min: float64(c.o.minLimit), Max: float64(c.o.maxLimit)}
	if b.Min == 0 {
		b.Min = float64(runtime.GOMAXPROCS(0))
	}
	if b.Max == 0 {
		b.Max = max(b.Min, law.MaxLimit)
	}
	return b
}

// RetryAfter returns the retry delay shed calls are given (WithRetryAfter).
func (c *Controller) RetryAfter() time.Duration { return c.o.retry }
