package tenant_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgate-go/floodgate/tenant"
)

// FuzzParse feeds arbitrary bytes to Parse as YAML and as JSON. Parse must
// never panic, must return exactly one of a table and an error, and a table
// it returns must hold only usable rules.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"valid", "invalid"} {
		for _, path := range configFiles(f, dir) {
			data, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data, strings.HasSuffix(path, ".json"))
		}
	}
	f.Add([]byte("a: &a [*a, *a]\nb: *a\n"), false)
	f.Add([]byte("{\"tiers\": {\"a\": {\"default\": {\"rate\": \"inf\"}}}}"), true)
	f.Fuzz(func(t *testing.T, data []byte, isJSON bool) {
		name := "fuzz.yaml"
		if isJSON {
			name = "fuzz.json"
		}
		tbl, err := tenant.Parse(name, data)
		if (tbl == nil) == (err == nil) {
			t.Fatalf("Parse = %v, %v; want exactly one of a table and an error", tbl, err)
		}
		if err != nil {
			var ce *tenant.ConfigError
			if !errors.As(err, &ce) || len(ce.Errors) == 0 || !errors.Is(err, tenant.ErrInvalidConfig) {
				t.Fatalf("Parse error %T %v is not a non-empty *ConfigError", err, err)
			}
			for _, fe := range ce.Errors {
				if fe.File != name || fe.Msg == "" {
					t.Fatalf("FieldError %+v lacks its file or message", fe)
				}
			}
			return
		}
		for _, tn := range append(tbl.Tenants(), tbl.Anonymous()) {
			for _, m := range []string{"/a.B/C", "/x.Y/Z", "/llm.v1.Completions/Generate", "*", "", "/"} {
				r := tn.Rule(m)
				if err := r.Limit.Validate(); err != nil {
					t.Fatalf("%q.Rule(%q).Limit = %v: %v", tn.ID(), m, r.Limit, err)
				}
				if r.Cost < 1 || len(r.ID) != 8 {
					t.Fatalf("%q.Rule(%q) = %+v: bad cost or ID", tn.ID(), m, r)
				}
				if !r.Limit.IsInf() && !r.Limit.IsZero() && r.Cost > r.Limit.Burst {
					t.Fatalf("%q.Rule(%q) = %+v: cost exceeds burst", tn.ID(), m, r)
				}
				if mt := r.Meter; mt != nil {
					if err := mt.Limit.Validate(); err != nil || mt.Unit == "" || len(mt.ID) != 8 || mt.ID == r.ID {
						t.Fatalf("%q.Rule(%q).Meter = %+v: bad limit (%v), unit or ID", tn.ID(), m, mt, err)
					}
					if !mt.Limit.IsInf() && (mt.Estimate < 0 || mt.Estimate > mt.Limit.Burst || mt.Chunk < 1 || mt.Chunk > mt.Limit.Burst) {
						t.Fatalf("%q.Rule(%q).Meter = %+v: estimate or chunk outside the burst", tn.ID(), m, mt)
					}
				}
			}
		}
	})
}

// The seed corpus comes from testdata; make sure it is there.
func TestFuzzSeedsExist(t *testing.T) {
	if n := len(configFiles(t, "valid")) + len(configFiles(t, "invalid")); n < 10 {
		t.Errorf("only %d seed files in %s", n, filepath.Clean(testdata))
	}
}
