package throttle

// WithRand replaces the random source of the adaptive throttles, for tests
// that need their drops to be reproducible.
func WithRand(f func() float64) Option { return func(o *options) { o.rand = f } }
