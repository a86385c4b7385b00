package rls

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

// ErrInvalidConfig is matched (with errors.Is) by every error that
// [LoadConfig] and [ParseConfig] return for a config they reject.
var ErrInvalidConfig = errors.New("rls: invalid config")

// MaxConfigSize is the largest config file read, 4 MiB.
const MaxConfigSize = 4 << 20

// A Problem is one thing wrong in a config file: where it is and what.
type Problem struct {
	// File is the file's path, as given or found in the directory.
	File string
	// Line is the 1-based line of the offending key or item; 0 when the
	// problem is the file as a whole.
	Line int
	// Msg says what is wrong.
	Msg string
}

// Error formats p as "file:line: msg".
func (p Problem) Error() string {
	s := p.File
	if p.Line > 0 {
		s += ":" + strconv.Itoa(p.Line)
	}
	return s + ": " + p.Msg
}

// A ConfigError lists every problem found in a config, so that one run
// reports all of them. It matches [ErrInvalidConfig].
type ConfigError struct {
	// Problems, in file and line order; never empty.
	Problems []Problem
}

func (e *ConfigError) Error() string {
	if len(e.Problems) == 1 {
		return "rls: invalid config: " + e.Problems[0].Error()
	}
	var b strings.Builder
	b.WriteString("rls: invalid config: ")
	b.WriteString(strconv.Itoa(len(e.Problems)))
	b.WriteString(" problems:")
	for _, p := range e.Problems {
		b.WriteString("\n")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Is reports whether target is [ErrInvalidConfig].
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// FailurePolicy says what a domain's decisions are when the store cannot
// decide them itself: Redis down, slow, or the breaker open.
type FailurePolicy uint8

const (
	// FailureLocal (the default) keeps the store's own decision: for a
	// redisstore.Store under its Local policy, a local bucket at the
	// limit divided among the replicas.
	FailureLocal FailurePolicy = iota
	// FailureOpen admits every descriptor the store could not decide.
	FailureOpen
	// FailureClosed refuses every descriptor the store could not decide.
	FailureClosed
)

var policyNames = [...]string{"local", "open", "closed"}

// String returns "local", "open" or "closed".
func (p FailurePolicy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return "unknown"
}

// A Config is a compiled set of domains, immutable and safe for concurrent
// use: what [LoadConfig] and [ParseConfig] return and a [Service] serves.
// The zero Config has no domain: every descriptor is unlimited.
type Config struct {
	domains map[string]*domain
	rules   []*rule // every rule of every domain, by rule.id
	files   []string
}

// Domains returns the names of the config's domains, sorted.
func (c *Config) Domains() []string {
	names := make([]string, 0, len(c.domains))
	for n := range c.domains {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// FailurePolicy returns domain's failure_policy, and false when the config
// has no such domain.
func (c *Config) FailurePolicy(domain string) (FailurePolicy, bool) {
	d, ok := c.domains[domain]
	if !ok {
		return FailureLocal, false
	}
	return d.policy, true
}

// Files returns the files the config was read from, sorted.
func (c *Config) Files() []string { return slices.Clone(c.files) }

// domain is one domain's compiled descriptors, or its tenant table.
type domain struct {
	name   string
	file   string // the first file that names it
	policy FailurePolicy
	// policyAt is where failure_policy was set ("file:line"), empty when
	// no file sets it: merged files must not set it differently.
	policyAt string
	root     node
	tenants  *tenant.Table // non-nil for a domain read from a tenant config
	// tenantRules caches, by the tenant table's rule identity, the rule
	// each tenant rule is served under (metrics and responses).
	tenantRule *rule
}

// node is one level of nested descriptors: the entries matched by key,
// then by value.
type node struct {
	keys map[string]*keyNode
	// order is keys' names in config order, for RLQS, whose BucketIds
	// have no order of their own (quotamatch.go).
	order []string
	rule  *rule
	// file and line say where the descriptor was configured, so that a
	// duplicate names both places, across the files of a merged domain.
	file string
	line int
}

// keyNode holds the descriptors of one key at one level: by exact value,
// by wildcard pattern (in config order, first match wins), and the one
// without a value, which matches any value.
type keyNode struct {
	values map[string]*node
	wild   []wildNode
	any    *node
}

type wildNode struct {
	pattern string   // the configured value, with its '*'
	parts   []string // pattern split on '*'
	share   bool     // share_threshold: every matching value shares one bucket
	node    *node
}

// rule is a configured rate_limit, or unlimited.
type rule struct {
	id        int
	domain    string
	path      string // the configured descriptor path, "key_value.key", a bounded label
	limit     floodgate.Limit
	rpu       uint32
	unit      pb.RateLimitResponse_RateLimit_Unit
	name      string
	unlimited bool
	shadow    bool
	detailed  bool
	replaces  []string
}

// unitSeconds is the length of each unit envoyproxy/ratelimit accepts, as
// it counts them (a month is 30 days, a year 365).
var unitSeconds = map[pb.RateLimitResponse_RateLimit_Unit]float64{
	pb.RateLimitResponse_RateLimit_SECOND: 1,
	pb.RateLimitResponse_RateLimit_MINUTE: 60,
	pb.RateLimitResponse_RateLimit_HOUR:   3600,
	pb.RateLimitResponse_RateLimit_DAY:    86400,
	pb.RateLimitResponse_RateLimit_WEEK:   7 * 86400,
	pb.RateLimitResponse_RateLimit_MONTH:  30 * 86400,
	pb.RateLimitResponse_RateLimit_YEAR:   365 * 86400,
}

// bucketLimit is the token bucket of requests_per_unit per unit: the rate
// spread evenly over the unit, and a burst of one unit's worth unless the
// config sets one.
func bucketLimit(rpu uint32, unit pb.RateLimitResponse_RateLimit_Unit, burst int) floodgate.Limit {
	if rpu == 0 {
		return floodgate.Limit{}
	}
	if burst == 0 {
		burst = int(rpu)
	}
	return floodgate.Limit{Rate: float64(rpu) / unitSeconds[unit], Burst: min(burst, floodgate.MaxBurst)}
}

// LoadConfig reads the config at path: one file, or a directory whose
// *.yaml, *.yml and *.json files (not those whose names start with '.')
// are each one domain. A file in envoyproxy/ratelimit's format names its
// domain; a floodgate tenant config (top-level tiers, tenants or
// anonymous, no domain) serves the domain named by its file's base name
// without extension. Every problem is reported at once, each with its file
// and line, in a [*ConfigError].
//
// Two files that name one domain are refused, unless [WithMergeDomains]
// is among opts. LoadConfig reads only that option, and ignores the others
// (they configure a [Service]); an invalid one is an error that wraps
// floodgate.ErrInvalidOption.
func LoadConfig(path string, opts ...Option) (*Config, error) {
	o := defaults()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	return loadConfig(path, o.merge)
}

func loadConfig(path string, merge bool) (*Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, &ConfigError{Problems: []Problem{{File: path, Msg: err.Error()}}}
	}
	var files []string
	if fi.IsDir() {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, &ConfigError{Problems: []Problem{{File: path, Msg: err.Error()}}}
		}
		for _, e := range ents {
			n := e.Name()
			ext := strings.ToLower(filepath.Ext(n))
			if e.IsDir() || strings.HasPrefix(n, ".") || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
				continue
			}
			files = append(files, filepath.Join(path, n))
		}
		if len(files) == 0 {
			return nil, &ConfigError{Problems: []Problem{{File: path, Msg: "directory holds no .yaml, .yml or .json file"}}}
		}
	} else {
		files = []string{path}
	}
	srcs := make([]source, 0, len(files))
	var probs []Problem
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			probs = append(probs, Problem{File: f, Msg: err.Error()})
			continue
		}
		srcs = append(srcs, source{name: f, data: data})
	}
	cfg, err := compileSources(srcs, merge)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			probs = append(probs, ce.Problems...)
		}
	}
	if len(probs) > 0 {
		sortProblems(probs)
		return nil, &ConfigError{Problems: probs}
	}
	return cfg, nil
}

func readFile(name string) ([]byte, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	if fi.Size() > MaxConfigSize {
		return nil, errors.New("file is larger than " + strconv.Itoa(MaxConfigSize) + " bytes")
	}
	return os.ReadFile(name)
}

// ParseConfig compiles one config file's contents; name is the file's
// name, for errors, for the domain of a tenant config, and to read a
// ".json" tenant config as JSON.
func ParseConfig(name string, data []byte) (*Config, error) {
	return compileSources([]source{{name: name, data: data}}, false)
}

type source struct {
	name string
	data []byte
}

// compileSources compiles the files in order. With merge, a file whose
// domain an earlier file named adds its descriptors to that domain
// (parser.root); else it is refused.
func compileSources(srcs []source, merge bool) (*Config, error) {
	cfg := &Config{domains: map[string]*domain{}}
	var probs []Problem
	for _, s := range srcs {
		d, ps := parseFile(s.name, s.data, cfg, merge)
		probs = append(probs, ps...)
		if d == nil {
			continue
		}
		if prev, ok := cfg.domains[d.name]; ok {
			if prev == d { // merged into
				cfg.files = append(cfg.files, s.name)
				continue
			}
			msg := "duplicate domain " + strconv.Quote(d.name) + ", also in " + prev.file
			switch {
			case !merge:
				msg += " (merging is off: rls.WithMergeDomains, floodgate-rls -merge-domains)"
			case d.tenants != nil || prev.tenants != nil:
				msg += " (a tenant config's domain is not merged)"
			}
			probs = append(probs, Problem{File: s.name, Msg: msg})
			continue
		}
		cfg.domains[d.name] = d
		cfg.files = append(cfg.files, s.name)
	}
	if len(probs) > 0 {
		sortProblems(probs)
		return nil, &ConfigError{Problems: probs}
	}
	slices.Sort(cfg.files)
	return cfg, nil
}

func sortProblems(ps []Problem) {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
}

// newRule registers a rule in cfg and returns it.
func (c *Config) newRule(r rule) *rule {
	r.id = len(c.rules)
	p := &r
	c.rules = append(c.rules, p)
	return p
}

// tenantDomain compiles a tenant config file into a domain named after the
// file.
func tenantDomain(name string, data []byte, cfg *Config) (*domain, []Problem) {
	t, err := tenant.Parse(name, data)
	if err != nil {
		var ce *tenant.ConfigError
		if errors.As(err, &ce) {
			ps := make([]Problem, 0, len(ce.Errors))
			for _, fe := range ce.Errors {
				msg := fe.Msg
				if fe.Field != "" {
					msg = fe.Field + ": " + msg
				}
				ps = append(ps, Problem{File: name, Line: fe.Line, Msg: msg})
			}
			return nil, ps
		}
		return nil, []Problem{{File: name, Msg: err.Error()}}
	}
	base := filepath.Base(name)
	dn := strings.TrimSuffix(base, filepath.Ext(base))
	d := &domain{name: dn, file: name, tenants: t}
	d.tenantRule = cfg.newRule(rule{domain: dn, path: "tenant"})
	return d, nil
}

// responseLimit expresses a bucket's rate as requests per unit, in the
// largest unit up to a day that keeps it whole, for responses and headers
// of tenant rules (whose limits are per second).
func responseLimit(lim floodgate.Limit) (uint32, pb.RateLimitResponse_RateLimit_Unit) {
	if lim.IsInf() {
		return math.MaxUint32, pb.RateLimitResponse_RateLimit_SECOND
	}
	for _, u := range []pb.RateLimitResponse_RateLimit_Unit{pb.RateLimitResponse_RateLimit_SECOND,
		pb.RateLimitResponse_RateLimit_MINUTE, pb.RateLimitResponse_RateLimit_HOUR} {
		v := lim.Rate * unitSeconds[u]
		if v == math.Trunc(v) && v >= 1 {
			return clampU32(v), u
		}
	}
	return clampU32(math.Round(lim.Rate * 86400)), pb.RateLimitResponse_RateLimit_DAY
}

func clampU32(v float64) uint32 {
	if v >= math.MaxUint32 {
		return math.MaxUint32
	}
	if v < 0 {
		return 0
	}
	return uint32(v)
}

// unitDuration returns the length of unit, times a multiplier ≥ 1.
func unitDuration(unit pb.RateLimitResponse_RateLimit_Unit, mult uint32) time.Duration {
	return time.Duration(unitSeconds[unit]*float64(max(mult, 1))) * time.Second
}
