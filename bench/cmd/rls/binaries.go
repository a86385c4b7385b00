package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// cacheDir is where the experiment keeps the binaries it builds:
// floodgate-bench under the user's cache directory.
func cacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "floodgate-bench"), nil
}

// goEnv is the environment of the go commands the experiment runs: its
// own, without a workspace or flags that would change what they build.
func goEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOBIN=")
	})
	return append(append(env, "GOWORK=off", "GOFLAGS="), extra...)
}

// ratelimitBinary returns envoyproxy/ratelimit's service_cmd: path when
// given, else the one in the cache directory, which it installs there with
// go install at ratelimitVersion when missing (about a minute on two CPUs
// with an empty module cache). An error wrapping errSkip says why the
// variant cannot run.
func ratelimitBinary(ctx context.Context, path string, logf func(string, ...any)) (string, error) {
	switch path {
	case "off":
		return "", fmt.Errorf("%w: -ratelimit off", errSkip)
	case "":
	default:
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("%w: -ratelimit %s: %v", errSkip, path, err)
		}
		return path, nil
	}
	root, err := cacheDir()
	if err != nil {
		return "", fmt.Errorf("%w: no cache directory: %v", errSkip, err)
	}
	dir := filepath.Join(root, "ratelimit-"+ratelimitVersion)
	bin := filepath.Join(dir, "service_cmd")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	pkg := ratelimitMod + "/src/service_cmd@" + ratelimitVersion
	logf("envoyproxy/ratelimit is not in %s: installing it with go install %s (about a minute the first time)", dir, pkg)
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "install", pkg)
	cmd.Env = goEnv("GOBIN=" + dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: go install %s: %v: %s", errSkip, pkg, err, lastLines(out, 5))
	}
	logf("installed %s in %.0f s", bin, time.Since(start).Seconds())
	return bin, nil
}

// repoRoot returns the root of the floodgate repository that holds the
// working directory: the nearest directory up whose go.mod is floodgate's
// core module.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			first := ""
			if sc.Scan() {
				first = strings.TrimSpace(sc.Text())
			}
			f.Close()
			if first == "module github.com/floodgate-go/floodgate" {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the floodgate repository")
		}
		dir = parent
	}
}

// floodgateBinary returns floodgate-rls: path when given, else built from
// the repository's rls module into the cache directory (the go command's
// build cache makes a rebuild of an unchanged tree quick), with the
// repository's commit. An error wrapping errSkip says why the variants
// cannot run.
func floodgateBinary(ctx context.Context, path string, logf func(string, ...any)) (bin, version string, err error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", "", fmt.Errorf("%w: -floodgate %s: %v", errSkip, path, err)
		}
		return path, "given: " + path, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", "", fmt.Errorf("%w: %v", errSkip, err)
	}
	src := filepath.Join(root, "rls")
	if _, err := os.Stat(filepath.Join(src, "cmd", "floodgate-rls")); err != nil {
		return "", "", fmt.Errorf("%w: this tree has no rls/cmd/floodgate-rls", errSkip)
	}
	cache, err := cacheDir()
	if err != nil {
		return "", "", fmt.Errorf("%w: no cache directory: %v", errSkip, err)
	}
	bin = filepath.Join(cache, "floodgate-rls")
	logf("building floodgate-rls from %s", src)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/floodgate-rls")
	cmd.Dir = src
	cmd.Env = goEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build ./cmd/floodgate-rls: %v: %s", err, lastLines(out, 10))
	}
	return bin, gitVersion(root), nil
}

// gitVersion returns the repository's commit, marked when the tree has
// changes.
func gitVersion(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	v := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--", "rls", "redisstore", "keyed", "tenant").Output(); err == nil && len(st) > 0 {
		v += " (with local changes)"
	}
	return v
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
