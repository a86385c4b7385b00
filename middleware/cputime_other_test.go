//go:build !unix

package middleware_test

import "testing"

func reportCPU(_ *testing.B, run func()) { run() }
