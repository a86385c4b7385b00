// Command floodgate-keyhash prints the SHA-256 hex digest of an API key:
// the form in which floodgate tenant configs list keys, so that the keys
// themselves never sit in a config file.
//
// Usage:
//
//	printf %s "$API_KEY" | go run ./cmd/floodgate-keyhash
//	go run ./cmd/floodgate-keyhash < key.txt
//	go run ./cmd/floodgate-keyhash KEY
//
// Prefer standard input: a key given as an argument lands in shell history
// and is visible to other users in the process list. One trailing newline
// is stripped from standard input. A key that tenant lookups would treat as
// malformed (empty, longer than 256 bytes, or not printable ASCII without
// spaces) is an error rather than a digest that could never match.
//
// The command has no flags: an argument is the key, even one that starts
// with "-" (as one random key in 64 does), except a lone -h, -help or
// --help. An argument "--" before the key is skipped.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/floodgate-go/floodgate/tenant"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the command with its environment passed in, for tests. It returns
// the exit status: 0 on success, 1 for a bad key, 2 for bad usage.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintln(stderr, "usage: floodgate-keyhash [KEY] (reads the key from standard input when no KEY is given)")
	}
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		usage()
		return 0
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	var key string
	switch len(args) {
	case 0:
		// Read a little more than the longest valid key, so that an
		// over-long key is reported as such rather than truncated.
		data, err := io.ReadAll(io.LimitReader(stdin, tenant.MaxKeyLen+3))
		if err != nil {
			fmt.Fprintln(stderr, "floodgate-keyhash:", err)
			return 1
		}
		key = string(data)
		if k, ok := strings.CutSuffix(key, "\n"); ok {
			key = strings.TrimSuffix(k, "\r") // a CRLF line end
		}
	case 1:
		key = args[0]
	default:
		usage()
		return 2
	}
	hash, err := tenant.HashKey(key)
	if err != nil {
		fmt.Fprintln(stderr, "floodgate-keyhash:", err)
		return 1
	}
	fmt.Fprintln(stdout, hash)
	return 0
}
