package redisstore

import "time"

// SetInstancePeriod sets how often stores register on Redis, for tests
// that need stores to count each other within a fraction of a second. It
// returns a function that restores the period.
func SetInstancePeriod(d time.Duration) (restore func()) {
	old := testInstancePeriod.Swap(int64(d))
	return func() { testInstancePeriod.Store(old) }
}

// Stretched returns the longest stretch of Redis's budget that any store
// has applied since the last call, and resets it.
func Stretched() time.Duration { return time.Duration(stretched.Swap(0)) }
