// Package inventoryv1 holds the Go code generated from inventory.proto: the
// messages and the gRPC client and server of the inventory.v1.Inventory
// service that examples/multitenant serves and loads. The generated files are
// committed; regenerate them after editing inventory.proto with
//
//	go generate ./proto/...
//
// which needs protoc and the two plugins of proto/README.md on PATH.
package inventoryv1

//go:generate protoc --proto_path=../.. --go_out=../.. --go_opt=paths=source_relative --go-grpc_out=../.. --go-grpc_opt=paths=source_relative inventory/v1/inventory.proto
