package redistest

import (
	"strings"
	"testing"
	"time"
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

// TestSleepAndFlush: DEBUG SLEEP holds the server for its duration, and
// SCRIPT FLUSH empties the script cache.
func TestSleepAndFlush(t *testing.T) {
	s := Start(t)
	if _, err := Do(s.Addr, "SCRIPT", "LOAD", "return 1"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done, err := s.Sleep(200 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Do(s.Addr, "PING"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 190*time.Millisecond {
		t.Errorf("PING during a 200ms sleep answered after %v", d)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.FlushScripts(); err != nil {
		t.Fatal(err)
	}
	// sha1("return 1")
	if got, err := Do(s.Addr, "SCRIPT", "EXISTS", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"); err != nil || got != "0" {
		t.Errorf("SCRIPT EXISTS after FlushScripts = %q, %v, want 0", got, err)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	info, err := Do(c.Addrs[0], "CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("CLUSTER INFO = %q, %v", info, err)
	}
	// A killed node comes back with its slots and serves them.
	s := c.Servers[1]
	s.Kill()
	if err := c.Restart(s); err != nil {
		t.Fatal(err)
	}
	if info, err := Do(s.Addr, "CLUSTER", "INFO"); err != nil || !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("CLUSTER INFO after Restart = %q, %v", info, err)
	}
}

// TestStopCont: a stopped server answers nothing until it is continued.
func TestStopCont(t *testing.T) {
	if !Installed() {
		t.Skip("redis-server is not installed")
	}
	s := Start(t)
	if !s.Answers(time.Second) {
		t.Fatal("a started server does not answer PING")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if s.Answers(200 * time.Millisecond) {
		t.Error("a stopped server answered PING")
	}
	s.Cont()
	if !s.Answers(time.Second) {
		t.Error("a continued server does not answer PING")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
}
