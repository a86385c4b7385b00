package rlqsclient_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-go/floodgate/middleware"
	"github.com/floodgate-go/floodgate/rls/rlqsclient"
	"github.com/floodgate-go/floodgate/tenant"
)

// A gRPC server whose tenants' quotas are shared by the whole fleet: the
// Limiter takes each call's tokens from the Client, which decides locally
// at the share floodgate-rls assigned this instance, and reports on one
// stream.
func ExampleClient() {
	cc, err := grpc.NewClient("floodgate-rls:8081", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	// Each key is one RLQS bucket; floodgate-rls's config for the domain
	// "api" has a descriptor "key" with the limit, as the default BucketId
	// {"key": <bucket key>} names it.
	quotas, err := rlqsclient.New(cc, "api")
	if err != nil {
		log.Fatal(err)
	}
	defer quotas.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = quotas.Run(ctx) }() // reports every 5 s, until ctx ends

	tbl, err := tenant.Compile(&tenant.Config{
		Anonymous: &tenant.TenantSpec{Default: &tenant.LimitSpec{Rate: 100, Burst: 100}},
	})
	if err != nil {
		log.Fatal(err)
	}
	lim, err := middleware.New(quotas, middleware.Static(tbl))
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(lim.ServerOptions()...)
	defer srv.Stop()
	fmt.Println("serving")
	// Output: serving
}
