package remote_test

import (
	"testing"

	"github.com/floodgate-go/floodgate/remote"
)

// The names are metric label values: fixed, lower-case, one per value.
func TestNames(t *testing.T) {
	kinds := map[remote.ErrorKind]string{
		remote.KindNone: "none", remote.KindTimeout: "timeout", remote.KindCanceled: "canceled",
		remote.KindConnection: "connection", remote.KindCluster: "cluster", remote.KindScript: "script",
		remote.KindOther: "other", remote.KindBreakerOpen: "breaker_open", remote.ErrorKind(200): "unknown",
	}
	for k, want := range kinds {
		if got := k.String(); got != want {
			t.Errorf("ErrorKind(%d).String() = %q, want %q", k, got, want)
		}
	}
	states := map[remote.BreakerState]string{
		remote.BreakerClosed: "closed", remote.BreakerOpen: "open", remote.BreakerHalfOpen: "half-open", remote.BreakerState(9): "unknown",
	}
	for s, want := range states {
		if got := s.String(); got != want {
			t.Errorf("BreakerState(%d).String() = %q, want %q", s, got, want)
		}
	}
}
