// Package calltest makes the context of a gRPC server call for the metric
// exporters' tests, which call the Limiter's interceptors directly.
package calltest

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Context returns the context of a server call to method from
// 203.0.113.7:4242 with the incoming metadata md (nil: none). Its
// transport stream accepts header and trailer metadata and drops them.
func Context(method string, md metadata.MD) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: Addr})
	if md != nil {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	return grpc.NewContextWithServerTransportStream(ctx, nopStream{method})
}

// KeyContext is Context with the API key in x-api-key, or none when key
// is empty.
func KeyContext(method, key string) context.Context {
	if key == "" {
		return Context(method, nil)
	}
	return Context(method, metadata.Pairs("x-api-key", key))
}

type nopStream struct{ method string }

func (s nopStream) Method() string             { return s.method }
func (nopStream) SetHeader(metadata.MD) error  { return nil }
func (nopStream) SendHeader(metadata.MD) error { return nil }
func (nopStream) SetTrailer(metadata.MD) error { return nil }

// Addr is the caller's address.
var Addr = &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 4242}
