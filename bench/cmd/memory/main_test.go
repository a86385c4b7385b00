package main

import (
	"bytes"
	"strings"
	"testing"
)

// Memory figures depend on the runtime and the machine, so the test checks
// only that every store is measured and occupies some heap per key.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"-keys", "20000"}, &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, f := range fillers {
		if !strings.Contains(out.String(), f.name) {
			t.Errorf("output lacks %q:\n%s", f.name, out.String())
		}
	}
}

func TestMeasurePositive(t *testing.T) {
	rows, err := measureAll(20_000)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rows), len(fillers); got != want {
		t.Fatalf("measureAll returned %d rows, want %d", got, want)
	}
	for _, r := range rows {
		if r.perKey() <= 0 {
			t.Errorf("%s: %.1f bytes per key, want > 0", r.name, r.perKey())
		}
	}
}

func TestRunRejectsBadKeys(t *testing.T) {
	if err := run([]string{"-keys", "0"}, &bytes.Buffer{}); err == nil {
		t.Error("run(-keys 0) = nil error, want an error")
	}
}
