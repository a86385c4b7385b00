package rlsproc

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

const (
	// RatelimitModule is envoyproxy/ratelimit's module path.
	RatelimitModule = "github.com/envoyproxy/ratelimit"
	// RatelimitVersion is the version of envoyproxy/ratelimit that
	// RatelimitBinary installs: a pseudo-version of a commit on its main
	// branch, as the module proxy serves it.
	RatelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"
)

// ErrUnavailable marks a binary that cannot be had on this machine; the
// error that wraps it says why.
var ErrUnavailable = errors.New("unavailable")

// cacheDir is where the binaries are kept: floodgate-bench under the
// user's cache directory.
func cacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "floodgate-bench"), nil
}

// goEnv is the environment of the go commands run here: this process's,
// without a workspace or flags that would change what they build.
func goEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOBIN=")
	})
	return append(append(env, "GOWORK=off", "GOFLAGS="), extra...)
}

// RatelimitPath returns where RatelimitBinary keeps service_cmd, whether
// or not it is there yet.
func RatelimitPath() (string, error) {
	root, err := cacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "ratelimit-"+RatelimitVersion, "service_cmd"), nil
}

// RatelimitBinary returns envoyproxy/ratelimit's service_cmd at
// RatelimitPath, installing it there with go install at RatelimitVersion
// when missing. Every error it returns wraps ErrUnavailable. logf reports
// the install.
func RatelimitBinary(ctx context.Context, logf func(string, ...any)) (string, error) {
	bin, err := RatelimitPath()
	if err != nil {
		return "", fmt.Errorf("%w: no cache directory: %v", ErrUnavailable, err)
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	dir := filepath.Dir(bin)
	pkg := RatelimitModule + "/src/service_cmd@" + RatelimitVersion
	logf("envoyproxy/ratelimit is not in %s: installing it with go install %s (about a minute the first time)", dir, pkg)
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "install", pkg)
	cmd.Env = goEnv("GOBIN=" + dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: go install %s: %v: %s", ErrUnavailable, pkg, err, lastLines(out, 5))
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

// FloodgateBinary builds floodgate-rls from the rls module of the
// repository that holds the working directory, into the cache directory
// as name, and returns its path and the repository's commit, marked when
// the tree has changes. It builds on every call: the go command's build
// cache makes a rebuild of an unchanged tree quick. Experiments that may
// run at once pass different names, so that one's build never replaces the
// binary another runs. An error wrapping ErrUnavailable says why it cannot
// build here; any other is a failed build. logf reports the build.
func FloodgateBinary(ctx context.Context, name string, logf func(string, ...any)) (bin, version string, err error) {
	root, err := repoRoot()
	if err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	src := filepath.Join(root, "rls")
	if _, err := os.Stat(filepath.Join(src, "cmd", "floodgate-rls")); err != nil {
		return "", "", fmt.Errorf("%w: this tree has no rls/cmd/floodgate-rls", ErrUnavailable)
	}
	cache, err := cacheDir()
	if err != nil {
		return "", "", fmt.Errorf("%w: no cache directory: %v", ErrUnavailable, err)
	}
	bin = filepath.Join(cache, name)
	logf("building floodgate-rls from %s", src)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/floodgate-rls")
	cmd.Dir = src
	cmd.Env = goEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build ./cmd/floodgate-rls: %v: %s", err, lastLines(out, 10))
	}
	return bin, gitVersion(root), nil
}

// gitVersion returns the repository's commit, marked when the packages
// floodgate-rls is built from have changes.
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
