//go:build !race

package otelfloodgate

const raceEnabled = false
