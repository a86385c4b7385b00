package main

import (
	"bytes"
	"io"
	"os/exec"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestCases: every case's server, served as the measurement serves it,
// answers the case's calls with the case's code and status details, so
// that each figure counts what its name says (an admission, a rejection
// with or without details, a health check that the closed tenant's key
// would have had rejected were it not exempt).
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

// TestServers: the controller's server has one, the others none.
func TestServers(t *testing.T) {
	for _, s := range []server{limited, limitedCtl, limitedNoDet} {
		l, err := limiter(s)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := l.Overload() != nil, s == limitedCtl; got != want {
			t.Errorf("%s: has a controller %v, want %v", s, got, want)
		}
	}
	if _, err := limiter("nonsense"); err == nil {
		t.Error("limiter(nonsense): no error")
	}
}

// TestDriveChecks: drive fails when a call ends with another code, or
// other details, than the case's, so a server that admits what it should
// reject, or drops the details, cannot be measured as the case.
func TestDriveChecks(t *testing.T) {
	for _, bc := range []struct {
		c    kase
		want string
	}{
		{kase{name: "bare, as if rejected", server: bare, call: get, want: codes.ResourceExhausted}, "ended OK"},
		{kase{name: "no details, as if with", server: limitedNoDet, call: getClosed, want: codes.ResourceExhausted, details: floodgateDetail}, "carried 0 status details"},
		{kase{name: "details, as if without", server: limited, call: getClosed, want: codes.ResourceExhausted}, "carried 3 status details"},
	} {
		t.Run(bc.c.name, func(t *testing.T) {
			addr, stop := serveInProcess(t, bc.c.server)
			defer stop()
			if err := drive(addr, bc.c, 1); err == nil || !strings.Contains(err.Error(), bc.want) {
				t.Fatalf("drive: %v, want an error with %q", err, bc.want)
			}
		})
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

// TestReport: the ratios come from the named cases, and a case without a
// figure is an error rather than a NaN in the page's source.
func TestReport(t *testing.T) {
	per := map[string][]float64{}
	for i, c := range cases {
		per[c.name] = []float64{float64(1000 + i), float64(1100 + i), float64(900 + i)}
	}
	per[caseHealth] = []float64{1000, 1000}
	per[caseRejected] = []float64{1100, 1200, 1000}
	var b bytes.Buffer
	if err := report(&b, per, 10); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "floodgate 1.100,") || strings.Contains(out, "NaN") || strings.Contains(out, "Inf") {
		t.Fatalf("report:\n%s\nwant the rejection at 1.100× the health check, and no NaN or Inf", out)
	}
	delete(per, caseBareHealth)
	if err := report(io.Discard, per, 10); err == nil {
		t.Fatal("report without a case's figure: no error")
	}
}

func TestMedian(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median(3, 1, 2) = %v, want 2", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median(4, 1, 3, 2) = %v, want 2.5", got)
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
// bare call costs a server about a hundred thousand instructions.
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
	if per := float64(all-base) / 200; per < 20_000 || per > 1_000_000 {
		t.Fatalf("%s: %.0f instructions per call, want about a hundred thousand", c.name, per)
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
