package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Each case over a real loopback connection: the per-address burst, the
// overload controller admitting a server that is not overloaded, and the
// file's quotas for a tenant and for anyone else.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	r, err := run(t.Context(), t.TempDir(), &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	// 120 calls, one after another, take well under a second: the burst
	// of 100 and at most a few more at 50/s.
	if ok, re := r.perAddress[codes.OK], r.perAddress[codes.ResourceExhausted]; ok < 100 || ok > 115 || ok+re != 120 {
		t.Errorf("per address: %v; want 100-115 OK and the rest RESOURCE_EXHAUSTED", r.perAddress)
	}
	if r.overload[codes.OK] != 50 {
		t.Errorf("overload only: %v; want all 50 OK", r.overload)
	}
	for _, c := range []struct {
		name  string
		o     outcome
		burst int
	}{{"acme", r.acme, 5}, {"anonymous", r.anonymous, 2}} {
		if ok, re := c.o[codes.OK], c.o[codes.ResourceExhausted]; ok < c.burst || ok > c.burst+1 || ok+re != 10 {
			t.Errorf("from the file, %s: %v; want %d-%d OK and the rest RESOURCE_EXHAUSTED", c.name, c.o, c.burst, c.burst+1)
		}
	}
}

// The lines a user writes for each case, gofmt'd and with error checks:
// the body of its function, which the README quotes.
func TestLinesAUserWrites(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"perAddress": 8, "overloadOnly": 6, "fromFile": 10}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		most, ok := want[fd.Name.Name]
		if !ok {
			continue
		}
		delete(want, fd.Name.Name)
		lines := fset.Position(fd.Body.Rbrace).Line - fset.Position(fd.Body.Lbrace).Line - 1
		t.Logf("%s: %d lines", fd.Name.Name, lines)
		if lines > most {
			t.Errorf("%s takes %d lines, want at most %d", fd.Name.Name, lines, most)
		}
	}
	for name := range want {
		t.Errorf("no function %s in main.go", name)
	}
}
