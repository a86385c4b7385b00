//go:build !race

package promfloodgate

const raceEnabled = false
