package redistest

import (
	"strings"
	"testing"
)

func TestServerLifecycle(t *testing.T) {
	s := Start(t)
	if got, err := Do(s.Addr, "SET", "k", "v"); err != nil || got != "OK" {
		t.Fatalf("SET = %q, %v, want OK", got, err)
	}
	s.Kill()
	if _, err := Do(s.Addr, "PING"); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got, err := Do(s.Addr, "GET", "k"); err != nil || got != "" {
		t.Fatalf("GET after restart = %q, %v, want empty", got, err)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	info, err := Do(c.Addrs[0], "CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("CLUSTER INFO = %q, %v", info, err)
	}
}
