package main

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"syscall"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// nullServer answers every request OK without deciding: what a rate-limit
// service costs before it decides anything, on grpc-go and
// go-control-plane's types. Its response has the shape of a real one, an
// overall code and one status per descriptor, built once per descriptor
// count and shared, read-only, by every call.
type nullServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	responses []*rlsv3.RateLimitResponse
}

const nullMaxDescriptors = 16

func newNullServer() *nullServer {
	s := &nullServer{responses: make([]*rlsv3.RateLimitResponse, nullMaxDescriptors+1)}
	for n := range s.responses {
		r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
		for range n {
			r.Statuses = append(r.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
		}
		s.responses[n] = r
	}
	return s
}

func (s *nullServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.responses[min(len(req.Descriptors), nullMaxDescriptors)], nil
}

// nullMain serves the null server at -addr until SIGTERM or an interrupt.
func nullMain(args []string) error {
	fs := flag.NewFlagSet("null", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "gRPC listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, newNullServer())
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	return srv.Serve(l)
}
