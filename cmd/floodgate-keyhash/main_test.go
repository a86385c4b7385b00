package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/floodgate-go/floodgate/tenant"
)

func TestRun(t *testing.T) {
	const acme = "52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32\n"
	dashHash, err := tenant.HashKey("-demo-key")
	if err != nil {
		t.Fatal(err)
	}
	dash := dashHash + "\n"
	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantOut    string
		wantStatus int
	}{
		{"stdin", nil, "demo-key-acme-1", acme, 0},
		{"stdin with newline", nil, "demo-key-acme-1\n", acme, 0},
		{"stdin with CRLF", nil, "demo-key-acme-1\r\n", acme, 0},
		{"argument", []string{"demo-key-acme-1"}, "", acme, 0},
		{"after --", []string{"--", "demo-key-acme-1"}, "", acme, 0},
		{"empty stdin", nil, "", "", 1},
		{"two lines", nil, "demo-key-acme-1\nmore\n", "", 1},
		{"space inside", nil, "demo key", "", 1},
		{"too long", nil, strings.Repeat("k", 257), "", 1},
		{"two arguments", []string{"a", "b"}, "", "", 2},
		{"key starting with -", []string{"-demo-key"}, "", dash, 0},
		{"key starting with - after --", []string{"--", "-demo-key"}, "", dash, 0},
		{"bare CR is part of the key", nil, "demo-key-acme-1\r", "", 1},
		{"help", []string{"-h"}, "", "", 0},
		{"long help", []string{"--help"}, "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			status := run(tt.args, strings.NewReader(tt.stdin), &out, &errOut)
			if status != tt.wantStatus || out.String() != tt.wantOut {
				t.Errorf("run(%q, %q) = %d, %q; want %d, %q (stderr %q)",
					tt.args, tt.stdin, status, out.String(), tt.wantStatus, tt.wantOut, errOut.String())
			}
			if status != 0 && strings.Contains(errOut.String(), "demo") {
				t.Errorf("stderr echoes the key: %q", errOut.String())
			}
		})
	}
}
