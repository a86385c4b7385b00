// Package bucketid names an RLQS BucketId, a map, by one canonical string.
package bucketid

import (
	"slices"
	"strconv"
	"strings"
)

// Name returns id's canonical string: its entries sorted by key, keys and
// values quoted, as {"api":"orders","tenant":"acme"}. Equal maps have one
// name, whatever their order, and no two maps share a name. Envoy keys its
// buckets by a hash of the BucketId proto, which ignores map order too.
func Name(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(k))
		b.WriteByte(':')
		b.WriteString(strconv.Quote(id[k]))
	}
	b.WriteByte('}')
	return b.String()
}
