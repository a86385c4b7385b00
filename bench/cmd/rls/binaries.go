package main

import (
	"context"
	"fmt"
	"os"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
)

// ratelimitBinary returns envoyproxy/ratelimit's service_cmd: path when
// given, else the one rlsproc installs in its cache directory. An error
// wrapping errSkip says why the variant cannot run.
func ratelimitBinary(ctx context.Context, path string, logf func(string, ...any)) (string, error) {
	switch path {
	case "off":
		return "", fmt.Errorf("%w: -ratelimit off", errSkip)
	case "":
		return rlsproc.RatelimitBinary(ctx, logf)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w: -ratelimit %s: %v", errSkip, path, err)
	}
	return path, nil
}

// floodgateBinary returns floodgate-rls: path when given, else built from
// the repository's rls module, with the repository's commit. An error
// wrapping errSkip says why the variants cannot run.
func floodgateBinary(ctx context.Context, path string, logf func(string, ...any)) (bin, version string, err error) {
	if path == "" {
		return rlsproc.FloodgateBinary(ctx, "floodgate-rls", logf)
	}
	if _, err := os.Stat(path); err != nil {
		return "", "", fmt.Errorf("%w: -floodgate %s: %v", errSkip, path, err)
	}
	return path, "given: " + path, nil
}
