package cpugate

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
)

// DefaultInterval is the gate's default sampling interval, the one
// [WithInterval] replaces.
const DefaultInterval = 250 * time.Millisecond

// smoothing is the time constant of the smoothed CPU in [Snapshot]. It is for
// dashboards only: the policies act on raw readings, because smoothing would
// delay every reaction by about this long, and the cooldown already filters
// noise on the way back.
const smoothing = time.Second

// errRunning is returned by [Gate.Run] when another Run of the same gate is
// in progress: two loops would sample twice as often and split the
// sampler's intervals between them.
var errRunning = errors.New("cpugate: gate already running")

// A Snapshot is the gate's observable state after its latest reading.
type Snapshot struct {
	// State is the regime and Since when it began.
	State State
	Since time.Time
	// Scale is the factor limits are multiplied by.
	Scale float64
	// CPU is the latest reading's CPU fraction and Smoothed its exponential
	// moving average (time constant 1 s).
	CPU, Smoothed float64
	// SchedP99 is the latest reading's guard signal, 0 when not measured.
	SchedP99 time.Duration
	// Source is the latest reading's source label.
	Source string
	// At is when the latest reading was observed; zero before the first.
	At time.Time
	// Cooldown is the cooldown in force.
	Cooldown time.Duration
	// Failures counts failed samples since the gate was made. A failed
	// sample changes nothing else.
	Failures uint64
}

// A Gate turns CPU readings into one scale that every limit is multiplied
// by, in (0, 1]: 1 means full limits. The scale changes only when a reading
// is observed, as its [Policy] decides; a failed sample changes nothing but
// the failure count. The gate samples only when driven: by [Gate.Run], the
// caller's loop, or by [Gate.SampleAt] and [Gate.Observe] for tests and
// custom loops. Nothing runs in the background on its own.
//
// [Gate.Scale], [Gate.State] and [Gate.Apply] are one atomic load each and
// safe to call from any number of goroutines; they are meant for the request
// path. Every method is safe for concurrent use.
//
// A nil *Gate scales nothing: Scale returns 1, State Open and Apply its
// argument, so optional gates need no nil checks. Make Gates with [New]; the
// zero Gate is not usable.
type Gate struct {
	scale atomic.Uint64 // math.Float64bits of the scale
	state atomic.Uint32

	sampler Sampler
	o       options

	running atomic.Bool

	sampleMu sync.Mutex // serializes sampler calls: samplers are not concurrent-safe

	mu      sync.Mutex // guards below; never held while calling out
	ctl     Control
	snap    Snapshot
	failing bool
}

type options struct {
	interval time.Duration
	policy   Policy
	logger   *slog.Logger
}

// An Option configures a [Gate]. [New] applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of [floodgate.ErrInvalidOption]).
type Option func(*options)

// WithInterval sets how often [Gate.Run] samples. It must be at least 1 ms,
// the shortest interval the samplers turn into a reading; the default is
// [DefaultInterval]. A repeated call replaces the interval.
func WithInterval(d time.Duration) Option { return func(o *options) { o.interval = d } }

// WithPolicy sets the policy that turns readings into a scale: [Adaptive]
// (the default), [Fixed] (the classic: 80%, ×0.2, 5 s), or one of your own.
// [New] validates it; nil is invalid. A repeated call replaces the policy.
func WithPolicy(p Policy) Option { return func(o *options) { o.policy = p } }

// WithLogger sets the logger for the gate's events: each state change at
// Warn (entering Shedding) or Info (Ramping, Open), and the first failed
// sample after a good one at Warn. A nil logger, the default, logs nothing.
// A repeated call replaces the logger.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// New returns a gate driven by sampler, with full limits (scale 1) until the
// first hot reading. It starts nothing; call [Gate.Run] to sample. It returns
// an error wrapping [floodgate.ErrInvalidOption] that names the offending option or
// field when the configuration is invalid.
func New(sampler Sampler, opts ...Option) (*Gate, error) {
	if sampler == nil {
		return nil, invalid("sampler", "nil", "a Sampler")
	}
	o := options{interval: DefaultInterval, policy: Adaptive{}}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.interval < minInterval {
		return nil, invalid("WithInterval", o.interval, "at least 1ms")
	}
	if o.policy == nil {
		return nil, invalid("WithPolicy", "nil", "a Policy")
	}
	if err := o.policy.Validate(); err != nil {
		return nil, err
	}
	g := &Gate{sampler: sampler, o: o}
	g.scale.Store(math.Float64bits(1))
	g.snap.Scale = 1
	return g, nil
}

// Scale returns the factor every limit should be multiplied by, in (0, 1]:
// 1 means full limits. It is one atomic load.
func (g *Gate) Scale() float64 {
	if g == nil {
		return 1
	}
	return math.Float64frombits(g.scale.Load())
}

// State returns the gate's current regime. It is one atomic load.
func (g *Gate) State() State {
	if g == nil {
		return Open
	}
	return State(g.state.Load())
}

// Shedding reports whether the gate is in the Shedding state: limits are
// cut because the CPU is hot, or was less than a cooldown ago, rather than
// climbing back. It is one atomic load.
func (g *Gate) Shedding() bool { return g.State() == Shedding }

// Apply returns lim scaled by the gate: lim.Scale(g.Scale()). An unlimited
// limit stays unlimited, and a scaled limit keeps a burst of at least 1.
func (g *Gate) Apply(lim floodgate.Limit) floodgate.Limit {
	return lim.Scale(g.Scale())
}

// Reading returns the latest reading's CPU fraction and scheduling-latency
// p99 (0 without a SchedGuard), both 0 before the first reading: the CPU
// readings an overload.Controller's guard (overload.WithGuard) explains
// its decisions with.
func (g *Gate) Reading() (cpu float64, schedP99 time.Duration) {
	s := g.Snapshot()
	return s.CPU, s.SchedP99
}

// Snapshot returns the gate's state after its latest reading.
func (g *Gate) Snapshot() Snapshot {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.snap
}

// Run samples every interval until ctx is done, then returns ctx.Err(). The
// first sample comes one interval after the start, so that it covers a
// whole interval. Sampling failures are counted in [Snapshot.Failures] and
// do not stop the loop. Run returns an error at once if another Run of g
// is in progress.
func (g *Gate) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer g.running.Store(false)
	t := time.NewTicker(g.o.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-t.C:
			_ = g.SampleAt(now) // counted and logged by SampleAt
		}
	}
}

// SampleAt takes one sample and steps the gate with it at time now. It
// returns the sampler's error; a failed sample is counted and changes
// nothing else. Use it to drive the gate from a loop of your own, or with a
// scripted [SamplerFunc] and explicit times in tests.
func (g *Gate) SampleAt(now time.Time) error {
	g.sampleMu.Lock()
	r, err := g.sampler.Sample()
	g.sampleMu.Unlock()
	if err != nil {
		g.fail(err, now)
		return err
	}
	g.Observe(r, now)
	return nil
}

// Observe steps the gate with reading r at time now, as if a sampler had
// returned it. Times should not go backwards between calls.
func (g *Gate) Observe(r Reading, now time.Time) {
	g.mu.Lock()
	prev := g.snap
	next := g.o.policy.Step(g.ctl, r, now)
	g.ctl = next
	s := &g.snap
	if s.At.IsZero() {
		s.Smoothed = r.CPU
	} else if dt := now.Sub(s.At); dt > 0 {
		alpha := 1 - math.Exp(-float64(dt)/float64(smoothing))
		s.Smoothed += alpha * (r.CPU - s.Smoothed)
	}
	s.State, s.Since, s.Scale = next.State, next.Since, next.Scale()
	s.CPU, s.SchedP99, s.Source, s.At, s.Cooldown = r.CPU, r.SchedP99, r.Source, now, next.Cooldown
	recovered := g.failing
	g.failing = false
	snap := *s
	// Published under mu, so that concurrent Observes publish in the order
	// they stepped and the atomics never go back to an older decision.
	// A reader that loads State and then Scale (the tap handle) must not
	// see Shedding with a scale from outside it: entering Shedding, the
	// scale goes first; otherwise the state does.
	if snap.State == Shedding {
		g.scale.Store(math.Float64bits(snap.Scale))
		g.state.Store(uint32(snap.State))
	} else {
		g.state.Store(uint32(snap.State))
		g.scale.Store(math.Float64bits(snap.Scale))
	}
	g.mu.Unlock()

	if recovered && g.o.logger != nil {
		g.o.logger.LogAttrs(context.Background(), slog.LevelInfo, "cpugate: sampling recovered",
			slog.String("source", r.Source), slog.Uint64("failures", snap.Failures))
	}
	if snap.State != prev.State && g.o.logger != nil {
		level := slog.LevelInfo
		if snap.State == Shedding {
			level = slog.LevelWarn
		}
		g.o.logger.LogAttrs(context.Background(), level, "cpugate: state change",
			slog.String("from", prev.State.String()),
			slog.String("to", snap.State.String()),
			slog.Float64("cpu", snap.CPU),
			slog.Float64("scale", snap.Scale),
			slog.Duration("cooldown", snap.Cooldown),
			slog.String("source", snap.Source))
	}
}

func (g *Gate) fail(err error, now time.Time) {
	g.mu.Lock()
	g.snap.Failures++
	first := !g.failing
	g.failing = true
	n := g.snap.Failures
	g.mu.Unlock()
	if first && g.o.logger != nil {
		g.o.logger.LogAttrs(context.Background(), slog.LevelWarn, "cpugate: sample failed",
			slog.Any("error", err), slog.Uint64("failures", n), slog.Time("at", now))
	}
}
