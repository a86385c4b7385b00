package floodgate_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pendingDocs are the directories whose doc comments are still being cleared
// of measurements, dates and machines. TestDocsStateContracts skips them and
// logs what they still hold (go test -v); empty the list as each is done.
var pendingDocs = []string{}

// A docRule is one way a doc comment cites a run, a date, a machine or the
// past: a phrase re matches, in a sentence that also matches in when in is
// set. A figure (a number with a unit, or a decimal) in the sentence is what
// tells "410 ns on this machine", a measurement, from "cannot be had on this
// machine", a contract.
type docRule struct {
	what string
	re   *regexp.Regexp
	in   *regexp.Regexp
	// skip, when set, lets a match through.
	skip func(sentence string, m []int) bool
}

const (
	// A sub-millisecond time: contracts state milliseconds and seconds
	// (a deadline, a cooldown); nanoseconds and microseconds are what a
	// benchmark reports.
	fineTime = `(?:ns|µs|μs|us|nanoseconds?|microseconds?)\b`
	number   = `\d[\d,]*(?:\.\d+)?`
	approx   = `(?:\babout|\baround|\broughly|\bnearly|\balmost|\bsome|\bapproximately|≈|~)`
	month    = `(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)`
)

var (
	// figure is a number with a unit, or a decimal.
	figure = regexp.MustCompile(`\d(?:[\d,]*(?:\.\d+)?)\s*(?:ns|µs|μs|us|ms|s|sec|%|×|x|B|KiB|MiB|GiB|allocs?|k|thousand|million)(?:\b|[^\w]|$)|\b\d+\.\d+\b`)
	// costWords tell "about 150 ns" beside a cost, a measurement, from a
	// bound, which a contract states exactly.
	costWords = regexp.MustCompile(`\b(?:costs?|costing|took|takes?|taking|adds?|added|spends?|spent|saves?|saved|on|measured|in all|against)\b`)
	// sentenceEnd splits a doc into sentences: a stop followed by space,
	// or a blank line.
	sentenceEnd = regexp.MustCompile(`[.;!?]\s+|\n\s*\n`)
)

var docRules = []docRule{
	// Figures of a run.
	{what: "a benchmark figure per op", re: regexp.MustCompile(number + `\s*(?:ns|µs|μs|us|ms|B|allocs)/op\b`)},
	{what: "a sub-millisecond time per operation", re: regexp.MustCompile(number + `\s*(?:ns|µs|μs|us)\s+(?:per|a|an|each)\s+(?:op|operation|call|take|decision|lookup|request|iteration|key)\b`)},
	{what: "a fractional sub-millisecond time", re: regexp.MustCompile(`\b\d+\.\d+\s*` + fineTime)},
	{what: "a cost in nanoseconds or microseconds", re: regexp.MustCompile(`\b(?:costs?|costing|took|takes|adds|added|saves|saved|spends|spent)\s+(?:only\s+|just\s+|under\s+|over\s+)?` + approx + `?\s*` + number + `\s*` + fineTime)},
	{what: "an approximate time beside a cost", re: regexp.MustCompile(approx + `\s*` + number + `(?:\s*(?:–|-|to)\s*` + number + `)?\s*` + fineTime), in: costWords},
	{what: "an approximate time beside a cost", re: regexp.MustCompile(`\b(?:a few|several|some) (?:hundred |dozen |tens of |hundreds of )?(?:nanoseconds|microseconds)\b`), in: costWords},
	{what: "runs aggregated", re: regexp.MustCompile(`(?i)\b(?:medians?|means?|averages?|best) of (?:\d+|two|three|four|five|six|seven|eight|nine|ten) (?:benchmark )?runs\b`)},
	{what: "a run", re: regexp.MustCompile(`\bin (?:a|one|the last|the latest|that|this|our|each|every|two|three|five|\d+) (?:benchmark |quiet |recent )?runs?\b`), in: figure},
	{what: "a measurement", re: regexp.MustCompile(`\bmeasured (?:on|at|in|as|by)\b`), in: figure},

	// Machines.
	{what: "a machine", re: regexp.MustCompile(`\bon (?:this|that|the|our|my)\b[^.;:()]{0,30}?\b(?:machine|VM|laptop|box)\b`), in: figure},
	{what: "a machine", re: regexp.MustCompile(`\bon the project's\b`), in: figure},
	{what: "a machine", re: regexp.MustCompile(`\bmachine kind\b`)},
	{what: "a benchmark machine", re: regexp.MustCompile(`\b(?:benchmark|bench|CI|test|build) (?:VM|machine|box|runner)s?\b`)},
	{what: "a machine's size", re: regexp.MustCompile(`\b\d+-(?:core|vCPU|CPU|cpu|thread)s?\b`)},
	{what: "a machine's size", re: regexp.MustCompile(`\bvCPUs?\b`)},
	{what: "a processor", re: regexp.MustCompile(`\b(?:EPYC|Xeon|Ryzen|Graviton|Apple M[1-9]|i[3579]-\d{4,5}[A-Z]*|GHz)\b`)},

	// Dates.
	{what: "a date", re: regexp.MustCompile(`\b20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b`)},
	{what: "a date", re: regexp.MustCompile(`\b` + month + `\.?(?:\s+\d{1,2}(?:st|nd|rd|th)?,?)?\s+20\d\d\b`)},
	{what: "a year", re: regexp.MustCompile(`\b20[1-3]\d\b`), skip: isCitation},

	// History.
	{what: "history", re: regexp.MustCompile(`(?i)\b(?:old|former|previous) default\b`)},
	{what: "history", re: regexp.MustCompile(`(?i)\bformerly\b`)},
	{what: "history", re: regexp.MustCompile(`\bused to (?:be|default|return|take|cost|admit|allow|start|shed|count)\b`)},
	{what: "history", re: regexp.MustCompile(`\bwas ` + number + `[^.;]{0,20}?\bnow ` + number)},
	{what: "history", re: regexp.MustCompile(`\b(?:since|until|before|as of) v\d+(?:\.\d+)*\b`)},
}

// A docHit is one phrase of a doc comment that cites a run, a date, a
// machine or the past.
type docHit struct {
	Line   int
	Phrase string
	Rule   string
}

// docLine is one line of a comment, as written, with its line number.
type docLine struct {
	line int
	text string
}

// checkDoc returns the phrases of a doc comment that break the rule. lines
// are the comment's lines without their comment markers.
func checkDoc(lines []docLine) []docHit {
	var b strings.Builder
	var starts []int // offset in b of each line
	for _, l := range lines {
		starts = append(starts, b.Len())
		b.WriteString(strings.TrimSpace(l.text))
		b.WriteString("\n")
	}
	text := b.String()
	lineAt := func(off int) int {
		i, found := slices.BinarySearch(starts, off)
		if !found {
			i--
		}
		return lines[max(i, 0)].line
	}
	var hits []docHit
	// Sentences: each from the end of the last stop or blank line to the
	// next.
	from := 0
	var bounds [][2]int
	for _, m := range sentenceEnd.FindAllStringIndex(text, -1) {
		bounds = append(bounds, [2]int{from, m[0] + 1})
		from = m[1]
	}
	bounds = append(bounds, [2]int{from, len(text)})
	for _, bd := range bounds {
		s := text[bd[0]:bd[1]]
		flat := strings.ReplaceAll(s, "\n", " ")
		var taken [][]int // the spans reported in this sentence
		for _, r := range docRules {
			if r.in != nil && !r.in.MatchString(flat) {
				continue
			}
			for _, m := range r.re.FindAllStringIndex(flat, -1) {
				if r.skip != nil && r.skip(flat, m) {
					continue
				}
				// One phrase, one report: the first rule to match it
				// names it.
				if slices.ContainsFunc(taken, func(t []int) bool { return m[0] < t[1] && t[0] < m[1] }) {
					continue
				}
				taken = append(taken, m)
				hits = append(hits, docHit{Line: lineAt(bd[0] + m[0]), Phrase: flat[m[0]:m[1]], Rule: r.what})
			}
		}
	}
	return hits
}

// isCitation reports whether the year at m closes a citation such as
// "(Metwally, Agrawal and El Abbadi, 2005)": the year a method was
// published, not a date of this project.
func isCitation(s string, m []int) bool {
	return strings.HasSuffix(s[:m[0]], ", ") && strings.HasPrefix(s[m[1]:], ")") &&
		strings.LastIndex(s[:m[0]], "(") > strings.LastIndex(s[:m[0]], ")")
}

// commentLines returns cg's lines without comment markers, skipping
// directives.
func commentLines(fset *token.FileSet, cg *ast.CommentGroup) []docLine {
	var out []docLine
	for _, c := range cg.List {
		line := fset.Position(c.Slash).Line
		switch {
		case strings.HasPrefix(c.Text, "//go:"), strings.HasPrefix(c.Text, "//line "):
		case strings.HasPrefix(c.Text, "//"):
			out = append(out, docLine{line, c.Text[2:]})
		default: // /* … */
			for i, l := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(c.Text, "/*"), "*/"), "\n") {
				out = append(out, docLine{line + i, l})
			}
		}
	}
	return out
}

// exportedDocs returns the doc comments of f that readers of its API see:
// the package doc, and those of exported identifiers, of methods on
// exported types, and of the exported fields and methods of exported
// struct and interface types (their trailing line comments included).
func exportedDocs(f *ast.File) []*ast.CommentGroup {
	var docs []*ast.CommentGroup
	add := func(cgs ...*ast.CommentGroup) {
		for _, cg := range cgs {
			if cg != nil {
				docs = append(docs, cg)
			}
		}
	}
	add(f.Doc)
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() && (d.Recv == nil || receiverExported(d.Recv)) {
				add(d.Doc)
			}
		case *ast.GenDecl:
			exported := false
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					exported = true
					add(s.Doc, s.Comment)
					var fields *ast.FieldList
					switch t := s.Type.(type) {
					case *ast.StructType:
						fields = t.Fields
					case *ast.InterfaceType:
						fields = t.Methods
					}
					if fields == nil {
						continue
					}
					for _, fd := range fields.List {
						if len(fd.Names) == 0 || slices.ContainsFunc(fd.Names, (*ast.Ident).IsExported) {
							add(fd.Doc, fd.Comment)
						}
					}
				case *ast.ValueSpec:
					if slices.ContainsFunc(s.Names, (*ast.Ident).IsExported) {
						exported = true
						add(s.Doc, s.Comment)
					}
				}
			}
			if exported {
				add(d.Doc)
			}
		}
	}
	return docs
}

func receiverExported(recv *ast.FieldList) bool {
	t := recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

// TestDocsStateContracts fails on a doc comment, of a package or of
// anything exported, in any module of the repository, that cites a run, a
// date, a machine or the past: a doc states what the thing does, its
// default and what a repeated call does. Measurements belong in
// BENCHMARKS.md, reasons and history in docs/DESIGN.md.
func TestDocsStateContracts(t *testing.T) {
	fset := token.NewFileSet()
	files, docs := 0, 0
	pending := map[string]int{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		p = filepath.ToSlash(p)
		if d.IsDir() {
			if name := d.Name(); p != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || p == "bench/results") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		top, _, _ := strings.Cut(p, "/")
		isPending := slices.Contains(pendingDocs, top)
		files++
		for _, cg := range exportedDocs(f) {
			docs++
			for _, h := range checkDoc(commentLines(fset, cg)) {
				if isPending {
					pending[top]++
					t.Logf("pending: %s:%d: %s: %q", p, h.Line, h.Rule, h.Phrase)
					continue
				}
				t.Errorf("%s:%d: doc cites %s: %q (measurements go to BENCHMARKS.md, reasons and history to docs/DESIGN.md)", p, h.Line, h.Rule, h.Phrase)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 || docs < 1000 {
		t.Fatalf("checked %d doc comments in %d files: is the test running in the repository's root?", docs, files)
	}
	for _, dir := range pendingDocs {
		t.Logf("pending: %s holds %d phrases to clear", dir, pending[dir])
	}
}

// TestCheckDoc feeds the matcher doc text that must and must not match, so
// that TestDocsStateContracts cannot pass by matching nothing.
func TestCheckDoc(t *testing.T) {
	bad := []struct {
		doc, phrase string
		line        int
	}{
		// The offenders this test was written against, as they were.
		{"TenantByKey hashes the key with SHA-256 and then calls\n[Table.TenantByDigest]; the hash dominates (on the project's 2-core\nbenchmark VM, about 150 ns in all for a 32-byte key and 250–300 ns for a\n128-byte one, against some 30 ns for the digest lookup and rule).", "on the project's 2-core benchmark VM", 2},
		{"[Table.TenantByKey] costs one SHA-256 of the key (about 150 ns for a\n32-byte key and 250–300 ns for a 128-byte one on the project's benchmark\nVM) plus a map lookup.", "about 150 ns", 1},
		{"[Table.TenantByKey] costs one SHA-256 of the key (about 150 ns for a\n32-byte key and 250–300 ns for a 128-byte one on the project's benchmark\nVM) plus a map lookup.", "on the project's benchmark VM", 2},
		{"It costs one SHA-256 over the key (a few\nhundred nanoseconds for a typical key).", "a few hundred nanoseconds", 1},
		{"The SDK's synchronous Add would hash the\nseries' seven attributes on every call (about 300 ns).", "about 300 ns", 2},
		{"On an admitted call it adds about 90 ns, as the other observer does.", "adds about 90 ns", 1},
		{"RatelimitVersion is the pseudo-version that RatelimitBinary installs: its main branch of 2026-01-22.", "2026-01-22", 1},
		{"Medians of five runs on a 2-vCPU VM (AMD EPYC, Go 1.26.8), 2026-11-30 to 2026-12-02.", "Medians of five runs", 1},
		{"Medians of five runs on a 2-vCPU VM (AMD EPYC, Go 1.26.8), 2026-11-30 to 2026-12-02.", "EPYC", 1},
		{"The old default of 1 let every instance admit the whole limit.", "old default", 1},
		// Other shapes of a run, a date or a machine.
		{"A take costs 70 ns and allocates nothing.", "costs 70 ns", 1},
		{"Measured in March 2026 on the CI runner.", "March 2026", 1},
		{"Measured in March 2026 on the CI runner.", "CI runner", 1},
		{"The table does one random access (285 ns against go-limiter's 682 in one run).", "in one run", 1},
		{"Measured on this machine kind: go-limiter ≈ 85 / 150 / 290 ns.", "on this machine", 1},
		{"A simplelru shard costs 410 ns/op at 1M keys.", "410 ns/op", 1},
		{"Redis answers in 57.1 µs a decision.", "57.1 µs a decision", 1},
		{"One caller waits 57.1 µs.", "57.1 µs", 1},
		{"It reads 0.50 at 2 ms on this machine.", "on this machine", 1},
		{"The limit was measured at 150 ns.", "measured at", 1},
		{"The divisor was 1, now 4.", "was 1, now 4", 1},
		{"The default changed in 2025 to Adaptive.", "2025", 1},
		{"Adaptive is the default since v2.", "since v2", 1},
	}
	for _, c := range bad {
		var lines []docLine
		for i, l := range strings.Split(c.doc, "\n") {
			lines = append(lines, docLine{i + 1, l})
		}
		hits := checkDoc(lines)
		if !slices.ContainsFunc(hits, func(h docHit) bool { return h.Phrase == c.phrase && h.Line == c.line }) {
			t.Errorf("checkDoc(%q) = %v, want %q on line %d", c.doc, hits, c.phrase, c.line)
		}
	}
	good := []string{
		"WithBreaker sets the breaker: the defaults are 5 failures and a 5 s cooldown.",
		"WithInterval sets how often the report is rebuilt. Default 100 ms; a repeated call replaces it.",
		"Histogram counts durations in log-linear buckets: exact below 64 ns, then 64 buckets per power of two.",
		"DefaultCallBuckets are the bounds, from 100 µs (a round trip on loopback) to 1 s.",
		"WithClock sets the clock the repayment of floodgate.cost.debt is measured on.",
		"ErrUnavailable marks a binary that cannot be had on this machine; the error that wraps it says why.",
		"MaxInFlight bounds each caller's calls in flight. Default 2000.",
		"Package topk keeps a summary by the Space-Saving algorithm (Metwally, Agrawal and El Abbadi, 2015).",
		"Overhead reports the median difference per call as overhead-ns/op; ns/op is a pair of calls.",
		"A Go server whose CPU never idles reads its sockets in batches about 10 ms apart.",
		"Wire and WireRejected are, in a run whose clients retry, the attempts that went on the network.",
		"Load is the offered load as a multiple of the measured capacity.",
		"It probes at most about every 26 s (256 steps of 100 ms).",
		"A key evicted again and again is one the Map no longer tracks; a repeated call replaces the earlier value.",
		"Each Allocate spends about 2ms of real CPU (-cost) on a server that holds tenants to their quotas.",
		"RatelimitVersion is the pseudo-version v0.0.0-20260122150000-3fb702589d36 that RatelimitBinary installs.",
		"With it, each round trip costs two clock reads and one call.",
		"A call's latency stays within about twice its service time.",
		"A process that saturates the one CPU it is pinned to reads 0.5 on a machine of two.",
		"WithDeadline bounds each decision's time, 50 ms by default; the defaults are 5 failures and 500 ms.",
		"ShedCauses returns every cause this release sheds calls for. Later releases may add causes.",
		"Output returns the last 4 KiB the process wrote; a digest is a SHA-256 of the key.",
	}
	for _, doc := range good {
		if hits := checkDoc([]docLine{{1, doc}}); len(hits) > 0 {
			t.Errorf("checkDoc(%q) = %v, want no hit: a contract, not a measurement", doc, hits)
		}
	}
}

func (h docHit) String() string { return fmt.Sprintf("%d: %s %q", h.Line, h.Rule, h.Phrase) }
