//go:build race

package httplimit_test

// raceEnabled reports a race-detector build, where sync.Pool drops some of
// what it is given and allocation counts say nothing of a normal build.
const raceEnabled = true
