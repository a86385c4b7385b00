//go:build race

package otelfloodgate

// raceEnabled reports a race-detector build, where sync.Pool drops some of
// what it is given and allocation counts say nothing of a normal build.
const raceEnabled = true
