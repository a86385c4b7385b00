package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// A run's results are written twice. The raw results (-out,
// results/raw/overload.json, which git ignores) hold every second of every
// run, from which the charts are drawn. The summary (-summary,
// results/overload.json, committed) holds what the report's tables need,
// and the report is always rendered from it, so that the committed
// summary reproduces the committed report.

// summary returns a copy of res without what only the charts read (the
// runs' seconds and gate readings, the matrix runs' seconds, the matrix
// capacity measurements' steps), the servers' addresses, and the tenants'
// rates outside the tenant burst, whose table alone reads them. The few
// figures the tables take from the seconds (Run.Calls,
// Results.SweepCosts) are computed first; a summary's summary is the
// summary.
func (res *Results) summary() (*Results, error) {
	b, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	s := &Results{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, err
	}
	if costs := res.sweepCosts(); len(costs) > 0 {
		s.SweepCosts = costs
	}
	for i := range s.Runs {
		r := &s.Runs[i]
		if len(r.Seconds) > 0 {
			r.Calls = 0
			for _, sec := range r.Seconds {
				r.Calls += sec.Sent
			}
		}
		r.Seconds, r.Gate, r.Ready = nil, nil, serverReady{}
		if r.Scenario != "burst" {
			for k := range r.Windows {
				r.Windows[k].TenantSent, r.Windows[k].TenantGood = nil, nil
			}
		}
	}
	if m := s.Matrix; m != nil {
		for i := range m.Runs {
			r := &m.Runs[i]
			r.Seconds, r.Server = nil, serverReady{}
			for _, w := range []*Window{&r.Judged, r.First} {
				if w != nil {
					w.TenantSent, w.TenantGood = nil, nil
				}
			}
		}
		for i := range m.Capacities {
			m.Capacities[i].Steps = nil
		}
	}
	return s, nil
}

// sweepCosts returns the sweep's estimate of a rejection's CPU
// (rejectionCost) by variant, where the runs' seconds give one.
func (res *Results) sweepCosts() map[string]Fit {
	costs := map[string]Fit{}
	for _, v := range res.variants() {
		if fit, ok := res.rejectionCost(v); ok {
			costs[v] = fit
		}
	}
	return costs
}

// resultsFile is the JSON of a results file: the results, and the columns
// of their windows, each of which is one row (see Window.MarshalJSON).
type resultsFile struct {
	WindowColumns []string `json:"window_columns"`
	*Results
}

// windowColumns returns the JSON names of Window's fields, in order: the
// columns of a window's row.
func windowColumns() []string {
	t := reflect.TypeFor[Window]()
	cols := make([]string, t.NumField())
	for i := range cols {
		cols[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return cols
}

// MarshalJSON writes the window as a row of its fields' values, in the
// order of windowColumns: a results file holds hundreds of windows, and
// their fields' names would be most of it.
func (w Window) MarshalJSON() ([]byte, error) {
	v := reflect.ValueOf(w)
	row := make([]any, v.NumField())
	for i := range row {
		row[i] = v.Field(i).Interface()
	}
	return json.Marshal(row)
}

// UnmarshalJSON reads a window's row, or the object of results written
// before windows were rows.
func (w *Window) UnmarshalJSON(b []byte) error {
	if b = bytes.TrimSpace(b); len(b) > 0 && b[0] == '{' {
		type object Window // without this method
		return json.Unmarshal(b, (*object)(w))
	}
	var row []json.RawMessage
	if err := json.Unmarshal(b, &row); err != nil {
		return err
	}
	v := reflect.ValueOf(w).Elem()
	if len(row) != v.NumField() {
		return fmt.Errorf("a window of %d columns, want %d", len(row), v.NumField())
	}
	for i, col := range row {
		if err := json.Unmarshal(col, v.Field(i).Addr().Interface()); err != nil {
			return fmt.Errorf("window column %s: %w", windowColumns()[i], err)
		}
	}
	return nil
}

// raw reports whether res holds its runs' seconds: raw results, not a
// summary.
func (res *Results) raw() bool {
	return slices.ContainsFunc(res.Runs, func(r Run) bool { return len(r.Seconds) > 0 })
}

// writeSummary writes res's summary to path.
func writeSummary(res *Results, path string) error {
	sum, err := res.summary()
	if err != nil {
		return err
	}
	return writeResults(sum, path)
}

func writeResults(res *Results, path string) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(resultsFile{WindowColumns: windowColumns(), Results: res}, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(oneLineArrays(b), '\n'), 0o644)
}

func readResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f := resultsFile{Results: &Results{}}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.WindowColumns != nil && !slices.Equal(f.WindowColumns, windowColumns()) {
		return nil, fmt.Errorf("%s: its windows' columns are %v, this program's %v", path, f.WindowColumns, windowColumns())
	}
	return f.Results, nil
}

// oneLineArrays puts every array of indented JSON that holds no object
// and some value other than an array on one line: a window, a row whose
// columns may be arrays of numbers, is one line of the file, and an array
// of windows a line per window.
func oneLineArrays(b []byte) []byte {
	var out [][]byte
	var open []int // the lines of out that open the arrays still open
	for _, line := range bytes.Split(b, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(open) == 0 || string(t) != "]" && string(t) != "]," {
			if bytes.HasSuffix(t, []byte("[")) {
				open = append(open, len(out))
			}
			out = append(out, line)
			continue
		}
		i := open[len(open)-1]
		open = open[:len(open)-1]
		items := out[i+1:]
		object := slices.ContainsFunc(items, func(l []byte) bool {
			l = bytes.TrimSpace(l)
			return bytes.HasSuffix(l, []byte("{")) || bytes.HasPrefix(l, []byte("}"))
		})
		rows := !slices.ContainsFunc(items, func(l []byte) bool { return !bytes.HasPrefix(bytes.TrimSpace(l), []byte("[")) })
		if object || rows {
			out = append(out, line)
			continue
		}
		joined := slices.Clone(out[i])
		for k, l := range items {
			if k > 0 {
				joined = append(joined, ' ')
			}
			joined = append(joined, bytes.TrimSpace(l)...)
		}
		out = append(out[:i], append(joined, t...))
	}
	return bytes.Join(out, []byte("\n"))
}
