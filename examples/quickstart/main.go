// Command quickstart shows floodgate's three common cases, each wired into
// a gRPC server in a few lines, and calls each over loopback:
//
//   - a limit per client address (perAddress);
//   - overload protection alone, with no quota (overloadOnly);
//   - per-tenant quotas from a file, reloaded when it changes (fromFile).
//
// Run it with `go run ./examples/quickstart`. The functions between the
// "user code" markers are what an application writes; the rest serves and
// calls them.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-go/floodgate/middleware"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
	"github.com/floodgate-go/floodgate/tenant"
)

// ---- user code ----

// perAddress: every client address gets 50 calls a second, in bursts of
// up to 100.
func perAddress() (*grpc.Server, error) {
	l, err := middleware.NewPerAddress(50, 100)
	if err != nil {
		return nil, err
	}
	return grpc.NewServer(l.ServerOptions()...), nil
}

// overloadOnly: the server keeps to what it can complete and sheds the
// rest, the client addresses above their fair share first.
func overloadOnly() (*grpc.Server, error) {
	l, err := middleware.NewOverload()
	if err != nil {
		return nil, err
	}
	return grpc.NewServer(l.ServerOptions()...), nil
}

// fromFile: tenants and their quotas from a YAML file, reloaded when it
// changes, until ctx ends; callers name themselves with an x-api-key.
func fromFile(ctx context.Context, path string) (*grpc.Server, error) {
	l, err := middleware.NewFromFile(ctx, path, middleware.WithAPIKeyHeaders("x-api-key"))
	if err != nil {
		return nil, err
	}
	return grpc.NewServer(l.ServerOptions()...), nil
}

// ---- end of user code ----

// acmeKey is the demo tenant's API key; the config holds its SHA-256.
const acmeKey = "acme-demo-key-0001"

// tenantsYAML is fromFile's config: acme may make 5 calls in a burst,
// anyone else 2.
const tenantsYAML = `tenants:
  acme:
    keys: ["%s"]
    default: {rate: 1, burst: 5}
anonymous:
  default: {rate: 1, burst: 2}
`

// inventory answers every Allocate.
type inventory struct {
	inventoryv1.UnimplementedInventoryServer
}

func (inventory) Allocate(context.Context, *inventoryv1.AllocateRequest) (*inventoryv1.AllocateResponse, error) {
	return &inventoryv1.AllocateResponse{AllocationId: "a-1"}, nil
}

// outcome counts one case's calls by status code.
type outcome map[codes.Code]int

func (o outcome) String() string {
	return fmt.Sprintf("%d OK, %d RESOURCE_EXHAUSTED, %d UNAVAILABLE, %d other",
		o[codes.OK], o[codes.ResourceExhausted], o[codes.Unavailable],
		sumExcept(o, codes.OK, codes.ResourceExhausted, codes.Unavailable))
}

func sumExcept(o outcome, skip ...codes.Code) int {
	n := 0
outer:
	for c, v := range o {
		for _, s := range skip {
			if c == s {
				continue outer
			}
		}
		n += v
	}
	return n
}

// call serves srv on a loopback port and makes n Allocate calls, one after
// another, with the metadata md.
func call(ctx context.Context, srv *grpc.Server, n int, md metadata.MD) (outcome, error) {
	inventoryv1.RegisterInventoryServer(srv, inventory{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() { srv.Stop(); <-served }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	client := inventoryv1.NewInventoryClient(cc)
	ctx = metadata.NewOutgoingContext(ctx, md)
	o := outcome{}
	for range n {
		_, err := client.Allocate(ctx, &inventoryv1.AllocateRequest{Sku: "sku-1", Quantity: 1})
		o[status.Code(err)]++
	}
	return o, nil
}

// results are the three cases' outcomes.
type results struct {
	perAddress, overload, acme, anonymous outcome
}

// run builds each case's server, calls it and writes what happened to w.
func run(ctx context.Context, dir string, w io.Writer) (results, error) {
	var r results
	srv, err := perAddress()
	if err != nil {
		return r, err
	}
	if r.perAddress, err = call(ctx, srv, 120, nil); err != nil {
		return r, err
	}
	fmt.Fprintf(w, "per address, 120 calls in a row from one address (burst 100): %v\n", r.perAddress)

	if srv, err = overloadOnly(); err != nil {
		return r, err
	}
	if r.overload, err = call(ctx, srv, 50, nil); err != nil {
		return r, err
	}
	fmt.Fprintf(w, "overload only, 50 calls one at a time (the server is never overloaded): %v\n", r.overload)

	digest, err := tenant.HashKey(acmeKey)
	if err != nil {
		return r, err
	}
	path := filepath.Join(dir, "tenants.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, tenantsYAML, digest), 0o600); err != nil {
		return r, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops watching the file
	for _, c := range []struct {
		o  *outcome
		md metadata.MD
	}{{&r.acme, metadata.Pairs("x-api-key", acmeKey)}, {&r.anonymous, nil}} {
		if srv, err = fromFile(ctx, path); err != nil {
			return r, err
		}
		if *c.o, err = call(ctx, srv, 10, c.md); err != nil {
			return r, err
		}
	}
	fmt.Fprintf(w, "from %s, 10 calls as acme (burst 5): %v\n", filepath.Base(path), r.acme)
	fmt.Fprintf(w, "from %s, 10 calls with no key (burst 2): %v\n", filepath.Base(path), r.anonymous)
	return r, nil
}

func main() {
	if err := quickstart(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func quickstart() error {
	dir, err := os.MkdirTemp("", "floodgate-quickstart")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	_, err = run(context.Background(), dir, os.Stdout)
	return err
}
