package promfloodgate

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/floodgate-go/floodgate/internal/labels"
	"github.com/floodgate-go/floodgate/internal/topk"
	"github.com/floodgate-go/floodgate/middleware"
)

// DefaultOffenders is the number of subjects an Offenders tracks when
// WithCapacity is not given.
const DefaultOffenders = 64

// HashedKeyLen is the length of a hashed address: the first 12 hex digits
// (48 bits) of its HMAC-SHA-256.
const HashedKeyLen = 12

// MaxCostUnits is the most units an Offenders ranks costs in, each apart:
// the costs of units past the first MaxCostUnits recorded are not ranked.
const MaxCostUnits = 16

// An OffendersOption configures an Offenders. NewOffenders applies the
// options in order to a copy of the defaults, skipping nil ones, then
// validates the result (the convention of floodgate.ErrInvalidOption).
type OffendersOption func(*offendersOptions)

type offendersOptions struct {
	k      int
	raw    bool
	secret []byte // the HMAC key of hashed addresses
}

// WithCapacity sets the number of subjects tracked, k in [1, 10000]: every
// subject with more than 1/k of the rejections recorded is guaranteed to
// be listed. The default is DefaultOffenders; a repeated call replaces k.
func WithCapacity(k int) OffendersOption { return func(o *offendersOptions) { o.k = k } }

// WithRawKeys sets whether anonymous callers' addresses are kept and shown
// as given. The default, false, keeps only the first HashedKeyLen hex
// digits of each address's HMAC-SHA-256 under a secret (random per
// Offenders unless WithHashSecret), so the summary and its handler never
// reveal an address: a plain hash of an IPv4 address is undone by hashing
// all 2^32 of them, in minutes. Offenders.HashKey hashes an address the
// same way, to look one up. Tenant IDs, names from the operator's config,
// are kept as they are either way. Turn raw keys on only where the debug
// handler is reachable by operators alone; a raw subject that is not valid
// UTF-8 is shown Go-quoted. A repeated call replaces the setting.
func WithRawKeys(on bool) OffendersOption { return func(o *offendersOptions) { o.raw = on } }

// WithHashSecret sets the HMAC key of hashed addresses, at least 16 bytes,
// so that several processes (a fleet's instances, or one across restarts)
// hash a caller alike. Keep it as secret as the addresses it hides. The
// default, nil, is 32 random bytes per Offenders; a repeated call replaces
// the secret.
func WithHashSecret(secret []byte) OffendersOption {
	return func(o *offendersOptions) { o.secret = bytes.Clone(secret) }
}

func (o *offendersOptions) validate() error {
	switch {
	case o.k < 1 || o.k > 10000:
		return invalid("WithCapacity", o.k, "in [1, 10000]")
	case o.secret != nil && len(o.secret) < 16:
		return invalid("WithHashSecret", fmt.Sprintf("%d bytes", len(o.secret)), "at least 16")
	}
	return nil
}

// Offenders is a bounded summary of the callers rejected most often
// (Space-Saving over k subjects): memory stays fixed however many distinct
// callers there are, every caller with more than 1/k of the rejections is
// listed, and each count is an upper bound, off by at most Err. Callers are
// named as the Limiter charges them, by their bucket subject
// (middleware.Decision.Subject): a tenant, or an anonymous caller's
// address prefix, so a caller rotating made-up API keys is one subject,
// its address. Beside it, one summary per unit of metered quotas (tokens,
// bytes) ranks the callers whose calls cost most, by the same algorithm
// over k subjects, weighted by each call's settled cost (RecordCost,
// ObserveCost). The Collector's observer feeds both (WithOffenders). It is
// safe for concurrent use.
type Offenders struct {
	o offendersOptions
	s *topk.Summary
	// costs holds the cost rankings by unit.
	costs labels.Map[string, *topk.Summary]
	// macs holds keyed HMACs for reuse: a new one costs several
	// allocations and a hash of the secret, per rejection.
	macs sync.Pool
}

// An Offender is one entry of the summary.
type Offender struct {
	// Key is the caller's subject, as RecordSubject keeps it:
	// "t:<tenant ID>", or "a:" and the address, hashed unless WithRawKeys.
	Key string `json:"key"`
	// Rejections is an upper bound of the caller's rejections recorded.
	Rejections uint64 `json:"rejections"`
	// Err bounds the overestimate: at least Rejections − Err were recorded.
	Err uint64 `json:"err"`
}

// NewOffenders returns an empty summary, or an error wrapping
// floodgate.ErrInvalidOption that names the option.
func NewOffenders(opts ...OffendersOption) (*Offenders, error) {
	o := offendersOptions{k: DefaultOffenders}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	s, err := topk.New(o.k)
	if err != nil {
		return nil, err
	}
	if o.secret == nil {
		o.secret = make([]byte, 32)
		rand.Read(o.secret) // never fails (crypto/rand)
	}
	f := &Offenders{o: o, s: s}
	f.macs.New = func() any {
		return &mac{h: hmac.New(sha256.New, f.o.secret), in: make([]byte, 0, 64), sum: make([]byte, 0, sha256.Size),
			key: make([]byte, 0, len("a:")+HashedKeyLen)}
	}
	return f, nil
}

// RecordSubject counts one rejection of a bucket subject
// (middleware.Decision.Subject): "t:<tenant ID>", or "a:<address prefix>"
// for an anonymous caller. The Collector's observer calls it for each
// rejection (WithOffenders). Tenant IDs are names from the operator's
// config and are kept as they are; without WithRawKeys an address is
// hashed, as "a:" followed by HashKey of the address. An empty subject is
// ignored. It allocates nothing but a subject's string as it enters the
// summary.
func (f *Offenders) RecordSubject(subject string) {
	if subject != "" {
		f.add(f.s, subject, 1)
	}
}

// add counts n of subject in s, its address hashed unless WithRawKeys.
func (f *Offenders) add(s *topk.Summary, subject string, n uint64) {
	if f.o.raw || strings.HasPrefix(subject, "t:") {
		s.Add(subject, n) // which copies a subject it keeps
		return
	}
	m := f.macs.Get().(*mac)
	m.key = append(m.key[:0], "a:"...)
	m.key = f.hash(m, m.key, strings.TrimPrefix(subject, "a:"))
	s.AddBytes(m.key, n)
	f.macs.Put(m)
}

// Top returns up to n offenders, most rejected first; all of them for n ≤ 0.
func (f *Offenders) Top(n int) []Offender {
	items := f.s.Top(n)
	out := make([]Offender, len(items))
	for i, it := range items {
		out[i] = Offender{Key: shown(it.Key), Rejections: it.Count, Err: it.Err}
	}
	return out
}

// shown returns a key as the summary shows it: Go-quoted unless valid
// UTF-8, since JSON would turn every invalid byte into U+FFFD, and
// distinct keys into one.
func shown(key string) string {
	if !utf8.ValidString(key) {
		return strconv.Quote(key)
	}
	return key
}

// A CostOffender is one entry of a cost ranking.
type CostOffender struct {
	// Key is the subject, as RecordSubject keeps it: "t:<tenant ID>", or
	// "a:" and the address, hashed unless WithRawKeys.
	Key string `json:"key"`
	// Cost is an upper bound of the units the subject's calls cost.
	Cost uint64 `json:"cost"`
	// Err bounds the overestimate: they cost at least Cost − Err.
	Err uint64 `json:"err"`
}

// RecordCost counts cost units of unit (a metered quota's, such as
// "tokens") against subject, in that unit's ranking. Subjects are those
// of RecordSubject, kept alike: "t:<tenant ID>" as it is, "a:<address
// prefix>" hashed unless WithRawKeys. A cost ≤ 0, an empty subject or
// unit, and a unit past the first MaxCostUnits recorded are ignored.
func (f *Offenders) RecordCost(subject, unit string, cost int64) {
	if subject == "" || cost <= 0 {
		return
	}
	if s := f.costSummary(unit); s != nil {
		f.add(s, subject, uint64(cost))
	}
}

// ObserveCost records the cost of each metered call's settle, an Event of
// reason middleware.ReasonSettled, by its tenant ("t:<tenant ID>"), in its
// unit, as RecordCost does, and ignores every other Event. Anonymous
// callers are not ranked. The Collector's observer calls it
// (WithOffenders); it allocates nothing but a subject's string as it
// enters the ranking.
func (f *Offenders) ObserveCost(e middleware.Event) {
	if e.Reason != middleware.ReasonSettled || e.Tenant == "" || e.Settled <= 0 {
		return
	}
	if s := f.costSummary(e.Unit); s != nil {
		s.AddPrefixed("t:", e.Tenant, uint64(e.Settled))
	}
}

// costSummary returns unit's ranking, made on the unit's first cost, or
// nil for an empty unit or one past the first MaxCostUnits.
func (f *Offenders) costSummary(unit string) *topk.Summary {
	if unit == "" {
		return nil
	}
	if s, ok := f.costs.Get(unit); ok {
		return s
	}
	s, _ := f.costs.Add(strings.Clone(unit), MaxCostUnits, func(int) *topk.Summary {
		s, _ := topk.New(f.o.k) // k is validated
		return s
	})
	return s
}

// TopCost returns up to n subjects whose calls cost most in unit, most
// first; all of them for n ≤ 0.
func (f *Offenders) TopCost(unit string, n int) []CostOffender {
	s, ok := f.costs.Get(unit)
	if !ok {
		return []CostOffender{}
	}
	items := s.Top(n)
	out := make([]CostOffender, len(items))
	for i, it := range items {
		out[i] = CostOffender{Key: shown(it.Key), Cost: it.Count, Err: it.Err}
	}
	return out
}

// CostTotal returns the units of unit recorded.
func (f *Offenders) CostTotal(unit string) uint64 {
	if s, ok := f.costs.Get(unit); ok {
		return s.Total()
	}
	return 0
}

// CostUnits returns the units costs were recorded in, sorted.
func (f *Offenders) CostUnits() []string {
	units := slices.Collect(maps.Keys(f.costs.Load()))
	slices.Sort(units)
	return units
}

// Total returns the rejections recorded.
func (f *Offenders) Total() uint64 { return f.s.Total() }

// HashKey returns the form an anonymous caller's address takes in f
// without WithRawKeys, after "a:": the first HashedKeyLen hex digits of
// its HMAC-SHA-256 under f's secret.
func (f *Offenders) HashKey(key string) string {
	m := f.macs.Get().(*mac)
	m.key = f.hash(m, m.key[:0], key)
	out := string(m.key)
	f.macs.Put(m)
	return out
}

// hash appends HashKey(key) to dst, with m's buffers.
func (f *Offenders) hash(m *mac, dst []byte, key string) []byte {
	m.h.Reset()
	m.in = append(m.in[:0], key...)
	m.h.Write(m.in)
	m.sum = m.h.Sum(m.sum[:0])
	if cap(m.in) > 1024 {
		m.in = make([]byte, 0, 64) // keep no long key, nor its bytes
	} else {
		clear(m.in)
	}
	return hex.AppendEncode(dst, m.sum[:HashedKeyLen/2])
}

// mac is a keyed HMAC with buffers for its input and sum, which the hash's
// interface methods would otherwise make escape, once per key, and for a
// hashed subject.
type mac struct {
	h            hash.Hash
	in, sum, key []byte
}

// Handler returns an http.Handler serving the summary as JSON, and the
// cost rankings, by unit, once a cost is recorded:
//
//	{"total": 1234, "capacity": 64, "hashed": true,
//	 "offenders": [{"key": "a:3f2a…", "rejections": 1000, "err": 0}, …],
//	 "costs": {"tokens": {"total": 5000000,
//	   "offenders": [{"key": "t:acme", "cost": 3200000, "err": 0}, …]}}}
//
// The query parameter n limits each list. Serve it on an operators' port
// only.
func (f *Offenders) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		n := 0
		if s := r.URL.Query().Get("n"); s != "" {
			var err error
			if n, err = strconv.Atoi(s); err != nil || n < 0 {
				http.Error(w, "n must be a non-negative integer", http.StatusBadRequest)
				return
			}
		}
		type ranking struct {
			Total     uint64         `json:"total"`
			Offenders []CostOffender `json:"offenders"`
		}
		var costs map[string]ranking
		for _, unit := range f.CostUnits() {
			if costs == nil {
				costs = make(map[string]ranking)
			}
			costs[unit] = ranking{f.CostTotal(unit), f.TopCost(unit, n)}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(struct {
			Total     uint64             `json:"total"`
			Capacity  int                `json:"capacity"`
			Hashed    bool               `json:"hashed"`
			Offenders []Offender         `json:"offenders"`
			Costs     map[string]ranking `json:"costs,omitempty"`
		}{f.Total(), f.s.Cap(), !f.o.raw, f.Top(n), costs})
	})
}
