package rls

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/floodgate-go/floodgate"
)

// parser reads one file of envoyproxy/ratelimit's format into a domain,
// keeping every problem with its line.
type parser struct {
	file  string
	cfg   *Config
	dom   *domain
	merge bool // add to a domain an earlier file named (WithMergeDomains)
	probs []Problem
}

func (p *parser) add(n *yaml.Node, msg string) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.probs = append(p.probs, Problem{File: p.file, Line: line, Msg: msg})
}

// parseFile compiles one file: envoyproxy/ratelimit's format, or a tenant
// config. It returns nil and the problems when the file is rejected.
func parseFile(name string, data []byte, cfg *Config, merge bool) (*domain, []Problem) {
	if len(data) > MaxConfigSize {
		return nil, []Problem{{File: name, Msg: "file is larger than " + strconv.Itoa(MaxConfigSize) + " bytes"}}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, []Problem{yamlProblem(name, data, err)}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, []Problem{{File: name, Msg: "config is empty"}}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, []Problem{{File: name, Line: root.Line, Msg: "config must be a mapping with domain and descriptors"}}
	}
	if isTenantConfig(root) {
		return tenantDomain(name, data, cfg)
	}
	p := &parser{file: name, cfg: cfg, dom: &domain{file: name}, merge: merge}
	p.root(root)
	if len(p.probs) > 0 {
		return nil, p.probs
	}
	return p.dom, nil
}

// yamlProblem turns a YAML syntax error into a problem at its line: the
// decoder's, or for bytes it cannot read (which it reports without one)
// the line of the first such byte. Only errors that concern the document
// as a whole (excessive aliasing, say) are left without a line.
func yamlProblem(name string, data []byte, err error) Problem {
	msg := err.Error()
	line := 0
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// "yaml: line 3: mapping values are not allowed in this context"
		if rest, ok := strings.CutPrefix(msg, "yaml: line "); ok {
			if i := strings.IndexByte(rest, ':'); i > 0 {
				if n, err := strconv.Atoi(rest[:i]); err == nil {
					line = n
					msg = "invalid YAML:" + rest[i+1:]
				}
			}
		}
	}
	if line == 0 && readerError(msg) {
		// The decoder's reader refuses bytes (not UTF-8, or a control
		// character) without saying where: find the first such byte's line.
		line = unreadableLine(data)
		msg = "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")
	}
	return Problem{File: name, Line: line, Msg: msg}
}

// readerError reports whether a decoder's error is its reader's: bytes it
// could not read as characters.
func readerError(msg string) bool {
	for _, s := range []string{"UTF-8", "UTF-16", "surrogate", "control characters"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// unreadableLine returns the 1-based line of data's first character that
// YAML cannot read (invalid UTF-8 or UTF-16, or a character outside YAML's
// printable set), or 0 when there is none. Like the decoder, it reads
// UTF-16 after its byte order mark, and UTF-8 otherwise.
func unreadableLine(data []byte) int {
	var next func([]byte) (rune, int) = utf8.DecodeRune
	var order binary.ByteOrder
	if len(data) >= 2 && data[0] == 0xFF && data[1] == 0xFE {
		order = binary.LittleEndian
	} else if len(data) >= 2 && data[0] == 0xFE && data[1] == 0xFF {
		order = binary.BigEndian
	}
	if order != nil {
		data = data[2:]
		next = func(b []byte) (rune, int) {
			if len(b) < 2 {
				return utf8.RuneError, 1
			}
			r1 := rune(order.Uint16(b))
			if !utf16.IsSurrogate(r1) {
				return r1, 2
			}
			if len(b) < 4 {
				return utf8.RuneError, 1
			}
			r := utf16.DecodeRune(r1, rune(order.Uint16(b[2:])))
			if r == utf8.RuneError {
				return r, 1
			}
			return r, 4
		}
	}
	line := 1
	for i := 0; i < len(data); {
		r, n := next(data[i:])
		printable := r == '\t' || r == '\n' || r == '\r' || (r >= 0x20 && r <= 0x7E) || r == 0x85 ||
			(r >= 0xA0 && r <= 0xD7FF) || (r >= 0xE000 && r <= 0xFFFD) || (r >= 0x10000 && r <= 0x10FFFF)
		if r == utf8.RuneError && n <= 1 || !printable {
			return line
		}
		if r == '\n' {
			line++
		}
		i += n
	}
	return 0
}

// isTenantConfig reports whether a top-level mapping is a floodgate tenant
// config: no domain, and one of its own keys.
func isTenantConfig(root *yaml.Node) bool {
	tenantKeys := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch root.Content[i].Value {
		case "domain", "descriptors":
			return false
		case "tiers", "tenants", "anonymous":
			tenantKeys = true
		}
	}
	return tenantKeys
}

// fields walks a mapping, reporting duplicate and unknown keys; fn gets
// each known key and its value.
func (p *parser) fields(n *yaml.Node, where string, known []string, fn func(k string, key, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.add(n, where+" must be a mapping")
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.add(k, where+": a key is not a string")
			continue
		}
		if seen[k.Value] {
			p.add(k, where+": duplicate key "+strconv.Quote(k.Value))
			continue
		}
		seen[k.Value] = true
		ok := false
		for _, kk := range known {
			if kk == k.Value {
				ok = true
				break
			}
		}
		if !ok {
			p.add(k, where+": unknown key "+strconv.Quote(k.Value)+" (known: "+strings.Join(known, ", ")+")")
			continue
		}
		fn(k.Value, k, v)
	}
}

func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(n, what+" must be a string")
		return "", false
	}
	return n.Value, true
}

func (p *parser) boolean(n *yaml.Node, what string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.add(n, what+" must be true or false")
		return false
	}
	return b
}

func (p *parser) uint(n *yaml.Node, what string, maxv uint64) (uint64, bool) {
	if n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "") {
		if v, err := strconv.ParseUint(n.Value, 10, 64); err == nil && v <= maxv {
			return v, true
		}
	}
	p.add(n, what+" must be a whole number from 0 to "+strconv.FormatUint(maxv, 10))
	return 0, false
}

var rootKeys = []string{"domain", "descriptors", "failure_policy"}

func (p *parser) root(n *yaml.Node) {
	var descs, policyNode *yaml.Node
	sawDomain := false
	policy := FailureLocal
	p.fields(n, "config", rootKeys, func(k string, key, v *yaml.Node) {
		switch k {
		case "domain":
			sawDomain = true
			if s, ok := p.str(v, "domain"); ok {
				if s == "" {
					p.add(v, "domain must not be empty")
				}
				p.dom.name = s
			}
		case "descriptors":
			descs = v
		case "failure_policy":
			policyNode = v
			s, _ := p.str(v, "failure_policy")
			switch s {
			case "local":
				policy = FailureLocal
			case "open":
				policy = FailureOpen
			case "closed":
				policy = FailureClosed
			default:
				p.add(v, "failure_policy must be local, open or closed")
			}
		}
	})
	if !sawDomain {
		p.add(n, "config has no domain")
	}
	// Merging follows envoyproxy/ratelimit (src/config/config_impl.go,
	// rateLimitConfigImpl.loadConfig): with mergeDomainConfigs, a file
	// whose domain is already loaded has its descriptors loaded into that
	// domain's top level (loadDescriptors on the existing domain), where a
	// key_value already present panics "duplicate descriptor composite
	// key"; without it, "duplicate domain '%s' in config file". So only the
	// top level merges: a descriptor in two files is a duplicate even when
	// their children differ. A tenant domain has no descriptors to merge
	// into; compileSources refuses it as a duplicate.
	if prev := p.cfg.domains[p.dom.name]; p.merge && prev != nil && prev.tenants == nil && p.dom.name != "" {
		if policyNode != nil {
			if prev.policyAt != "" && prev.policy != policy {
				p.add(policyNode, "failure_policy "+policy.String()+" differs from "+prev.policy.String()+
					" set for domain "+strconv.Quote(prev.name)+" at "+prev.policyAt)
			}
			prev.policy, prev.policyAt = policy, p.file+":"+strconv.Itoa(policyNode.Line)
		}
		p.dom = prev
	} else if policyNode != nil {
		p.dom.policy, p.dom.policyAt = policy, p.file+":"+strconv.Itoa(policyNode.Line)
	}
	if descs != nil {
		p.descriptors(descs, &p.dom.root, "")
	}
}

var descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric",
	"value_to_metric", "share_threshold", "metadata", "quota_mode"}

var rateLimitKeys = []string{"requests_per_unit", "unit", "unlimited", "name", "replaces", "burst"}

// descriptors reads a list of descriptors into level; parent is the
// configured path above them ("" at the top).
func (p *parser) descriptors(n *yaml.Node, level *node, parent string) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.add(n, "descriptors must be a list")
		return
	}
	for _, item := range n.Content {
		p.descriptor(item, level, parent)
	}
}

func (p *parser) descriptor(n *yaml.Node, level *node, parent string) {
	var (
		key, value            string
		haveKey               bool
		rl, rlKey, children   *yaml.Node
		shadow, detailed, shr bool
		keyYAML               *yaml.Node
	)
	if n.Kind != yaml.MappingNode {
		p.add(n, "a descriptor must be a mapping with key, value, rate_limit and descriptors")
		return
	}
	p.fields(n, "descriptor", descriptorKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "key":
			keyYAML = v
			key, haveKey = p.str(v, "key")
		case "value":
			value, _ = p.str(v, "value")
		case "rate_limit":
			rl, rlKey = v, kn
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow = p.boolean(v, "shadow_mode")
		case "detailed_metric":
			detailed = p.boolean(v, "detailed_metric")
		case "value_to_metric":
			p.boolean(v, "value_to_metric") // metrics never carry values: accepted, no effect
		case "share_threshold":
			shr = p.boolean(v, "share_threshold")
		case "metadata":
			// Response metadata is not sent: accepted, no effect.
		case "quota_mode":
			if p.boolean(v, "quota_mode") {
				p.add(kn, "quota_mode is not supported")
			}
		}
	})
	if !haveKey || key == "" {
		if keyYAML == nil || haveKey {
			p.add(n, "descriptor has no key, or an empty one")
		}
		return
	}
	path := key
	if value != "" {
		path += "_" + value
	}
	if parent != "" {
		path = parent + "." + path
	}
	if level.keys == nil {
		level.keys = map[string]*keyNode{}
	}
	kn := level.keys[key]
	if kn == nil {
		kn = &keyNode{}
		level.keys[key] = kn
		level.order = append(level.order, key)
	}
	child := &node{file: p.file, line: n.Line}
	wild := strings.Contains(value, "*")
	switch {
	case shr && !wild:
		p.add(n, "descriptor "+path+": share_threshold needs a wildcard value (containing '*')")
	case value == "":
		if kn.any != nil {
			p.duplicate(n, path, kn.any)
			return
		}
		kn.any = child
	case wild:
		for _, w := range kn.wild {
			if w.pattern == value {
				p.duplicate(n, path, w.node)
				return
			}
		}
		kn.wild = append(kn.wild, wildNode{pattern: value, parts: strings.Split(value, "*"), share: shr, node: child})
	default:
		if kn.values == nil {
			kn.values = map[string]*node{}
		}
		if prev, dup := kn.values[value]; dup {
			p.duplicate(n, path, prev)
			return
		}
		kn.values[value] = child
	}
	if rl != nil {
		child.rule = p.rateLimit(rlKey, rl, path, shadow, detailed)
	}
	if children != nil {
		p.descriptors(children, child, path)
	}
}

// duplicate reports the descriptor at n, whose path prev already holds,
// naming where prev was configured: its line, and its file when another
// file of a merged domain holds it.
func (p *parser) duplicate(n *yaml.Node, path string, prev *node) {
	at := "line " + strconv.Itoa(prev.line)
	if prev.file != p.file {
		at = prev.file + ":" + strconv.Itoa(prev.line)
	}
	p.add(n, "duplicate descriptor "+path+", also at "+at)
}

// rateLimit reads a rate_limit mapping n, whose key is at; problems of the
// mapping as a whole are reported at its key's line.
func (p *parser) rateLimit(at, n *yaml.Node, path string, shadow, detailed bool) *rule {
	r := rule{domain: p.dom.name, path: path, shadow: shadow, detailed: detailed}
	var (
		unitNode, rpuNode, burstNode *yaml.Node
		burst                        uint64
		ok                           = true
	)
	p.fields(n, "descriptor "+path+": rate_limit", rateLimitKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "requests_per_unit":
			rpuNode = v
			x, good := p.uint(v, "requests_per_unit", math.MaxUint32)
			r.rpu, ok = uint32(x), ok && good
		case "unit":
			unitNode = v
			s, _ := p.str(v, "unit")
			u, found := pb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(s)]
			if !found || u == int32(pb.RateLimitResponse_RateLimit_UNKNOWN) {
				p.add(v, "descriptor "+path+": invalid rate limit unit "+strconv.Quote(s)+
					" (second, minute, hour, day, week, month or year)")
				ok = false
			}
			r.unit = pb.RateLimitResponse_RateLimit_Unit(u)
		case "unlimited":
			r.unlimited = p.boolean(v, "unlimited")
		case "name":
			r.name, _ = p.str(v, "name")
		case "replaces":
			if v.Kind != yaml.SequenceNode {
				p.add(v, "descriptor "+path+": replaces must be a list of {name: …}")
				return
			}
			for _, it := range v.Content {
				var name string
				p.fields(it, "descriptor "+path+": replaces", []string{"name"}, func(_ string, _, nv *yaml.Node) {
					name, _ = p.str(nv, "name")
				})
				if name == "" {
					p.add(it, "descriptor "+path+": should not have an empty replaces entry")
					continue
				}
				r.replaces = append(r.replaces, name)
			}
		case "burst":
			burstNode = v
			var good bool
			burst, good = p.uint(v, "burst", floodgate.MaxBurst)
			if good && burst == 0 {
				p.add(v, "descriptor "+path+": burst must be at least 1")
			}
		}
	})
	for _, rep := range r.replaces {
		if rep == r.name && r.name != "" {
			p.add(at, "descriptor "+path+": replaces should not contain name of same descriptor")
		}
	}
	switch {
	case r.unlimited && unitNode != nil:
		p.add(unitNode, "descriptor "+path+": should not specify rate limit unit when unlimited")
	case r.unlimited && burstNode != nil:
		p.add(burstNode, "descriptor "+path+": should not specify burst when unlimited")
	case !r.unlimited && unitNode == nil:
		p.add(at, "descriptor "+path+": rate_limit has no unit")
	case !r.unlimited && rpuNode == nil && ok:
		p.add(at, "descriptor "+path+": rate_limit has no requests_per_unit")
	case ok && !r.unlimited:
		r.limit = bucketLimit(r.rpu, r.unit, int(burst))
		if r.rpu == 0 && burstNode != nil {
			p.add(burstNode, "descriptor "+path+": burst with requests_per_unit 0")
		}
	}
	if r.unlimited {
		r.limit = floodgate.Inf
	}
	return p.cfg.newRule(r)
}
