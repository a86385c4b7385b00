package floodgate_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
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
	".":       {},
	"keyed":   {module},
	"cpugate": {module, "github.com/shirou/gopsutil/v3"},
	"tenant":  {module, "go.yaml.in/yaml/v3"},
	// The overload controller is transport-neutral: the middleware feeds
	// it gRPC's calls, and could feed it anyone's.
	"overload": {module},
}

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
			// floodgatetest (the users' test helper) and promfloodgate
			// (metrics over the middleware's events) sit on top of the
			// middleware; no library package below it may import it.
			if imp == module+"/middleware" && !isTest && !strings.HasPrefix(dir, "examples") &&
				dir != "middleware" && !strings.HasPrefix(dir, "middleware/") &&
				dir != "floodgatetest" && dir != "promfloodgate" {
				t.Errorf("%s imports the middleware: only examples, tests, floodgatetest and promfloodgate may", p)
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
				// Core packages may use the root, never each other's
				// siblings above them in the design (none do today).
				permitted = permitted && imp == module
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
