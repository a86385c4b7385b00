package rlqsclient

import (
	"context"

	"github.com/floodgate-go/floodgate"
)

// Received returns how many stream events c has handled: responses
// applied, and streams that ended.
func Received(c *Client) int {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	return c.received
}

// WaitReceived blocks until Received(c) ≥ n or ctx ends.
func WaitReceived(ctx context.Context, c *Client, n int) error {
	for {
		c.evMu.Lock()
		got, ch := c.received, c.notify
		c.evMu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Assigned returns key's assignment, ignoring its TTL, and whether it has one.
func Assigned(c *Client, key string) (floodgate.Limit, bool) {
	c.mu.RLock()
	b := c.keys[key]
	c.mu.RUnlock()
	if b == nil {
		return floodgate.Limit{}, false
	}
	a := b.a.Load()
	if a == nil {
		return floodgate.Limit{}, false
	}
	return a.lim, true
}

// Subscribed returns how many keys c holds.
func Subscribed(c *Client) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.keys)
}

// Assignments returns every key's assignment.
func Assignments(c *Client) map[string]floodgate.Limit {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]floodgate.Limit{}
	for k, b := range c.keys {
		if a := b.a.Load(); a != nil {
			out[k] = a.lim
		}
	}
	return out
}
