package redisstore

import "time"

// SetInstancePeriod sets how often stores register on Redis, for tests
// that need stores to count each other within a fraction of a second. It
// returns a function that restores the period.
func SetInstancePeriod(d time.Duration) (restore func()) {
	old := testInstancePeriod.Swap(int64(d))
	return func() { testInstancePeriod.Store(old) }
}

// Linger is how long a full bucket's key stays, for tests of TTLs.
const Linger = linger
