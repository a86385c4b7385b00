package rls

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// An Offender is a descriptor often over the limit, as the over-limit
// summary estimates it.
type Offender struct {
	// Descriptor is the configured path ("domain.key_value.key"), or the
	// domain, keys and values of a detailed_metric descriptor.
	Descriptor string `json:"descriptor"`
	// Count is an upper bound of its over-limit decisions (shadow mode
	// included), and Count − Err a lower bound.
	Count uint64 `json:"count"`
	Err   uint64 `json:"err"`
}

// Top returns up to n of the descriptors most often over the limit since
// the service started, most first. The summary holds [WithTopK] entries:
// every descriptor with more than 1/k of all over-limit decisions is
// among them, whatever the number of distinct values.
func (s *Service) Top(n int) []Offender {
	items := s.top.Top(n)
	out := make([]Offender, len(items))
	for i, it := range items {
		out[i] = Offender{Descriptor: it.Key, Count: it.Count, Err: it.Err}
	}
	return out
}

// TopHandler serves [Service.Top] as JSON: {"total": N, "top": [...]},
// with ?n= entries (all tracked by default).
func (s *Service) TopHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.top.Cap()
		if v := r.URL.Query().Get("n"); v != "" {
			if x, err := strconv.Atoi(v); err == nil && x > 0 {
				n = x
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Total uint64     `json:"total"`
			Top   []Offender `json:"top"`
		}{s.top.Total(), s.Top(n)})
	})
}
