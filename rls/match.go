package rls

import (
	"strconv"
	"strings"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-go/floodgate"
)

// ReservationKey is the descriptor entry key that ties a request's charge
// to the charge on its response (Envoy's apply_on_stream_done): its value
// names the request (x-request-id, say). The entry is not part of the
// descriptor's match or bucket. See the package doc, "Charges on the
// response".
const ReservationKey = "floodgate.reservation"

// match is one descriptor's limit, as the config resolved it.
type match struct {
	rule  *rule
	limit floodgate.Limit
	rpu   uint32 // the limit as requests per unit, for responses
	unit  pb.RateLimitResponse_RateLimit_Unit
	cost  int    // tokens per hit (tenant rules' costs; 1 otherwise)
	key   string // the bucket's key in the store
	// top is the name the descriptor is counted under among the
	// over-limit offenders: its values when detailed_metric, else the
	// configured path.
	top string
}

// wildcardMatch reports whether value matches a pattern split on '*': each
// '*' matches zero or more bytes, as in envoyproxy/ratelimit.
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// lookup resolves entries against the domain's descriptors as
// envoyproxy/ratelimit does: at each level the entry's key and value, then
// the key's wildcard values in config order, then the key alone; a limit
// applies when the level that holds it is the descriptor's last entry.
// It returns the rule (nil when none applies) and, for each entry matched
// by a share_threshold wildcard, the pattern that stands for its value in
// the bucket key (nil when there is none).
func (d *domain) lookup(entries []*rlpb.RateLimitDescriptor_Entry) (*rule, []string) {
	level := &d.root
	var shared []string
	var found *rule
	for i, e := range entries {
		kn := level.keys[e.GetKey()]
		if kn == nil {
			return nil, nil
		}
		next := kn.values[e.GetValue()]
		if next == nil {
			for _, w := range kn.wild {
				if wildcardMatch(w.parts, e.GetValue()) {
					next = w.node
					if w.share {
						if shared == nil {
							shared = make([]string, len(entries))
						}
						shared[i] = w.pattern
					}
					break
				}
			}
		}
		if next == nil {
			next = kn.any
		}
		if next == nil {
			return nil, nil
		}
		if i == len(entries)-1 {
			found = next.rule
		}
		if len(next.keys) == 0 {
			break
		}
		level = next
	}
	return found, shared
}

// bucketKey names a descriptor's bucket: the domain and the request's
// entries, keys and values, each part length-prefixed so that no two
// descriptors share a key. It depends on the config only through
// share_threshold, so a bucket keeps its state across reloads that keep
// its descriptor, whatever its limit becomes.
func bucketKey(domain string, entries []*rlpb.RateLimitDescriptor_Entry, shared []string) string {
	n := len(domain) + 4
	for _, e := range entries {
		n += len(e.GetKey()) + len(e.GetValue()) + 8
	}
	var b strings.Builder
	b.Grow(n)
	part := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	part(domain)
	for i, e := range entries {
		b.WriteByte('|')
		part(e.GetKey())
		b.WriteByte('=')
		if shared != nil && shared[i] != "" {
			// A pattern cannot collide with a value: the marker byte
			// precedes it.
			b.WriteByte('*')
			part(shared[i])
			continue
		}
		part(e.GetValue())
	}
	return b.String()
}

// detailedName is envoyproxy/ratelimit's detailed metric key:
// domain.key_value.key_value, with values.
func detailedName(domain string, entries []*rlpb.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.GetKey())
		if e.GetValue() != "" {
			b.WriteByte('_')
			b.WriteString(e.GetValue())
		}
	}
	return b.String()
}

// splitReservation returns entries without the [ReservationKey] entry and
// that entry's value ("" when there is none). It allocates only when the
// entry is present.
func splitReservation(entries []*rlpb.RateLimitDescriptor_Entry) ([]*rlpb.RateLimitDescriptor_Entry, string, bool) {
	at := -1
	for i, e := range entries {
		if e.GetKey() == ReservationKey {
			at = i
			break
		}
	}
	if at < 0 {
		return entries, "", false
	}
	id := entries[at].GetValue()
	out := make([]*rlpb.RateLimitDescriptor_Entry, 0, len(entries)-1)
	for i, e := range entries {
		if i != at && e.GetKey() != ReservationKey {
			out = append(out, e)
		}
	}
	return out, id, true
}
