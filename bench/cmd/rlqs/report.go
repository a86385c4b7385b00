package main

import (
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"strings"
	"text/template"
)

//go:embed page.md.tmpl
var pageText string

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"f3":    func(v float64) string { return fmt.Sprintf("%.3f", v) },
	"f2":    func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"name":  variantName,
	"inter": func(r *Result) string { return intervalText(r.Interval) },
	"back":  func(r *Result) string { return backCell(r) },
	"conf":  func() string { return confText },
	"join":  joinFloats,
	"first": func(ws []Window) []float64 { return ws[len(ws)-1].Envoys },
	"met": func(cs []Check) int {
		n := 0
		for _, c := range cs {
			if c.OK {
				n++
			}
		}
		return n
	},
	"last":  func(vs []float64) float64 { return vs[len(vs)-1] },
	"sweep": sweepTable,
}).Parse(pageText))

// sweepTable renders the sweep's cells as a Markdown table: a row per
// fleet size and demand, a column per variant and interval.
func sweepTable(sw *Sweep, cells []*Cell) string {
	if sw == nil || len(cells) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| Envoys | demand ÷ limit |")
	sep := "|---:|---:|"
	for _, v := range sw.Variants {
		for _, iv := range sw.Intervals {
			fmt.Fprintf(&b, " %s, %g s |", variantName(v), iv)
			sep += "---:|"
		}
	}
	b.WriteString("\n" + sep + "\n")
	for _, n := range sw.Envoys {
		for _, d := range sw.Demands {
			fmt.Fprintf(&b, "| %d | %g |", n, d)
			for _, v := range sw.Variants {
				for _, iv := range sw.Intervals {
					text := "—"
					for _, c := range cells {
						if c.Variant == v && c.Envoys == n && c.Demand == d && c.Interval == iv {
							text = fmt.Sprintf("%.3f–%.3f", c.Min, c.Max)
						}
					}
					fmt.Fprintf(&b, " %s |", text)
				}
			}
			b.WriteString("\n")
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func variantName(v string) string {
	switch v {
	case vFloodgate:
		return "floodgate RLQS"
	case vReplicas:
		return "floodgate RLQS, 3 replicas on Redis"
	case vStatic:
		return "static split (as jukie/rlqs)"
	case vEven:
		return "even split (limit/N)"
	case vRLS:
		return "RLS v3, a call a request"
	}
	return v
}

func intervalText(iv float64) string {
	if iv == 0 {
		return "—"
	}
	return fmt.Sprintf("%g s", iv)
}

func backCell(r *Result) string {
	switch {
	case r.Scenario == sSteady:
		return "—"
	case r.Back < 0:
		return "never"
	}
	return fmt.Sprintf("%.2f s", r.Back)
}

func joinFloats(vs []float64, format string) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(parts, " ")
}

// page renders the results as markdown: the answer first, then each run's
// windows, then how to run it again.
func page(res *Results) ([]byte, error) {
	var b bytes.Buffer
	if err := pageTmpl.Execute(&b, res); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writePage(res *Results, path string) error {
	b, err := page(res)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
