package floodgate

import (
	"fmt"
	"strconv"
)

// A Priority ranks calls when a server must shed some: every waiting call
// of a higher priority is admitted before any of a lower one. Tenant
// configs name it ("priority: critical"), and the overload controller
// orders its queue by it. The zero Priority is Default.
type Priority int8

const (
	// Sheddable calls (batch jobs, prefetches, retries that can wait) are
	// shed first.
	Sheddable Priority = -1
	// Default is the priority of calls nobody ranked.
	Default Priority = 0
	// Critical calls (interactive, user-facing) are shed last.
	Critical Priority = 1
)

var priorityNames = [...]string{"sheddable", "default", "critical"}

// String returns the priority's name as configs write it: "sheddable",
// "default" or "critical" ("unknown" for any other value).
func (p Priority) String() string {
	if p >= Sheddable && p <= Critical {
		return priorityNames[p+1]
	}
	return "unknown"
}

// ParsePriority returns the priority named s ("sheddable", "default" or
// "critical"; "" is Default), or an error naming the three for any other.
func ParsePriority(s string) (Priority, error) {
	if s == "" {
		return Default, nil
	}
	for i, n := range priorityNames {
		if n == s {
			return Priority(i - 1), nil
		}
	}
	return Default, fmt.Errorf("floodgate: unknown priority %s: want \"sheddable\", \"default\" or \"critical\"", strconv.Quote(s))
}
