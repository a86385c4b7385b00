package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestCommittedReport: the committed results render the committed page
// byte for byte, so that neither changes without the other. After editing
// report.md.tmpl, re-render with `go run ./cmd/rls -render results/rls.json`.
func TestCommittedReport(t *testing.T) {
	res, err := readResults("../../results/rls.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := res.report()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../../docs/benchmarks/rls.md")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, want) {
		return
	}
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		if i >= len(g) || i >= len(w) || g[i] != w[i] {
			t.Fatalf("docs/benchmarks/rls.md is not the rendering of results/rls.json (re-render with -render): line %d is\n%q\nwant\n%q",
				i+1, at(g, i), at(w, i))
		}
	}
}

func at(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(end of file)"
}
