package rls_test

import (
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/floodgate-go/floodgate/rls"
)

// compatConfig follows envoyproxy/ratelimit's test/config/basic_config.yaml
// and wildcard.yaml, with shadow mode and replaces beside them.
const compatConfig = `
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key6
    rate_limit: {unlimited: true}
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: specific
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: specific
      replaces: [{name: general}]
  - key: general
    rate_limit: {unit: minute, requests_per_unit: 1, name: general}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 10, burst: 3}
`

// TestMatching checks which limit each descriptor gets, through a real
// client, against every store.
func TestMatching(t *testing.T) {
	cases := []struct {
		name   string
		desc   []string
		code   pb.RateLimitResponse_Code
		rpu    uint32 // 0: no current_limit
		unit   pb.RateLimitResponse_RateLimit_Unit
		remain uint32
	}{
		{"nested key only", []string{"key1", "value1", "subkey1", "x"}, pb.RateLimitResponse_OK, 5, pb.RateLimitResponse_RateLimit_SECOND, 4},
		{"nested key and value", []string{"key1", "value1", "subkey1", "subvalue1"}, pb.RateLimitResponse_OK, 10, pb.RateLimitResponse_RateLimit_SECOND, 9},
		{"parent without limit", []string{"key1", "value1"}, pb.RateLimitResponse_OK, 0, 0, 0},
		{"unknown value at the parent", []string{"key1", "other", "subkey1", "x"}, pb.RateLimitResponse_OK, 0, 0, 0},
		{"deeper than the config", []string{"key2", "value2", "sub", "x"}, pb.RateLimitResponse_OK, 0, 0, 0},
		{"key default", []string{"key2", "anything"}, pb.RateLimitResponse_OK, 20, pb.RateLimitResponse_RateLimit_MINUTE, 19},
		{"value override", []string{"key2", "value2"}, pb.RateLimitResponse_OK, 30, pb.RateLimitResponse_RateLimit_MINUTE, 29},
		{"value without limit", []string{"key2", "value3"}, pb.RateLimitResponse_OK, 0, 0, 0},
		{"unlimited", []string{"key6", "v"}, pb.RateLimitResponse_OK, 0, 0, 4294967295},
		{"trailing wildcard", []string{"wild", "foobar"}, pb.RateLimitResponse_OK, 2, pb.RateLimitResponse_RateLimit_MINUTE, 1},
		{"trailing wildcard, empty rest", []string{"wild", "foo"}, pb.RateLimitResponse_OK, 2, pb.RateLimitResponse_RateLimit_MINUTE, 1},
		{"wildcard miss", []string{"wild", "fo"}, pb.RateLimitResponse_OK, 0, 0, 0},
		{"middle wildcard", []string{"midWild", "barxyzb"}, pb.RateLimitResponse_OK, 3, pb.RateLimitResponse_RateLimit_MINUTE, 2},
		{"unknown key", []string{"nope", "v"}, pb.RateLimitResponse_OK, 0, 0, 0},
		{"burst set", []string{"burst", "v"}, pb.RateLimitResponse_OK, 10, pb.RateLimitResponse_RateLimit_SECOND, 2},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			clock := newFakeClock()
			svc, err := rls.New(b.store(t, clock), mustParse(t, compatConfig))
			if err != nil {
				t.Fatal(err)
			}
			c := serve(t, svc)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					resp := call(t, c, request("test-domain", 0, desc(tc.desc...)))
					st := resp.GetStatuses()[0]
					if got := st.GetCode(); got != tc.code {
						t.Errorf("code = %v, want %v", got, tc.code)
					}
					if got := st.GetCurrentLimit().GetRequestsPerUnit(); got != tc.rpu {
						t.Errorf("current_limit.requests_per_unit = %d, want %d", got, tc.rpu)
					}
					if got := st.GetCurrentLimit().GetUnit(); got != tc.unit {
						t.Errorf("current_limit.unit = %v, want %v", got, tc.unit)
					}
					if got := st.GetLimitRemaining(); got != tc.remain {
						t.Errorf("limit_remaining = %d, want %d", got, tc.remain)
					}
				})
			}
		})
	}
}

// TestSemantics runs sequences of requests against every store, the clock
// still: buckets per value, hits_addend, all or nothing, shadow mode,
// replaces, unknown domains.
func TestSemantics(t *testing.T) {
	type step struct {
		req  *pb.RateLimitRequest
		want outcome
	}
	ok, over := "OK", "OVER_LIMIT"
	cases := []struct {
		name  string
		steps []step
	}{
		{"one bucket per value", []step{
			{request("test-domain", 0, desc("wild", "foo1")), outcome{ok, []string{ok}, []uint32{1}}},
			{request("test-domain", 0, desc("wild", "foo1")), outcome{ok, []string{ok}, []uint32{0}}},
			{request("test-domain", 0, desc("wild", "foo1")), outcome{over, []string{over}, []uint32{0}}},
			{request("test-domain", 0, desc("wild", "foo2")), outcome{ok, []string{ok}, []uint32{1}}},
		}},
		{"request hits_addend", []step{
			{request("test-domain", 7, desc("big", "a")), outcome{ok, []string{ok}, []uint32{3}}},
			{request("test-domain", 4, desc("big", "a")), outcome{over, []string{over}, []uint32{3}}},
			{request("test-domain", 3, desc("big", "a")), outcome{ok, []string{ok}, []uint32{0}}},
		}},
		{"descriptor hits_addend overrides the request's, 0 checks", []step{
			{request("test-domain", 1, withHits(desc("big", "b"), 4)), outcome{ok, []string{ok}, []uint32{6}}},
			{request("test-domain", 1, withHits(desc("big", "b"), 0)), outcome{ok, []string{ok}, []uint32{6}}},
			{request("test-domain", 1, withHits(desc("big", "b"), 6)), outcome{ok, []string{ok}, []uint32{0}}},
			{request("test-domain", 1, withHits(desc("big", "b"), 0)), outcome{ok, []string{ok}, []uint32{0}}},
		}},
		{"hits above the burst never fit", []step{
			{request("test-domain", 11, desc("big", "c")), outcome{over, []string{over}, []uint32{0}}},
			{request("test-domain", 10, desc("big", "c")), outcome{ok, []string{ok}, []uint32{0}}},
		}},
		{"negative hits refund", []step{
			{request("test-domain", 8, desc("big", "d")), outcome{ok, []string{ok}, []uint32{2}}},
			{&pb.RateLimitRequest{Domain: "test-domain", HitsAddend: 5, Descriptors: []*rlpbDescriptor{negative(desc("big", "d"))}},
				outcome{ok, []string{ok}, []uint32{7}}},
		}},
		{"one refuses, nothing is taken from any", []step{
			{request("test-domain", 0, desc("big", "e"), desc("small", "e")), outcome{ok, []string{ok, ok}, []uint32{9, 0}}},
			{request("test-domain", 0, desc("big", "e"), desc("small", "e")), outcome{over, []string{ok, over}, []uint32{9, 0}}},
			{request("test-domain", 0, desc("small", "e"), desc("big", "e")), outcome{over, []string{over, ok}, []uint32{0, 9}}},
			{request("test-domain", 0, desc("big", "e")), outcome{ok, []string{ok}, []uint32{8}}},
		}},
		{"shadow mode counts and never refuses", []step{
			{request("test-domain", 0, desc("shadowed", "s"), desc("big", "s")), outcome{ok, []string{ok, ok}, []uint32{0, 9}}},
			{request("test-domain", 0, desc("shadowed", "s"), desc("big", "s")), outcome{ok, []string{ok, ok}, []uint32{0, 8}}},
		}},
		{"replaces drops the named limit", []step{
			{request("test-domain", 0, desc("general", "g")), outcome{ok, []string{ok}, []uint32{0}}},
			{request("test-domain", 0, desc("general", "g")), outcome{over, []string{over}, []uint32{0}}},
			{request("test-domain", 0, desc("specific", "g"), desc("general", "g")), outcome{ok, []string{ok, ok}, []uint32{99, 0}}},
		}},
		{"unknown domain is unlimited", []step{
			{request("other", 0, desc("big", "f")), outcome{ok, []string{ok}, []uint32{0}}},
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					clock := newFakeClock()
					svc, err := rls.New(b.store(t, clock), mustParse(t, compatConfig))
					if err != nil {
						t.Fatal(err)
					}
					c := serve(t, svc)
					for i, s := range tc.steps {
						if diff := cmp.Diff(s.want, outcomeOf(call(t, c, s.req))); diff != "" {
							t.Errorf("step %d: response (-want +got):\n%s", i, diff)
						}
					}
				})
			}
		})
	}
}

// TestRefill checks that a bucket refills at requests_per_unit per unit.
func TestRefill(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			clock := newFakeClock()
			svc, err := rls.New(b.store(t, clock), mustParse(t, compatConfig))
			if err != nil {
				t.Fatal(err)
			}
			c := serve(t, svc)
			call(t, c, request("test-domain", 10, desc("big", "r"))) // 10 a minute: empty
			if got := call(t, c, request("test-domain", 0, desc("big", "r"))).GetOverallCode(); got != pb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("empty bucket: %v, want OVER_LIMIT", got)
			}
			clock.Advance(6 * time.Second) // one token
			resp := call(t, c, request("test-domain", 0, desc("big", "r")))
			if got := resp.GetOverallCode(); got != pb.RateLimitResponse_OK {
				t.Fatalf("after 6 s: %v, want OK", got)
			}
			if got, want := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(), time.Minute; got != want {
				t.Errorf("duration_until_reset = %v, want %v", got, want)
			}
		})
	}
}
