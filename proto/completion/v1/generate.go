// Package completionv1 holds the Go code generated from completion.proto:
// the messages and the gRPC client and server of the completion.v1.Completion
// service that examples/tokens serves and loads. The generated files are
// committed; regenerate them after editing completion.proto with
//
//	go generate ./proto/...
//
// which needs protoc and the two plugins of proto/README.md on PATH.
package completionv1

//go:generate protoc --proto_path=../.. --go_out=../.. --go_opt=paths=source_relative --go-grpc_out=../.. --go-grpc_opt=paths=source_relative completion/v1/completion.proto
