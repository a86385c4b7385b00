package labels

import (
	"sync/atomic"

	"github.com/floodgate-go/floodgate/middleware"
)

// KeysIgnored are the reasons a caller's API key header is ignored
// (middleware.Decision.KeyIgnored), in the order of Counts.KeysIgnored.
var KeysIgnored = [...]string{"repeated", "too_long"}

// Counts are what the Limiter's events count beside the decision series.
// Each only grows; the zero value is ready, and Observe is safe for
// concurrent use.
type Counts struct {
	// Tap counts the tap handle's rejections (Event.Tap), which are
	// decisions too.
	Tap atomic.Uint64
	// Exempt counts calls to exempt methods (middleware.ReasonExempt),
	// which are no decision.
	Exempt atomic.Uint64
	// KeysIgnored counts the decisions of callers whose API key header was
	// ignored, by reason, in the order of the package's KeysIgnored: once
	// per decision, so a stream limited per message counts once per
	// message.
	KeysIgnored [len(KeysIgnored)]atomic.Uint64
}

// Observe counts e. It allocates nothing.
func (c *Counts) Observe(e middleware.Event) {
	switch e.Reason {
	case middleware.ReasonExempt:
		c.Exempt.Add(1)
		return
	case middleware.ReasonSettled: // the settle of a call already decided
		return
	}
	if e.Tap && !e.Allowed {
		c.Tap.Add(1)
	}
	if e.KeyIgnored == "" {
		return
	}
	for i, reason := range KeysIgnored {
		if e.KeyIgnored == reason {
			c.KeysIgnored[i].Add(1)
			return
		}
	}
}
