// Package vectors loads testdata/vectors/bucket.json, the token-bucket
// decisions that every floodgate store must reproduce, so that each store's
// tests read them the same way.
package vectors

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/floodgate-go/floodgate"
)

// A Case is one key's sequence of takes.
type Case struct {
	Name  string `json:"name"`
	Limit Limit  `json:"limit"`
	Steps []Step `json:"steps"`
}

// A Step is one take and the decision it must get. Times are whole
// microseconds from the case's start; waits are rounded up to the
// microsecond, -1 for never.
type Step struct {
	AtUS         int64  `json:"at_us"`
	N            int    `json:"n"`
	Limit        *Limit `json:"limit"` // replaces the case's limit from this step on
	Allowed      bool   `json:"allowed"`
	Remaining    int    `json:"remaining"`
	RetryAfterUS int64  `json:"retry_after_us"`
	ResetAfterUS int64  `json:"reset_after_us"`
}

// Limit is a floodgate.Limit as the file spells it.
type Limit struct {
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst"`
}

// Limit converts l.
func (l Limit) Limit() floodgate.Limit { return floodgate.Limit{Rate: l.Rate, Burst: l.Burst} }

// Load reads the shared vectors. It fails on an empty file: a test that
// checks no vector proves nothing.
func Load() ([]Case, error) {
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "testdata", "vectors", "bucket.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Cases []Case `json:"cases"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(f.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", path)
	}
	return f.Cases, nil
}

// Micros rounds d up to whole microseconds, -1 for floodgate.Never: the
// form of the vectors' waits.
func Micros(d time.Duration) int64 {
	if d == floodgate.Never {
		return -1
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
