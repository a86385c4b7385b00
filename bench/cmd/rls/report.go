package main

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
)

// The page, docs/benchmarks/rls.md, is report.md.tmpl executed over the
// results: the prose is the template's, written by hand, and every table
// is a method of page below, computed from the results.

//go:embed report.md.tmpl
var reportTemplate string

// writeResults writes res as indented JSON to path.
func writeResults(res *Results, path string) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func readResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	res := &Results{}
	if err := json.Unmarshal(b, res); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// writeReport renders the page from res to path.
func writeReport(res *Results, path string) error {
	b, err := res.report()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func (res *Results) report() ([]byte, error) {
	t, err := template.New("rls").Option("missingkey=error").Funcs(template.FuncMap{"pct": pct}).Parse(reportTemplate)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, page{res}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// page is what the template renders.
type page struct{ *Results }

// variants returns the variants measured, in report order.
func (p page) variants() []string {
	var vs []string
	for _, v := range allVariants {
		if len(p.saturation(v)) > 0 {
			vs = append(vs, v)
		}
	}
	return vs
}

// ratio returns variant v's decisions per CPU-second over the null
// server's: the median over rounds of each round's ratio, so that a drift
// of the machine between rounds cancels; -1 without both.
func (p page) ratio(v string) float64 {
	var rs []float64
	for _, m := range p.saturation(v) {
		for _, n := range p.saturation(vNull) {
			if n.Round == m.Round && n.PerCPUSecond > 0 {
				rs = append(rs, m.PerCPUSecond/n.PerCPUSecond)
			}
		}
	}
	if len(rs) == 0 {
		return -1
	}
	return median(rs, func(x float64) float64 { return x })
}

// target returns variant v's target ratio and whether it has one.
func target(v string) (float64, bool) {
	switch v {
	case vMemory:
		return targetMemory, true
	case vRedis:
		return targetRedis, true
	}
	return 0, false
}

func mark(ok bool) string {
	if ok {
		return ""
	}
	return " ✗"
}

// Headline is the table of the targets, first on the page.
func (p page) Headline() string {
	var rows [][]string
	for _, v := range p.variants() {
		if v == vNull {
			continue
		}
		r := p.ratio(v)
		goal := "reported"
		cell := num(r, 2)
		if t, ok := target(v); ok {
			goal = "≥ " + num(t, 2)
			cell += mark(r >= t)
		}
		rows = append(rows, []string{"decisions per CPU-second ÷ null's", "`" + v + "`", goal, cell})
	}
	if a := p.Accuracy; a != nil {
		for _, r := range a.Runs {
			if !tokenBucket(r.Variant) {
				continue
			}
			all := append(slices.Clone(r.Steady), r.Edge...)
			n := 0
			for _, x := range all {
				if x.Within() {
					n++
				}
			}
			rows = append(rows, []string{fmt.Sprintf("admitted per descriptor, %d replica%s", r.Replicas, plural(r.Replicas)), "`" + r.Variant + "`",
				"within 1% of the allowance" + leaseNote(r.Variant), fmt.Sprintf("%d of %d%s", n, len(all), mark(n == len(all) && len(all) > 0))})
		}
		for _, r := range a.Runs {
			rows = append(rows, []string{fmt.Sprintf("admitted across a window edge, %d replica%s", r.Replicas, plural(r.Replicas)), "`" + r.Variant + "`",
				"reported", spread(r.Edge, p.limit(false)) + " × the limit"})
		}
	}
	return mdTable("lllr", []string{"measure", "variant", "target", "measured"}, rows)
}

func leaseNote(v string) string {
	if v == vRedis {
		return ", widened below by what leases may leave unspent"
	}
	return ""
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// SaturationTable is the closed-loop table, medians over rounds.
func (p page) SaturationTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		ms := p.saturation(v)
		med := func(f func(Measurement) float64) float64 { return median(ms, f) }
		ratio := "1"
		if v != vNull {
			ratio = num(p.ratio(v), 2)
			if t, ok := target(v); ok {
				ratio += mark(p.ratio(v) >= t)
			}
		}
		p99 := med(func(m Measurement) float64 { return m.P99 })
		callers := ms[0].Callers
		rows = append(rows, []string{"`" + v + "`", fmt.Sprint(callers),
			num(med(func(m Measurement) float64 { return m.PerSecond }), 0),
			num(med(func(m Measurement) float64 { return m.ServerCPU / m.Seconds }), 2),
			num(med(func(m Measurement) float64 { return m.RedisCPU / m.Seconds }), 2),
			"**" + num(med(func(m Measurement) float64 { return m.PerCPUSecond }), 0) + "**",
			ratio,
			num(med(func(m Measurement) float64 { return m.P50 }), 2),
			num(p99, 2) + mark(p99 <= float64(targetP99)/1e6),
			pct(med(func(m Measurement) float64 { return m.OverShare() })),
			num(med(func(m Measurement) float64 { return m.DriverCPU / m.Seconds }), 2),
			fmt.Sprint(sum(ms, func(m Measurement) int64 { return m.Errors })),
			fallbacks(v, sum(ms, func(m Measurement) int64 { return m.Fallbacks })),
		})
	}
	return mdTable("lrrrrrrrrrrrr", []string{"variant", "callers", "decisions/s", "server CPU", "redis CPU", "decisions per CPU-s", "÷ null", "p50 ms", "p99 ms", "over limit", "driver CPU", "errors", "fallbacks"}, rows)
}

// Rounds lists each round's decisions per CPU-second, for the spread.
func (p page) Rounds() string {
	var rows [][]string
	for _, v := range p.variants() {
		row := []string{"`" + v + "`"}
		for _, m := range p.saturation(v) {
			row = append(row, num(m.PerCPUSecond, 0))
		}
		rows = append(rows, row)
	}
	head := []string{"variant"}
	align := "l"
	for r := 1; r <= p.Config.Rounds; r++ {
		head = append(head, fmt.Sprintf("round %d", r))
		align += "r"
	}
	for i := range rows {
		for len(rows[i]) < len(head) {
			rows[i] = append(rows[i], "–")
		}
	}
	return mdTable(align, head, rows)
}

// Searches says where the callers were lowered to hold the p99.
func (p page) Searches() string {
	var lines []string
	for _, m := range p.Saturation {
		if len(m.Search) == 0 {
			continue
		}
		var tries []string
		for _, t := range m.Search {
			tries = append(tries, fmt.Sprintf("%d callers: p99 %.2f ms", t.Callers, t.P99))
		}
		lines = append(lines, fmt.Sprintf("- `%s`: %s; measured with %d caller%s (p99 %.2f ms).", m.Variant, strings.Join(tries, ", "), m.Callers, plural(m.Callers), m.P99))
	}
	if len(lines) == 0 {
		return fmt.Sprintf("Every variant held p99 ≤ 5 ms with %d callers.", p.Config.Callers)
	}
	return "The callers were halved where p99 exceeded 5 ms:\n\n" + strings.Join(lines, "\n")
}

// LatencyTable is the open-loop table at half of each saturation.
func (p page) LatencyTable() string {
	var rows [][]string
	for _, m := range p.Latency {
		rows = append(rows, []string{"`" + m.Variant + "`", num(m.Rate, 0), num(m.PerSecond, 0),
			num(m.P50, 2), num(m.P90, 2), num(m.P99, 2), num(m.P999, 2), num(m.Max, 1),
			num(m.PerCPUSecond, 0), fmt.Sprint(m.Late), fmt.Sprint(m.Errors), fallbacks(m.Variant, m.Fallbacks)})
	}
	return mdTable("lrrrrrrrrrrr", []string{"variant", "offered/s", "decisions/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "decisions per CPU-s", "late", "errors", "fallbacks"}, rows)
}

// limit returns the steady or the edge descriptors' limit per unit.
func (p page) limit(steady bool) int {
	if p.Accuracy == nil {
		return 0
	}
	if steady {
		return p.Accuracy.Limits.Steady
	}
	return p.Accuracy.Limits.Edge
}

// spread returns the range of admitted/limit over as.
func spread(as []Admitted, limit int) string {
	if len(as) == 0 || limit == 0 {
		return "–"
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, a := range as {
		x := float64(a.Admitted) / float64(limit)
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	if num(lo, 3) == num(hi, 3) {
		return num(lo, 3)
	}
	return num(lo, 3) + "–" + num(hi, 3)
}

// AccuracyTable has a row per configuration and pattern.
func (p page) AccuracyTable() string {
	a := p.Accuracy
	if a == nil {
		return "Not run."
	}
	var rows [][]string
	for _, r := range a.Runs {
		for _, pat := range []struct {
			name  string
			as    []Admitted
			limit int
		}{{"steady 2×", r.Steady, a.Limits.Steady}, {"edge bursts", r.Edge, a.Limits.Edge}} {
			var adm, allow, bounds, ratio []string
			n := 0
			for _, x := range pat.as {
				if x.First > 0 {
					adm = append(adm, fmt.Sprintf("%d (%d + %d)", x.Admitted, x.First, x.Admitted-x.First))
				} else {
					adm = append(adm, fmt.Sprint(x.Admitted))
				}
				allow = append(allow, num(x.Allowance, 0))
				lo, hi := x.Bounds()
				bounds = append(bounds, num(math.Ceil(lo), 0)+"–"+num(math.Floor(hi), 0))
				ratio = append(ratio, num(float64(x.Admitted)/x.Allowance, 3))
				if x.Within() {
					n++
				}
			}
			within := "–"
			if tokenBucket(r.Variant) {
				within = fmt.Sprintf("%d of %d%s", n, len(pat.as), mark(n == len(pat.as)))
			}
			algo := "fixed window"
			if tokenBucket(r.Variant) {
				algo = "token bucket"
			}
			target := "–"
			if tokenBucket(r.Variant) {
				target = strings.Join(bounds, ", ")
			}
			rows = append(rows, []string{"`" + r.Variant + "`", fmt.Sprint(r.Replicas), pat.name, fmt.Sprint(pat.limit),
				strings.Join(adm, ", "), spread(pat.as, pat.limit), algo, strings.Join(allow, ", "), strings.Join(ratio, ", "), target, within})
		}
		rows[len(rows)-2] = append(rows[len(rows)-2], fmt.Sprint(r.Errors), fallbacks(r.Variant, r.Fallbacks))
		rows[len(rows)-1] = append(rows[len(rows)-1], "", "")
	}
	return mdTable("lrlrlrlllllrr", []string{"variant", "replicas", "pattern", "limit", "admitted, per value", "÷ limit", "algorithm", "allowance", "÷ allowance", "target range", "within", "errors", "fallbacks"}, rows)
}

// Timings lists when each configuration's drain and bursts happened,
// relative to the edge, and says where a burst missed its side of it.
func (p page) Timings() string {
	if p.Accuracy == nil {
		return ""
	}
	var lines []string
	for _, r := range p.Accuracy.Runs {
		b := r.Bursts
		l := fmt.Sprintf("- `%s` ×%d: the drain answered at E%+.2f s; the bursts from E%+.2f to E%+.2f s and from E%+.2f to E%+.2f s",
			r.Variant, r.Replicas, r.Drained, b[0][0], b[0][1], b[1][0], b[1][1])
		if b[0][1] > 0 || b[1][0] < 0 {
			l += " ✗ (a burst crossed the edge: its figures do not show the window's 2×)"
		}
		lines = append(lines, l+".")
	}
	return strings.Join(lines, "\n")
}

// Unit is the accuracy descriptors' unit.
func (p page) Unit() string {
	if p.Accuracy == nil {
		return ""
	}
	return p.Accuracy.Limits.Unit
}

// Notes lists what did not apply: isolation notes, unavailable variants.
func (p page) Notes() string {
	var lines []string
	if p.Isolation.Taskset != "" {
		lines = append(lines, fmt.Sprintf("- Pinned with taskset: every server and redis-server on CPU %d, the driver on CPU %d.", p.Isolation.ServerCPU, p.Isolation.DriverCPU))
	}
	for _, n := range p.Isolation.Notes {
		lines = append(lines, "- "+n+".")
	}
	for _, v := range allVariants {
		if why, ok := p.Unavailable[v]; ok {
			lines = append(lines, fmt.Sprintf("- `%s` did not run: %s.", v, strings.TrimSuffix(why, ".")))
		}
	}
	return strings.Join(lines, "\n")
}

// VersionList lists what each variant ran.
func (p page) VersionList() string {
	var lines []string
	for _, v := range allVariants {
		if ver, ok := p.Versions[v]; ok {
			lines = append(lines, fmt.Sprintf("- `%s`: %s — %s", v, variantTitles[v], ver))
		}
	}
	return strings.Join(lines, "\n")
}

// RatelimitEnv is envoyproxy/ratelimit's environment, one line each.
func (p page) RatelimitEnv() string { return strings.Join(p.Env, "\n") }

// placeholder marks the settings that change from run to run in
// Results.Env.
const placeholder = "…"

// APIConfig is the configuration of the mix's two domains.
func (p page) APIConfig() string {
	files := configFiles(accuracyLimitsFor(p.Config.Quick))
	return strings.TrimSpace(files[domainAPI+".yaml"] + "---\n" + files[domainAuth+".yaml"])
}

// LeaseFlag is floodgate-rls's -lease in the Redis variant.
func (p page) LeaseFlag() string {
	if p.Config.Lease <= 0 {
		return "off"
	}
	return p.Config.Lease.String()
}

// Minutes is how long the run took.
func (p page) Minutes() string { return fmt.Sprintf("%.1f min", p.Elapsed/60) }

// fallbacks shows a fallback count where the variant reports one:
// floodgate-rls's metric, which envoyproxy/ratelimit has no equivalent of.
func fallbacks(v string, n int64) string {
	if !tokenBucket(v) {
		return "–"
	}
	return fmt.Sprint(n) + mark(n == 0 || v == vMemory)
}

func sum[T any](xs []T, f func(T) int64) int64 {
	var s int64
	for _, x := range xs {
		s += f(x)
	}
	return s
}

// mdTable returns a markdown table of rows under head; align has a letter
// per column, l or r.
func mdTable(align string, head []string, rows [][]string) string {
	var b strings.Builder
	line := func(cells []string) { b.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
	line(head)
	for _, a := range align {
		b.WriteString(map[rune]string{'l': "|---", 'r': "|---:"}[a])
	}
	b.WriteString("|\n")
	for _, r := range rows {
		line(r)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func num(v float64, prec int) string {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func pct(v float64) string {
	if v < 0 || math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}
