package throttle

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/floodgate-go/floodgate"
)

// Defaults of [NewAdaptive], [NewBudget] and [New].
const (
	// DefaultK is the adaptive throttle's multiplier: a client keeps
	// sending up to about twice what its backend accepts (the SRE book's
	// choice; smaller is more aggressive).
	DefaultK = 2.0
	// DefaultWindow is how far back both the throttle and the budget
	// count, as in the SRE book.
	DefaultWindow = 2 * time.Minute
	// DefaultRetryRatio and DefaultMinRetriesPerSecond shape the retry
	// budget: retries may add a tenth to the requests, plus 10 a second so
	// that a client with little traffic can still retry (Finagle's
	// RetryBudget has the same two knobs).
	DefaultRetryRatio          = 0.1
	DefaultMinRetriesPerSecond = 10.0
)

// An Adaptive throttle decides, on the client, whether to send a request
// to a backend that has been rejecting requests, as the Google SRE book's
// "client-side throttling" describes: over a sliding window it counts the
// requests the application attempted and those the backend accepted, and
// drops a new request locally with probability
//
//	max(0, (requests − K·accepts) / (requests + 1))
//
// While the backend accepts everything, nothing is dropped. Once it
// rejects, the client keeps sending up to about K times what it accepts
// and drops the rest without touching the network, so a backend that sheds
// load is not also spending its capacity on rejecting the same callers'
// retries. Requests dropped locally count as requests, so the drop rate
// follows the backend's acceptance rate in both directions.
//
// Use one Adaptive per backend (per target). An Adaptive is safe for
// concurrent use.
type Adaptive struct {
	k     float64
	now   func() time.Time
	rand  func() float64
	mu    sync.Mutex
	win   window // requests, accepts
	total [2]uint64
}

// NewAdaptive returns a throttle with multiplier k, which must be ≥ 1:
// [DefaultK] is the usual choice. Of the options it uses WithWindow and
// WithClock.
func NewAdaptive(k float64, opts ...Option) (*Adaptive, error) {
	o, err := build(opts)
	if err != nil {
		return nil, err
	}
	if err := checkK("K", k); err != nil {
		return nil, err
	}
	return newAdaptive(k, o), nil
}

// checkK checks the multiplier k, which the error calls name.
func checkK(name string, k float64) error {
	if !(k >= 1) || math.IsInf(k, 1) {
		return invalid(name, k, "a finite value ≥ 1")
	}
	return nil
}

func newAdaptive(k float64, o options) *Adaptive {
	return &Adaptive{k: k, now: o.clock.Now, rand: o.rand, win: newWindow(o.window)}
}

// Allow counts one request and reports whether to send it. A false answer
// means the request should fail at once, locally, with the error the
// backend would likely have given.
func (a *Adaptive) Allow() bool {
	now := a.now()
	a.mu.Lock()
	p := a.dropProbability(now)
	a.win.add(now, 0, 1)
	a.total[0]++
	a.mu.Unlock()
	return p <= 0 || a.rand() >= p
}

// Accept counts one request that the backend accepted: it answered it
// other than by rejecting it for overload, whatever the answer.
func (a *Adaptive) Accept() {
	now := a.now()
	a.mu.Lock()
	a.win.add(now, 1, 1)
	a.total[1]++
	a.mu.Unlock()
}

// DropProbability returns the probability that Allow drops the next
// request.
func (a *Adaptive) DropProbability() float64 {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dropProbability(now)
}

func (a *Adaptive) dropProbability(now time.Time) float64 {
	req, acc := a.win.sums(now)
	return max(0, (req-a.k*acc)/(req+1))
}

// A Budget bounds retries to a share of a client's requests over a sliding
// window, so that retries cannot multiply the load on a backend that is
// already failing: a retry may go out while the retries in the window stay
// within ratio × requests + minPerSecond × the window's seconds. Envoy's
// retry budgets and Finagle's RetryBudget work the same way.
//
// A Budget is safe for concurrent use.
type Budget struct {
	ratio float64
	min   float64 // retries the window allows whatever the requests
	now   func() time.Time
	mu    sync.Mutex
	win   window // requests, retries
}

// NewBudget returns a retry budget of ratio (in [0, 1]) of the requests
// plus minPerSecond (≥ 0) retries a second; [DefaultRetryRatio] and
// [DefaultMinRetriesPerSecond] are the usual choice. Of the options it
// uses WithWindow and WithClock.
func NewBudget(ratio, minPerSecond float64, opts ...Option) (*Budget, error) {
	o, err := build(opts)
	if err != nil {
		return nil, err
	}
	if err := checkBudget("", ratio, minPerSecond); err != nil {
		return nil, err
	}
	return newBudget(ratio, minPerSecond, o), nil
}

// checkBudget checks a budget's arguments; the error names them after
// option, the option that gave them, if any.
func checkBudget(option string, ratio, minPerSecond float64) error {
	if option != "" {
		option += ": "
	}
	if !(ratio >= 0 && ratio <= 1) {
		return invalid(option+"retry ratio", ratio, "a value in [0, 1]")
	}
	if !(minPerSecond >= 0) || math.IsInf(minPerSecond, 1) {
		return invalid(option+"minimum retries per second", minPerSecond, "a finite value ≥ 0")
	}
	return nil
}

func newBudget(ratio, minPerSecond float64, o options) *Budget {
	return &Budget{ratio: ratio, min: minPerSecond * o.window.Seconds(), now: o.clock.Now, win: newWindow(o.window)}
}

// Request counts a request's first attempt.
func (b *Budget) Request() {
	now := b.now()
	b.mu.Lock()
	b.win.add(now, 0, 1)
	b.mu.Unlock()
}

// Retry reports whether the budget has room for one more retry, and
// counts it if so.
func (b *Budget) Retry() bool {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	req, ret := b.win.sums(now)
	if ret+1 > b.ratio*req+b.min {
		return false
	}
	b.win.add(now, 1, 1)
	return true
}

// An Option configures [New], [NewAdaptive], [NewBudget] and [NewQuota];
// each says which options it uses. Each applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of [floodgate.ErrInvalidOption]).
type Option func(*options)

type options struct {
	window   time.Duration
	clock    floodgate.Clock
	rand     func() float64
	k        float64
	ratio    float64
	minRetry float64
	attempts int
	backoff  time.Duration
	quotaKey func(ctx context.Context, method string) string
	cost     int
	failFast bool
}

// WithWindow sets how far back requests, accepts and retries are counted,
// at least 1 s; the default is [DefaultWindow]. A shorter window reacts
// faster to a backend's recovery and forgets its overload sooner. A
// repeated call replaces it.
func WithWindow(d time.Duration) Option { return func(o *options) { o.window = d } }

// WithClock sets the clock the windows read, for tests and simulations. A
// nil c restores the default, time.Now. A repeated call replaces it.
func WithClock(c floodgate.Clock) Option { return func(o *options) { o.clock = c } }

func invalid(option string, v any, want string) error {
	return fmt.Errorf("%w: throttle: %s = %v, want %s", floodgate.ErrInvalidOption, option, v, want)
}

func build(opts []Option) (options, error) {
	o := options{
		window:   DefaultWindow,
		clock:    floodgate.ClockFunc(time.Now),
		rand:     rand.Float64,
		k:        DefaultK,
		ratio:    DefaultRetryRatio,
		minRetry: DefaultMinRetriesPerSecond,
		attempts: 1,
		backoff:  DefaultBackoff,
		cost:     1,
	}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.window < time.Second {
		return o, invalid("WithWindow", o.window, "at least 1s")
	}
	if o.clock == nil {
		o.clock = floodgate.ClockFunc(time.Now)
	}
	return o, nil
}
