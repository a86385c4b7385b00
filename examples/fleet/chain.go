package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// The two-hop chain's back: 4 connections × 10 ms, 400 calls a second.
const (
	backPool  = 4
	noisyRate = 3 * 400 // 3× the back's capacity
	quietRate = 40
)

// chainRun floods a front with a noisy sheddable tenant next to a quiet
// critical one, without and with priority propagation, and reports what
// each kept end to end.
func chainRun(ctx context.Context, cfg experimentConfig, w io.Writer) error {
	fmt.Fprintf(w, "## Priority across two hops: front → back (%d connections × 10 ms, %d calls/s)\n\n", backPool, backPool*100)
	fmt.Fprintf(w, "| front's client | quiet tenant (critical, %d/s) kept | its lost calls | noisy tenant (sheddable, %d/s) kept | back's goodput | p99 of the quiet tenant's calls |\n|---|---|---|---|---|---|\n", quietRate, noisyRate)
	for _, propagate := range []bool{false, true} {
		r, err := chainCell(ctx, cfg, propagate)
		if err != nil {
			return err
		}
		name := "plain"
		if propagate {
			name = "PropagatePriority"
		}
		fmt.Fprintf(w, "| %s | %.2f%% | %s | %.1f%% | %.0f calls/s | %.0f ms |\n", name,
			100*r.kept["quiet"]/r.sent["quiet"], r.lost(), 100*r.kept["noisy"]/r.sent["noisy"],
			(r.kept["quiet"]+r.kept["noisy"])/cfg.Measure.Seconds(), r.quietP99.Seconds()*1000)
	}
	fmt.Fprintln(w)
	return nil
}

type chainResult struct {
	sent, kept map[string]float64
	failed     map[string]int // the quiet tenant's failed calls, by code
	quietP99   time.Duration
}

// lost lists the quiet tenant's failed calls by status code.
func (r chainResult) lost() string {
	if len(r.failed) == 0 {
		return "none"
	}
	var parts []string
	for code, n := range r.failed {
		parts = append(parts, fmt.Sprintf("%d %s", n, code))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func chainCell(ctx context.Context, cfg experimentConfig, propagate bool) (chainResult, error) {
	back, stopBack, err := cfg.Start(ctx, replicaConfig{Pool: backPool, Hold: cfg.Hold / 2, TrustPriority: true})
	if err != nil {
		return chainResult{}, err
	}
	defer stopBack()
	front, stopFront, err := cfg.Start(ctx, replicaConfig{Forward: back, Propagate: propagate})
	if err != nil {
		return chainResult{}, err
	}
	defer stopFront()
	cc, err := grpc.NewClient(front, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return chainResult{}, err
	}
	defer cc.Close()
	client := inventoryv1.NewInventoryClient(cc)
	calls := drive(ctx, cfg, []inventoryv1.InventoryClient{client}, []stream{
		{name: "noisy", rate: noisyRate, md: metadata.Pairs("x-api-key", noisyKey)},
		{name: "quiet", rate: quietRate, md: metadata.Pairs("x-api-key", quietKey)},
	})
	r := chainResult{sent: map[string]float64{}, kept: map[string]float64{}, failed: map[string]int{}}
	var quiet []time.Duration
	for _, c := range calls {
		if c.at < cfg.Warmup {
			continue
		}
		r.sent[c.stream]++
		if c.code != codes.OK && c.stream == "quiet" {
			r.failed[c.code.String()]++
		}
		if c.code == codes.OK {
			r.kept[c.stream]++
			if c.stream == "quiet" {
				quiet = append(quiet, c.latency)
			}
		}
	}
	r.quietP99 = quantile(quiet, 0.99)
	return r, nil
}
