//go:build !amd64 || race || purego

package keyed

import "sync/atomic"

// storeRelease stores v at addr with release order; see release_amd64.go.
func storeRelease(addr *uint64, v uint64) { atomic.StoreUint64(addr, v) }
