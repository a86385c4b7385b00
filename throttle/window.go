package throttle

import "time"

// slots is how many buckets a window is cut into: counts leave the window
// one bucket (a sixteenth of it) at a time.
const slots = 16

// window counts two quantities over a sliding window of time, in slots
// buckets. It is not safe for concurrent use; its owner locks.
type window struct {
	width int64     // one bucket, in ns
	base  time.Time // the time bucket 0 starts; set by the first add
	at    [slots]int64
	n     [slots][2]float64
}

func newWindow(d time.Duration) window {
	return window{width: max(1, int64(d)/slots)}
}

// epoch returns now's bucket number, counted from base. A clock that goes
// back before base counts as base.
func (w *window) epoch(now time.Time) int64 {
	if w.base.IsZero() {
		w.base = now
	}
	return max(0, int64(now.Sub(w.base))) / w.width
}

// add adds v to quantity i at now.
func (w *window) add(now time.Time, i int, v float64) {
	e := w.epoch(now)
	s := e % slots
	if w.at[s] != e {
		w.at[s], w.n[s] = e, [2]float64{}
	}
	w.n[s][i] += v
}

// sums returns both quantities over the window that ends at now.
func (w *window) sums(now time.Time) (a, b float64) {
	e := w.epoch(now)
	for s := range slots {
		if w.at[s] > e-slots && w.at[s] <= e {
			a += w.n[s][0]
			b += w.n[s][1]
		}
	}
	return a, b
}
