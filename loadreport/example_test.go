package loadreport_test

import (
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-go/floodgate/loadreport"
	"github.com/floodgate-go/floodgate/middleware"
)

// A server that reports its load with every call it admits, and a client
// whose balancer weights each replica by those reports.
func Example() {
	lim, err := middleware.NewOverload()
	if err != nil {
		log.Fatal(err)
	}
	rep, err := loadreport.New(lim.Overload())
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(append(lim.ServerOptions(), rep.ServerOptions()...)...)
	// pb.RegisterYourServiceServer(srv, ...)
	if err := rep.Register(srv); err != nil { // out of band too
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	// A client of the fleet: its resolver lists every replica (DNS, xDS or
	// a resolver of your own).
	cc, err := grpc.NewClient("dns:///inventory.internal:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(loadreport.ServiceConfig))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
}
