package loadgen

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// A Probe is the outcome of a capacity measurement.
type Probe struct {
	Capacity float64       // calls per second served
	CPU      time.Duration // process CPU time per served call, client included; 0 when unknown
	Callers  int
	Length   time.Duration
}

// ProbeCapacity measures the server's capacity: callers closed-loop callers
// of an unlimited tenant (API key key) send Allocate calls for sku back to
// back for about length, enough to keep every CPU busy, and the calls
// served per second are the capacity. On a machine shared with other work
// this is the capacity the server really gets, which the CPU budget alone
// would overstate. The first call that fails ends the probe with its error.
func ProbeCapacity(ctx context.Context, addr, key, sku string, callers int, length time.Duration) (Probe, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Probe{}, err
	}
	defer conn.Close()
	client := inventoryv1.NewInventoryClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, APIKeyHeader, key)
	call := func() error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{Sku: sku, Quantity: 1})
		return err
	}
	for range 10 { // connect and warm up
		if err := call(); err != nil {
			return Probe{}, err
		}
	}
	cpu0, cpuOK := processCPU()
	start := time.Now()
	var (
		served atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	for range callers {
		wg.Go(func() {
			for time.Since(start) < length && failed.Load() == nil {
				if err := call(); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := failed.Load(); err != nil {
		return Probe{}, *err
	}
	n := served.Load()
	if n == 0 {
		return Probe{}, errors.New("no call served")
	}
	p := Probe{Capacity: float64(n) / elapsed.Seconds(), Callers: callers, Length: elapsed}
	if cpu1, ok := processCPU(); cpuOK && ok && cpu1 > cpu0 {
		p.CPU = (cpu1 - cpu0) / time.Duration(n)
	}
	return p, nil
}
