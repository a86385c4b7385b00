package tenant

// Watcher exposes one Watch loop's state to tests, so that they can drive
// polls one at a time instead of waiting on a ticker.
type Watcher = watcher

// NewWatcher returns the state Watch would start with for path.
func (r *Registry) NewWatcher(path string) *Watcher { return r.watcher(path) }

// Poll is one iteration of Watch.
func (w *Watcher) Poll() { w.poll() }
