package peers

import (
	"context"
	"errors"
	"net"
	"testing"

	"google.golang.org/grpc/peer"
)

func from(ip string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 4242}})
}

// TestIPLimiter: each peer IP has a bucket of its own, and a call without a
// peer is refused.
func TestIPLimiter(t *testing.T) {
	l := NewIPLimiter(1e-9, 2)
	a, b := from("203.0.113.7"), from("203.0.113.8")
	for i := range 2 {
		if err := l.Limit(a); err != nil {
			t.Fatalf("a's call %d: %v, want nil (burst 2)", i, err)
		}
	}
	if err := l.Limit(a); !errors.Is(err, ErrLimited) {
		t.Fatalf("a's third call: %v, want ErrLimited", err)
	}
	if err := l.Limit(b); err != nil {
		t.Fatalf("b's first call: %v, want nil (a bucket of its own)", err)
	}
	if err := l.Limit(context.Background()); !errors.Is(err, ErrNoPeer) {
		t.Fatalf("a call without a peer: %v, want ErrNoPeer", err)
	}
}
