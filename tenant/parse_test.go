package tenant_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgate-go/floodgate/tenant"
)

var update = flag.Bool("update", false, "rewrite the golden files of invalid configs")

const testdata = "../testdata/tenant"

// configFiles lists the YAML and JSON files in a testdata directory.
func configFiles(t testing.TB, dir string) []string {
	t.Helper()
	var files []string
	for _, pat := range []string{"*.yaml", "*.json"} {
		m, err := filepath.Glob(filepath.Join(testdata, dir, pat))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatalf("no config files in %s/%s", testdata, dir)
	}
	return files
}

func TestParseValid(t *testing.T) {
	for _, path := range configFiles(t, "valid") {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tbl, err := tenant.Parse(filepath.Base(path), data)
			if err != nil {
				t.Fatalf("Parse(%s) = %v, want no error", path, err)
			}
			if tbl == nil {
				t.Fatalf("Parse(%s) = nil table and no error", path)
			}
		})
	}
}

// TestParseInvalid checks every invalid fixture against its golden message:
// the whole error text, every problem with file, line and field.
func TestParseInvalid(t *testing.T) {
	for _, path := range configFiles(t, "invalid") {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tbl, err := tenant.Parse(filepath.Base(path), data)
			if err == nil {
				t.Fatalf("Parse(%s) = %v, nil; want an error", path, tbl)
			}
			if tbl != nil {
				t.Errorf("Parse(%s) returned a table with its error", path)
			}
			if !errors.Is(err, tenant.ErrInvalidConfig) {
				t.Errorf("Parse(%s) error %v does not match ErrInvalidConfig", path, err)
			}
			var ce *tenant.ConfigError
			if !errors.As(err, &ce) || len(ce.Errors) == 0 {
				t.Fatalf("Parse(%s) error %T is not a non-empty *ConfigError", path, err)
			}
			golden := strings.TrimSuffix(path, filepath.Ext(path)) + filepath.Ext(path) + ".golden"
			got := err.Error() + "\n"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run TestParseInvalid -update)", err)
			}
			if got != string(want) {
				t.Errorf("Parse(%s) error:\n%s\nwant:\n%s", path, got, want)
			}
			// The fixtures' plain-text keys must never be echoed.
			if strings.Contains(got, "demo-plaintext-key") {
				t.Errorf("Parse(%s) error quotes a plain-text key:\n%s", path, got)
			}
		})
	}
}

// TestDocExample keeps the config example in the package documentation
// valid.
func TestDocExample(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		if line == "//\ttiers:" {
			in = true
		}
		if in {
			rest, ok := strings.CutPrefix(line, "//\t")
			if !ok {
				break
			}
			b.WriteString(rest + "\n")
		}
	}
	if b.Len() == 0 {
		t.Fatal("no config example found in doc.go")
	}
	tbl, err := tenant.Parse("doc.go example", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(tbl.Tenants()); got != 2 {
		t.Errorf("doc example has %d tenants, want 2", got)
	}
}

// TestParseJSONThatYAMLReadsOtherwise: a .json config is strict JSON, and
// JSON that YAML would refuse (the escape "\/", which PHP's json_encode
// writes in every method pattern; a colon on a later line than its key; a
// surrogate pair) parses, with its line numbers true.
func TestParseJSONThatYAMLReadsOtherwise(t *testing.T) {
	good := `{"tiers": {"free": {"default": {"rate": 10, "burst": 20},
  "methods": {"\/inventory.v1.Inventory\/Export": {"rate": 1, "burst": 2}}}},
 "tenants": {"acme"
   : {"tier": "free"}}}`
	tbl, err := tenant.Parse("tenants.json", []byte(good))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	acme, ok := tbl.TenantByID("acme")
	if !ok {
		t.Fatal("acme missing")
	}
	if got := acme.Rule("/inventory.v1.Inventory/Export").Limit.Burst; got != 2 {
		t.Errorf("Export burst = %d, want 2", got)
	}
	bad := `{"tiers": {"free": {"default": {"rate": 10, "burst": 20}}},
 "tenants": {"acme"
   : {"tier": "gold"},
  "\ud83d\ude00": {"tier": "free"}}}`
	_, err = tenant.Parse("tenants.json", []byte(bad))
	var ce *tenant.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Parse(bad) = %v, want a ConfigError", err)
	}
	msg := err.Error()
	for _, want := range []string{"tenants.json:3:", "gold", "tenants.json:4:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "escape") {
		t.Errorf("error %q is about an escape, not the config", msg)
	}
}

// TestSyntaxErrorLines: a YAML syntax error names the line it is on, or the
// line of the construct it breaks, for the library's parser and scanner
// errors alike, on the first line too; bytes that are not UTF-8 name theirs.
func TestSyntaxErrorLines(t *testing.T) {
	for _, tc := range []struct {
		name, config, want string
	}{
		{"unclosed flow mapping", "tiers:\n  free:\n    default: {rate: 10, burst: 20\ntenants: {}\n", "x.yaml:3:"},
		{"stray brace", "tiers: {}\ntenants: {}\nanonymous: {}}\n", "x.yaml:3:"},
		{"bad escape on line 1", "tiers: \"\\q\"\n", "x.yaml:1:"},
		{"not UTF-8 on line 2", "tiers: {}\ntenants: \"\xff\"\n", "x.yaml:2: config is not valid UTF-8"},
		{"not UTF-8 on line 3 of CR lines", "tiers: {}\rtenants: {}\ranonymous: \"\xff\"\r", "x.yaml:3: config is not valid UTF-8"},
		{"not UTF-8 on line 3 of CRLF lines", "tiers: {}\r\ntenants: {}\r\nanonymous: \"\xff\"\r\n", "x.yaml:3: config is not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tenant.Parse("x.yaml", []byte(tc.config))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestParseJSONRawCharacters: raw characters that YAML reads as line
// breaks or refuses, inside JSON strings, and a bare CR between a key and
// its colon, still give the config's own errors at the right lines.
func TestParseJSONRawCharacters(t *testing.T) {
	config := "{\"tiers\": {\"free\": {\"default\": {\"rate\": 10, \"burst\": 20}}},\r \"tenants\": {\"acme\"\r: {\"tier\": \"free\"},\n" +
		"  \"a\u2028b\": {\"tier\": \"free\"},\n" +
		"  \"c\x7fd\u0085e\": {\"tier\": \"free\"}}}"
	_, err := tenant.Parse("tenants.json", []byte(config))
	var ce *tenant.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Parse = %v, want a ConfigError", err)
	}
	msg := err.Error()
	// A bare CR ends a line too: the two bad names are on lines 4 and 5.
	for _, want := range []string{"tenants.json:4: tenants[", "tenants.json:5: tenants["} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "acme") {
		t.Errorf("error %q is about acme, which is valid", msg)
	}
}
