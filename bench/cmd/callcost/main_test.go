package main

import (
	"io"
	"os/exec"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestCases: every case's server, served as the measurement serves it,
// answers the case's calls with the case's code, so that each figure
// counts what its name says (an admission, a rejection, a health check).
func TestCases(t *testing.T) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr, stop := serveInProcess(t, c.server)
			defer stop()
			if err := drive(addr, c, 3); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCasesFailOnWrongCode: drive fails when a call ends with another code
// than the case's, so a server that admits what it should reject cannot be
// measured as a rejection.
func TestCasesFailOnWrongCode(t *testing.T) {
	addr, stop := serveInProcess(t, bare)
	defer stop()
	wrong := kase{name: "bare, as if rejected", server: bare, call: getClosed, want: codes.ResourceExhausted}
	if err := drive(addr, wrong, 1); err == nil || !strings.Contains(err.Error(), "ended OK") {
		t.Fatalf("drive on a server that admits: %v, want an error naming the code", err)
	}
}

func serveInProcess(t *testing.T, s server) (string, func()) {
	t.Helper()
	r, w := io.Pipe()
	out, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- serveUntilEOF(s, r, outW) }()
	buf := make([]byte, 64)
	n, err := out.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return strings.TrimSpace(string(buf[:n])), func() {
		w.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
		outW.Close()
	}
}

func TestParseCollected(t *testing.T) {
	out := "==123== Callgrind, a call-graph generating cache profiler\n==123== \n==123== Events    : Ir\n==123== Collected : 268333371\n==123== \n==123== I   refs:      268,333,371\n"
	got, err := parseCollected(out)
	if err != nil || got != 268333371 {
		t.Fatalf("parseCollected = %d, %v; want 268333371", got, err)
	}
	if _, err := parseCollected("==1== Callgrind\nsegfault\n"); err == nil {
		t.Fatal("parseCollected without a count: no error")
	}
}

// TestCount runs one case under callgrind, when valgrind is installed: a
// call costs the server tens of thousands of instructions.
func TestCount(t *testing.T) {
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		t.Skip("valgrind is not installed")
	}
	if testing.Short() {
		t.Skip("-short: runs the server under callgrind")
	}
	self := buildSelf(t)
	c := cases[0]
	base, err := count(vg, self, c, 20, 0)
	if err != nil {
		t.Fatal(err)
	}
	all, err := count(vg, self, c, 20, 200)
	if err != nil {
		t.Fatal(err)
	}
	if per := float64(all-base) / 200; per < 10_000 || per > 1_000_000 {
		t.Fatalf("%s: %.0f instructions per call, want tens of thousands", c.name, per)
	}
}

func buildSelf(t *testing.T) string {
	t.Helper()
	bin := t.TempDir() + "/callcost"
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
