package main

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestZZProfile(t *testing.T) {
	if os.Getenv("ZZ") == "" {
		t.Skip()
	}
	_, err := runDemo(context.Background(), demoConfig{
		ConfigPath:  testdata(t, "tenants.yaml"),
		ProfilePath: testdata(t, "profile.yaml"),
		Duration:    15 * time.Second,
		Cost:        2 * time.Millisecond,
		Capacity:    700,
		Policy:      "adaptive",
		Sampler:     "process",
		Seed:        1,
		Every:       3 * time.Second,
		Stdout:      os.Stdout,
	})
	if err != nil {
		t.Fatal(err)
	}
}
