package floodgate_test

import (
	"testing"

	"github.com/floodgate-go/floodgate"
)

func TestParsePriority(t *testing.T) {
	for _, p := range []floodgate.Priority{floodgate.Sheddable, floodgate.Default, floodgate.Critical} {
		got, err := floodgate.ParsePriority(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePriority(%q) = %v, %v; want %v", p.String(), got, err, p)
		}
	}
	if got, err := floodgate.ParsePriority(""); err != nil || got != floodgate.Default {
		t.Errorf(`ParsePriority("") = %v, %v; want default`, got, err)
	}
	for _, bad := range []string{"Critical", "high", "1", " default"} {
		if _, err := floodgate.ParsePriority(bad); err == nil {
			t.Errorf("ParsePriority(%q): nil error", bad)
		}
	}
	if s := floodgate.Priority(7).String(); s != "unknown" {
		t.Errorf("Priority(7).String() = %q, want unknown", s)
	}
}
