//go:build !race && !purego

package keyed

// storeRelease stores v at addr with release order: every load and store
// before it is visible to whoever loads v there. On amd64 every store is a
// release store, so it is a plain MOV, where atomic.StoreUint64 is an XCHG:
// a full barrier that cost a take about a tenth of its time. The function
// is opaque to the compiler, which cannot move memory accesses across the
// call. The race detector does not see assembly, so race builds use
// atomic.StoreUint64 instead (release_other.go).
//
//go:noescape
func storeRelease(addr *uint64, v uint64)
