// Command fleet shows floodgate across a fleet of replicas: load reports
// that steer a client's balancer away from a replica before it sheds, and a
// caller's priority carried from one service to the next.
//
//	go run ./examples/fleet            # about four minutes, on loopback
//
// It starts every server as a process of its own (this command, re-run as
// "fleet replica"), each serving the inventory service's Allocate with a
// blocking handler: a call holds one connection of a small pool for 20 ms,
// so a replica's capacity is its pool over 20 ms, whatever the CPU does,
// and three replicas do not fight over the machine's cores. Every replica
// runs middleware.NewOverload and sends ORCA load reports (package
// loadreport) in the trailer of the calls it admits.
//
// It first measures the fleet's capacity as the overload experiment does
// (bench/cmd/overload): each replica without floodgate, driven back to back
// by closed-loop callers. Three experiments follow, each printed as a table
// (and written with -md), at multiples of that capacity:
//
//  1. Balancing. Three replicas, two with a pool of 12 and one with 4 (600,
//     600 and 200 calls a second), are driven by a client fleet (-conns
//     grpc-go connections, each with its own balancer) at 0.6, 0.9 and 1.2
//     times the fleet's capacity, with open-loop Poisson arrivals, once
//     with round_robin and once with weighted_round_robin
//     (loadreport.ServiceConfig). It measures what the fleet served within
//     the SLO (100 ms), the calls shed, by replica, and the p99 of served
//     calls.
//  2. A replica's capacity halves. Under weighted_round_robin at 0.6×, one
//     of the large replicas loses half its pool mid-run; the chart
//     (-chart) shows each replica's share of the calls over time, and the
//     table how long its share took to settle.
//  3. Priority across two hops. A front (no limits of its own) forwards
//     every call to a back of 400 calls a second, which trusts loopback
//     callers to name their priority. A noisy tenant (sheddable) sends 3×
//     the back's capacity through the front, a quiet one (critical) 40
//     calls a second: once without middleware.PropagatePriority on the
//     front's client, once with it.
//
// Run the parts alone with "fleet replica -h".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "replica" {
		return replicaCmd(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := defaultExperiment()
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "load before each cell's measurement, not counted")
	fs.DurationVar(&cfg.Measure, "measure", cfg.Measure, "how long each cell is measured")
	fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "client connections, each with its own balancer")
	fs.StringVar(&cfg.Only, "only", "", "run one part: capacity, balance, halve or chain")
	loads := fs.String("loads", "0.6,0.9,1.2", "with balance, the offered loads, as multiples of the fleet's capacity")
	fs.StringVar(&cfg.Balancers, "balancers", "round_robin,weighted_round_robin", "with balance, the balancers")
	fs.StringVar(&cfg.MD, "md", "", "also write the tables to this Markdown `file`")
	fs.StringVar(&cfg.Chart, "chart", "fleet.png", "chart `file` (PNG) of the halving run; empty draws none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.Loads = nil
	for _, f := range strings.Split(*loads, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return fmt.Errorf("-loads: %q is not a positive number", f)
		}
		cfg.Loads = append(cfg.Loads, v)
	}
	for _, b := range strings.Split(cfg.Balancers, ",") {
		if b != "round_robin" && b != "weighted_round_robin" {
			return fmt.Errorf("-balancers: %q is neither round_robin nor weighted_round_robin", b)
		}
	}
	if cfg.Warmup < 0 || cfg.Measure <= 0 || cfg.Conns < 1 {
		return errors.New("-warmup must not be negative, -measure and -conns must be positive")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Start = processStarter(exe, stderr)
	return experiment(ctx, cfg, stdout)
}

// defaultExperiment is the experiment go run ./examples/fleet runs.
func defaultExperiment() experimentConfig {
	return experimentConfig{
		Warmup:  5 * time.Second,
		Measure: 10 * time.Second,
		Conns:   4,
		SLO:     100 * time.Millisecond,
		Timeout: 500 * time.Millisecond,
		Pools:   []int{12, 12, 4},
		Hold:    20 * time.Millisecond,
		Loads:   []float64{0.6, 0.9, 1.2},
		// Balancers are the client's load-balancing policies compared.
		Balancers: "round_robin,weighted_round_robin",
	}
}
