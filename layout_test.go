package floodgate_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/floodgate-go/floodgate"

// peers are the libraries floodgate is measured against; they belong in the
// bench module alone.
var peers = []string{
	"golang.org/x/time",
	"github.com/sethvargo/go-limiter",
	"github.com/go-redis/redis_rate",
	"github.com/zeromicro/go-zero",
	"github.com/go-kratos/aegis",
}

// allowed lists, for each package that has a rule, the non-stdlib import
// prefixes its non-test files may use (docs/DESIGN.md, "Packages and dependency
// direction").
var allowed = map[string][]string{
	".":     {},
	"keyed": {module},
	// The vocabulary of remote stores, for their observers: stdlib only.
	"remote":  {},
	"cpugate": {module, "github.com/shirou/gopsutil/v3", "golang.org/x/sys"},
	"tenant":  {module, "go.yaml.in/yaml/v3"},
	// The overload controller is transport-neutral: the middleware feeds
	// it gRPC's calls, and could feed it anyone's. Its law is a package of
	// its own, internal to it.
	"overload":              {module, module + "/overload/internal/law"},
	"overload/internal/law": {},
	// Client-side throttling: a transport-neutral core and gRPC client
	// interceptors; it knows nothing of the server side.
	"throttle": {module, "google.golang.org/grpc", "google.golang.org/genproto/googleapis/rpc/errdetails"},
	// ORCA load reports from the overload controller: grpc-go's orca and
	// the xds report type it encodes, and the process's CPU; no middleware.
	"loadreport": {module, module + "/overload", module + "/cpugate", "google.golang.org/grpc",
		"github.com/cncf/xds/go", "google.golang.org/protobuf"},
	// net/http in front of the middleware's Limiter: it speaks gRPC's and
	// Connect's error formats, without either's server. It answers with
	// the HTTP status and Retry-After a middleware.Rejection states, and
	// encodes its status; it parses no status back.
	"httplimit": {module, module + "/middleware", module + "/tenant", "google.golang.org/grpc/status",
		"google.golang.org/protobuf", "github.com/hashicorp/golang-lru/v2"},
	// Envoy's rate-limit service, in a module of its own: Envoy's protos,
	// gRPC, Prometheus and the tenant config, over any floodgate.Reserver.
	// It names no store (the binary chooses keyed or redisstore) and sits
	// beside the middleware, not on it.
	// A gRPC server's RLQS subscription: floodgate.Store over quotas a
	// floodgate-rls assigns, decided in a keyed map.
	"rls/rlqsclient": {module, module + "/keyed", module + "/rls/internal/bucketid", "github.com/envoyproxy/go-control-plane",
		"google.golang.org/grpc", "google.golang.org/protobuf"},
	"rls": {module, module + "/tenant", module + "/remote", module + "/internal/topk", module + "/rls/internal/share", module + "/rls/internal/bucketid", "github.com/envoyproxy/go-control-plane",
		"github.com/prometheus/client_golang", "go.yaml.in/yaml/v3", "google.golang.org/grpc",
		"google.golang.org/protobuf"},
}

// aboveMiddleware are the library packages that may import the middleware.
var aboveMiddleware = []string{"floodgatetest", "promfloodgate", "otelfloodgate", "httplimit", "internal/labels", "internal/pairbench"}

// TestDependencyDirection fails on an import edge the design forbids: gRPC
// in the core packages, anything but stdlib in the root, the middleware
// imported by a library package, a peer library outside bench/.
func TestDependencyDirection(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != "." && (strings.HasPrefix(name, ".") || name == "testdata" || p == "bench") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(p))
		isTest := strings.HasSuffix(p, "_test.go")
		for _, spec := range f.Imports {
			imp, _ := strconv.Unquote(spec.Path.Value)
			checked++
			for _, peer := range peers {
				if strings.HasPrefix(imp, peer) {
					t.Errorf("%s imports peer library %s: peers belong in bench/", p, imp)
				}
			}
			// floodgatetest (the users' test helper), promfloodgate and
			// otelfloodgate (metrics over the middleware's events, labelled
			// by internal/labels) sit on top of the middleware; no library
			// package below it may import it.
			if imp == module+"/middleware" && !isTest && !strings.HasPrefix(dir, "examples") &&
				dir != "middleware" && !strings.HasPrefix(dir, "middleware/") && !slices.Contains(aboveMiddleware, dir) {
				t.Errorf("%s imports the middleware: only examples, tests and %v may", p, aboveMiddleware)
			}
			rules, ok := allowed[dir]
			if !ok || isTest || stdlib(imp) {
				continue
			}
			permitted := false
			for _, prefix := range rules {
				if imp == prefix || strings.HasPrefix(imp, prefix+"/") {
					permitted = true
				}
			}
			if strings.HasPrefix(imp, module+"/") && dir != "." {
				// Core packages may use the root, and a sibling only
				// where their rule names it (httplimit, on top of the
				// middleware).
				permitted = slices.Contains(rules, imp)
			}
			if !permitted {
				t.Errorf("%s (package %s) imports %s, which the design does not allow", p, path.Base(dir), imp)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no imports checked: is the test running in the module root?")
	}
}

func stdlib(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

// heavy are the dependency families that live in modules of their own, so
// that a user who imports the core packages (keyed, middleware, …) never
// sees them in `go list -m all`.
var heavy = map[string]string{
	"github.com/prometheus/":                 "promfloodgate",
	"go.opentelemetry.io/":                   "otelfloodgate",
	"github.com/redis/":                      "redisstore",
	"gonum.org/v1/plot":                      "internal/plot",
	"connectrpc.com/":                        "examples",
	"github.com/go-redis/":                   "bench",
	"github.com/sethvargo/":                  "bench",
	"github.com/zeromicro/":                  "bench",
	"github.com/go-kratos/":                  "bench",
	"golang.org/x/time":                      "bench",
	"github.com/platinummonk":                "bench",
	"github.com/envoyproxy/go-control-plane": "rls",
}

// TestCoreModuleRequirements reads the core module's go.mod, which since Go
// 1.17 lists every module its packages and tests need: a consumer's module
// graph holds exactly these, so none may be a heavy family.
func TestCoreModuleRequirements(t *testing.T) {
	data, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		mod := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(mod) == 0 {
			continue
		}
		for prefix, home := range heavy {
			if strings.HasPrefix(mod[0], prefix) {
				t.Errorf("go.mod requires %s: it belongs in the %s module, not the core", mod[0], home)
			}
		}
	}
}

// TestCoreBuildsWithoutHeavy lists the packages the core's packages and
// tests build from: none may be of a heavy family. The module graph is a
// weaker test for OpenTelemetry: grpc-go's go.mod requires it, so
// `go list -m all` lists it for any gRPC user, though no core package
// compiles a line of it.
func TestCoreBuildsWithoutHeavy(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	cmd := exec.Command(goCmd, "list", "-deps", "-test", "./...")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) == 0 {
		t.Fatal("go list named no package")
	}
	for _, p := range pkgs {
		for prefix, home := range heavy {
			if strings.HasPrefix(p, prefix) {
				t.Errorf("the core builds %s: it belongs in the %s module", p, home)
			}
		}
	}
}

// TestEveryModuleTested fails when a go.mod in the tree is missing from the
// Makefile's MODULES, which `make test` vets and tests one by one.
func TestEveryModuleTested(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, line := range strings.Split(string(mk), "\n") {
		if rest, ok := strings.CutPrefix(line, "MODULES"); ok {
			_, v, _ := strings.Cut(rest, "=")
			listed = strings.Fields(v)
		}
	}
	if len(listed) == 0 {
		t.Fatal("Makefile has no MODULES line")
	}
	found := 0
	err = filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != "." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		found++
		if dir := filepath.ToSlash(filepath.Dir(p)); !slices.Contains(listed, dir) {
			t.Errorf("module %s is not in the Makefile's MODULES: make test would skip it", dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 2 {
		t.Fatalf("found %d go.mod files, want the core and its sibling modules", found)
	}
}
