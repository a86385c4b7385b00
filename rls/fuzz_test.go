package rls_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/floodgate-go/floodgate/rls"
)

// FuzzParse feeds arbitrary bytes to the config parser. It must never
// panic, and every refusal must be a *ConfigError whose problems name the
// file and a line: the decoder's own line for a YAML syntax error, the
// line of the first unreadable byte (not UTF-8, a control character) that
// the decoder refuses without a line, and none only for "config is empty"
// and for decoder errors about the document as a whole, which keep the
// decoder's words.
//
// Its seeds are every config of the package's tests (the string literals
// of its _test.go files that look like one), the tenant package's test
// configs, and the inputs that found bugs (testdata/fuzz/FuzzParse).
func FuzzParse(f *testing.F) {
	for _, s := range testConfigs(f) {
		f.Add([]byte(s))
	}
	lineOf := regexp.MustCompile(`^yaml: line (\d+):`)
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.yaml"
		cfg, err := rls.ParseConfig(name, data)
		if err == nil {
			if cfg == nil {
				t.Fatal("ParseConfig = nil, nil")
			}
			for _, d := range cfg.Domains() {
				if _, ok := cfg.FailurePolicy(d); !ok {
					t.Errorf("Domains() lists %q, FailurePolicy does not know it", d)
				}
			}
			return
		}
		var ce *rls.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, rls.ErrInvalidConfig) || len(ce.Problems) == 0 {
			t.Fatalf("ParseConfig error %T %v: want a *ConfigError with problems", err, err)
		}
		var doc yaml.Node
		yerr := yaml.Unmarshal(data, &doc)
		for _, p := range ce.Problems {
			if p.File != name || !strings.HasPrefix(p.Error(), name) || !strings.Contains(err.Error(), p.Error()) {
				t.Errorf("problem %q does not name %s, or is not in the error", p.Error(), name)
			}
			m := lineOf.FindStringSubmatch(fmt.Sprint(yerr))
			switch {
			case m != nil:
				if want, _ := strconv.Atoi(m[1]); p.Line != want {
					t.Errorf("problem %q: line %d, the decoder's is %d (%v)", p.Error(), p.Line, want, yerr)
				}
			case yerr != nil && p.Line <= 0:
				// The decoder gave no line, and the parser found no
				// unreadable byte: the decoder's words must be kept.
				if p.Msg != yerr.Error() {
					t.Errorf("problem %q: no line, and not the decoder's %q", p.Error(), yerr)
				}
				if rls.ReaderError(p.Msg) {
					t.Errorf("problem %q: an unreadable byte without its line", p.Error())
				}
			case p.Msg == "config is empty":
			case p.Line <= 0:
				t.Errorf("problem %q has no line", p.Error())
			}
		}
	})
}

// testConfigs returns the string constants of the package's tests that
// look like a config, and the tenant package's test configs.
func testConfigs(tb testing.TB) []string {
	tb.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, fn := range files {
		f, err := parser.ParseFile(fset, fn, nil, 0)
		if err != nil {
			tb.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && (strings.Contains(s, "domain") || strings.Contains(s, "descriptors") || strings.Contains(s, "tiers")) {
				out = append(out, s)
			}
			return true
		})
	}
	// Outside this module when it is built from the module cache.
	_ = filepath.WalkDir(filepath.Join("..", "tenant", "testdata"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			if b, err := os.ReadFile(p); err == nil {
				out = append(out, string(b))
			}
		}
		return nil
	})
	if len(out) < 20 {
		tb.Fatalf("found %d seed configs in the tests, want the package's many", len(out))
	}
	return out
}
