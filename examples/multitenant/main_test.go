package main

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/floodgate-go/floodgate/internal/burn"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testBurner is calibrated once for the whole test binary.
var testBurner = sync.OnceValue(burn.Calibrate)

// testdata returns the path of a file in the repository's
// testdata/multitenant directory.
func testdata(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join("..", "..", "testdata", "multitenant", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}
