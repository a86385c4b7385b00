package rlsproc

import (
	"strings"
	"testing"
)

func TestTail(t *testing.T) {
	tl := &tail{addr: make(chan string, 1)}
	tl.Write([]byte("starting\nfloodgate-rls: grpc listening on 127.0.0"))
	select {
	case a := <-tl.addr:
		t.Fatalf("address %q from half a line", a)
	default:
	}
	tl.Write([]byte(".1:4321\nfloodgate-rls: grpc listening on 127.0.0.1:9\n"))
	if got, want := <-tl.addr, "127.0.0.1:4321"; got != want {
		t.Errorf("address = %q, want %q", got, want)
	}
	tl.Write([]byte(strings.Repeat("x", 2*tailMax) + "end"))
	if got := tl.String(); len(got) != tailMax || !strings.HasSuffix(got, "end") {
		t.Errorf("String() holds %d bytes ending %q, want the last %d", len(got), got[max(0, len(got)-3):], tailMax)
	}
	select {
	case a := <-tl.addr:
		t.Errorf("a second address %q", a)
	default:
	}
}
