package rls

import (
	"github.com/floodgate-go/floodgate/rls/internal/bucketid"
	"strconv"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// lookupBucket resolves an RLQS BucketId, an unordered map, against the
// domain's descriptors. The config tree supplies the order: from the root,
// it takes at each level a key the config names there (config order breaks
// ties) whose value matches as [domain.lookup] matches it, until the path
// holds exactly the map's keys. The path found is then resolved by lookup
// itself, so that its rule and bucket are the ones an RLS descriptor with
// the same entries in that order gets. It returns the entries in path
// order, nil when no path holds exactly the map's keys.
func (d *domain) lookupBucket(id map[string]string) []*rlpb.RateLimitDescriptor_Entry {
	if len(id) == 0 || d.tenants != nil {
		return nil
	}
	path := make([]*rlpb.RateLimitDescriptor_Entry, 0, len(id))
	used := make(map[string]bool, len(id))
	var walk func(level *node) bool
	walk = func(level *node) bool {
		if len(path) == len(id) {
			return true
		}
		for _, k := range level.order {
			v, ok := id[k]
			if !ok || used[k] {
				continue
			}
			next := level.keys[k].next(v)
			if next == nil {
				continue
			}
			used[k] = true
			path = append(path, &rlpb.RateLimitDescriptor_Entry{Key: k, Value: v})
			if walk(next) {
				return true
			}
			path = path[:len(path)-1]
			used[k] = false
		}
		return false
	}
	if !walk(&d.root) {
		return nil
	}
	return path
}

// next is the node value v leads to, as lookup picks it: the exact value,
// then the wildcards in config order, then the key alone.
func (kn *keyNode) next(v string) *node {
	if n := kn.values[v]; n != nil {
		return n
	}
	for _, w := range kn.wild {
		if wildcardMatch(w.parts, v) {
			return w.node
		}
	}
	return kn.any
}

// bucketIDKey is a canonical name for a BucketId within a domain: the
// domain, length-prefixed (quotaSub.domain reads it back), then the map's
// name, so that equal maps name one subscription and no two maps share a
// name.
func bucketIDKey(domain string, id map[string]string) string {
	return strconv.Itoa(len(domain)) + ":" + domain + bucketid.Name(id)
}
