package tenant_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports keeps the dependency rule of the design: tenant imports the
// standard library, the YAML library and the root package, and never gRPC.
func TestImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"go.yaml.in/yaml/v3":                true,
		"github.com/floodgate-go/floodgate": true,
	}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			if !strings.Contains(first, ".") || allowed[path] {
				continue // standard library or allowed
			}
			t.Errorf("%s imports %s: tenant may import only the standard library, %v", f, path, allowed)
		}
	}
	if checked == 0 {
		t.Fatal("no package files checked")
	}
}
