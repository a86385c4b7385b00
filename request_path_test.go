package floodgate_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// sourceFiles parses every non-test Go file of every module under the
// repository root, skipping testdata and hidden directories, and calls f
// with each.
func sourceFiles(t *testing.T, f func(path string, file *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		n++
		f(filepath.ToSlash(p), file)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("parsed %d files: is the test running in the repository root?", n)
	}
}

func imports(file *ast.File, prefix string) bool {
	for _, spec := range file.Imports {
		if imp, _ := strconv.Unquote(spec.Path.Value); imp == prefix || strings.HasPrefix(imp, prefix+"/") {
			return true
		}
	}
	return false
}

// TestNoReflectionIntoGRPC fails on code that reaches into another
// module's unexported types: a file that speaks gRPC may not import
// reflect or unsafe, and no file may look a struct field up by name
// through reflection.
func TestNoReflectionIntoGRPC(t *testing.T) {
	sourceFiles(t, func(p string, file *ast.File) {
		if imports(file, "google.golang.org/grpc") && (imports(file, "reflect") || imports(file, "unsafe")) {
			t.Errorf("%s imports google.golang.org/grpc with reflect or unsafe: use grpc-go's public API", p)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "FieldByName" || sel.Sel.Name == "FieldByIndex") {
				t.Errorf("%s: %s reaches into a struct's fields by reflection", p, sel.Sel.Name)
			}
			return true
		})
	})
}

// statusReaders may read a status's details: the middleware builds its
// rejections; throttle, and the examples' and benchmarks' clients, read
// them from a server's answer on the other side of the network, as any
// client does.
var statusReaders = []string{"middleware/", "throttle/", "examples/", "bench/"}

// TestNoStatusParsing fails on a package that parses a status back into
// what the middleware put in it: its details (a Details call, or an Any
// unpacked with UnmarshalTo or UnmarshalNew), or an ErrorInfo or RetryInfo
// type assertion. Re-encoding a status's details whole, as httplimit does
// for its HTTP answers, parses nothing. A floodgate rejection is a
// *middleware.Rejection, whose fields say it all.
func TestNoStatusParsing(t *testing.T) {
	sourceFiles(t, func(p string, file *ast.File) {
		for _, dir := range statusReaders {
			if strings.HasPrefix(p, dir) {
				return
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			var types []ast.Expr
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				switch {
				case !ok:
				case sel.Sel.Name == "Details" && len(n.Args) == 0:
					t.Errorf("%s: reads a status's details: read the *middleware.Rejection instead", p)
				case sel.Sel.Name == "UnmarshalTo" || sel.Sel.Name == "UnmarshalNew":
					t.Errorf("%s: unpacks an Any, as a status's details are: read the *middleware.Rejection instead", p)
				}
			case *ast.TypeAssertExpr:
				types = append(types, n.Type)
			case *ast.CaseClause:
				types = n.List
			}
			for _, e := range types {
				if detailType(e) {
					t.Errorf("%s: asserts a status detail's type: read the *middleware.Rejection instead", p)
				}
			}
			return true
		})
	})
}

// detailType reports whether e is errdetails.ErrorInfo or RetryInfo, or a
// pointer to one.
func detailType(e ast.Expr) bool {
	if star, ok := e.(*ast.StarExpr); ok {
		e = star.X
	}
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "errdetails" && (sel.Sel.Name == "ErrorInfo" || sel.Sel.Name == "RetryInfo")
}
