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
package main

import (
	"errors"
	"flag"
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
	fs := flag.NewFlagSet("floodgate-keyhash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: floodgate-keyhash [KEY] (reads the key from standard input when no KEY is given)")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var key string
	switch fs.NArg() {
	case 0:
		// Read a little more than the longest valid key, so that an
		// over-long key is reported as such rather than truncated.
		data, err := io.ReadAll(io.LimitReader(stdin, tenant.MaxKeyLen+3))
		if err != nil {
			fmt.Fprintln(stderr, "floodgate-keyhash:", err)
			return 1
		}
		key = strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	case 1:
		key = fs.Arg(0)
	default:
		fs.Usage()
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
