package main

import (
	"fmt"
	"strings"
)

// page renders the results as markdown: the answer first, then each
// run's seconds, then how to run it again.
func page(res *Results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Churn: one shared limit while the fleet changes\n\n")
	p("Replicas of a rate-limit service share one limit on one Redis: %d per second on one descriptor,\n", res.Rate)
	p("which floodgate keeps as a token bucket of rate %d/s and burst %d. %d closed-loop callers ask for it\n", res.Rate, res.Burst, res.Config.Callers)
	p("far above twice the limit, spread round-robin over the live replicas, while replicas start, die,\n")
	p("roll or lose their Redis. A token bucket admits at most burst + rate·t in any window of length t:\n")
	p("%d in a sliding second, %d/s in the seconds after the first. Each cell below: the most admitted in a\n", res.Burst+res.Rate, res.Rate)
	p("sliding second after the first ÷ rate (1 is exact; %.1f is a fresh burst on top), the most in a\n", float64(res.Burst+res.Rate)/float64(res.Rate))
	p("sliding 10 s window (the whole run when shorter) ÷ rate·window, and the share of the allowance\n")
	p("(rate × run + burst) the fleet admitted. envoyproxy/ratelimit counts fixed wall-clock seconds (the\n")
	p("load starts on one): %d in each, up to %d in a sliding second that straddles two.\n\n", res.Rate, 2*res.Rate)
	p("| variant | scenario | max 1 s ÷ rate | max 10 s ÷ rate·10 s | share used | steady share | errors |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, r := range res.Results {
		p("| `%s` | %s | %.2f | %.3f | %.3f | %.3f | %d |\n", r.Variant, r.Scenario,
			float64(r.Max1s)/float64(res.Rate), float64(r.MaxLong)/(float64(res.Rate)*r.Long), r.Share, r.Steady, r.Errors)
	}
	for _, r := range res.Results {
		if r.Scenario == "skew" {
			when := "never"
			if r.To95 >= 0 {
				when = fmt.Sprintf("at %.2f s", r.To95)
			}
			p("\nskew, `%s`: the one replica taking every call first admitted 95%% of the limit in a sliding second\n(counting from the end of the first second; a perfect bucket does at 1.95 s) %s.\n", r.Variant, when)
		}
	}
	p("\nThe steady share is what the seconds after the first admitted over rate × their length, counting\n")
	p("only the seconds in which the callers started at least twice the limit's calls.\n\n")
	p("This page: `%s`, %.0f s, on %s, %s; %s.\n\n", res.Command, res.Elapsed, res.Date, res.Machine, strings.Join(res.Versions, ", "))
	p("## Each run, second by second\n\n")
	p("Admitted in each whole second from the load's start; steps at their start\nand end, in seconds.\n\n")
	for _, r := range res.Results {
		p("- `%s` %s (%d replicas, %.1f s):", r.Variant, r.Scenario, r.Replicas, r.Seconds)
		for _, n := range r.PerSecond {
			p(" %d", n)
		}
		for _, e := range r.Events {
			p("; %s %.2f–%.2f", e.What, e.At, e.Done)
		}
		if r.Errors > 0 {
			p("; %d failed calls", r.Errors)
		}
		p("\n")
	}
	p("\n## Reproduce\n\n```sh\ncd bench && go run ./cmd/churn           # every scenario, both variants\n")
	p("cd bench && go run ./cmd/churn -quick    # times ÷ 3, written to $TMPDIR/floodgate-churn-quick\n")
	p("cd bench && GOWORK=off go test ./cmd/churn  # floodgate, quick, against the bounds\n```\n\n")
	p("floodgate-rls runs as `floodgate-rls -config DIR -addr 127.0.0.1:0 -redis ADDR -lease on -prefix P -watch 0`,\n")
	p("each scenario under a new prefix; envoyproxy/ratelimit with its defaults but ports, Redis and no statsd,\n")
	p("on a flushed Redis. The configuration, read by both:\n\n```yaml\n%s```\n", confText)
	return b.String()
}
