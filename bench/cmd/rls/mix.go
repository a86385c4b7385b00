package main

import (
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The mix: the requests a gateway in front of an API and a login service
// would send, drawn once with a fixed seed into a pool that every caller
// walks from its own offset, so that every variant gets the same requests
// and the driver spends nothing on building them.
//
//	50%  bench-api, three descriptors: tenant; tenant and path; remote address
//	15%  bench-api, one descriptor: tenant
//	35%  bench-auth, two descriptors: user; plan and user
//
// Tenants (2,000) and remote addresses (20,000) are Zipf-distributed, so
// that the hottest few go over their limits at any throughput the servers
// reach and the rest stay under; users (50,000) are uniform, and 30% of
// the login requests are on the free plan, whose per-user limit is low.
// Paths: half under /search/ (the wildcard, 40 of them), the rest four
// fixed ones.
const (
	mixPool      = 1 << 16
	mixTenants   = 2000
	mixAddresses = 20000
	mixUsers     = 50000
	mixSearches  = 40
)

var mixPaths = []string{"/items", "/cart", "/checkout", "/account"}

// MixSummary describes the pool, for the page.
type MixSummary struct {
	Requests    int     `json:"requests"`
	Descriptors float64 `json:"descriptors_per_request"`
	// Buckets counts the distinct descriptors (domain, entries) of the
	// pool that the configuration limits: the buckets a server keeps for
	// it. (The pro plan's descriptor matches no limit.)
	Buckets int `json:"buckets"`
	// Top100 is the share of the pool's limited descriptors that fall on
	// its 100 most frequent buckets: the hot keys a lease or a cache
	// serves.
	Top100 float64 `json:"top100_share"`
}

// A mix is the pool of requests.
type mix struct {
	reqs    []*rlsv3.RateLimitRequest
	summary MixSummary
}

func entry(k, v string) *rlv3.RateLimitDescriptor_Entry {
	return &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}
}

func descriptor(entries ...*rlv3.RateLimitDescriptor_Entry) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: entries}
}

// newMix draws the pool with seed.
func newMix(seed uint64) *mix {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	tenant := rand.NewZipf(r, 1.2, 1, mixTenants-1)
	address := rand.NewZipf(r, 1.1, 1, mixAddresses-1)
	m := &mix{reqs: make([]*rlsv3.RateLimitRequest, mixPool)}
	seen := map[string]int{}
	descs := 0
	for i := range m.reqs {
		t := "t" + strconv.FormatUint(tenant.Uint64(), 10)
		var req *rlsv3.RateLimitRequest
		switch p := r.IntN(100); {
		case p < 50:
			path := mixPaths[r.IntN(len(mixPaths))]
			if r.IntN(2) == 0 {
				path = "/search/" + strconv.Itoa(r.IntN(mixSearches))
			}
			a := address.Uint64()
			addr := "10." + strconv.FormatUint(a>>16, 10) + "." + strconv.FormatUint(a>>8&255, 10) + "." + strconv.FormatUint(a&255, 10)
			req = &rlsv3.RateLimitRequest{Domain: domainAPI, Descriptors: []*rlv3.RateLimitDescriptor{
				descriptor(entry("tenant", t)),
				descriptor(entry("tenant", t), entry("path", path)),
				descriptor(entry("remote_address", addr)),
			}}
		case p < 65:
			req = &rlsv3.RateLimitRequest{Domain: domainAPI, Descriptors: []*rlv3.RateLimitDescriptor{
				descriptor(entry("tenant", t)),
			}}
		default:
			u := "u" + strconv.Itoa(r.IntN(mixUsers))
			plan := "pro"
			if r.IntN(100) < 30 {
				plan = "free"
			}
			req = &rlsv3.RateLimitRequest{Domain: domainAuth, Descriptors: []*rlv3.RateLimitDescriptor{
				descriptor(entry("user", u)),
				descriptor(entry("plan", plan), entry("user", u)),
			}}
		}
		m.reqs[i] = req
		descs += len(req.Descriptors)
		for _, d := range req.Descriptors {
			if d.Entries[0].Value == "pro" {
				continue
			}
			k := req.Domain
			for _, e := range d.Entries {
				k += "\x00" + e.Key + "\x00" + e.Value
			}
			seen[k]++
		}
	}
	counts := slices.Collect(maps.Values(seen))
	slices.Sort(counts)
	slices.Reverse(counts)
	limited, top := 0, 0
	for i, n := range counts {
		limited += n
		if i < 100 {
			top += n
		}
	}
	m.summary = MixSummary{Requests: len(m.reqs), Descriptors: float64(descs) / float64(len(m.reqs)), Buckets: len(seen),
		Top100: float64(top) / float64(limited)}
	return m
}
