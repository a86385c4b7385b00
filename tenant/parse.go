package tenant

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/floodgate-go/floodgate"
)

// MaxConfigSize is the largest config Parse accepts, in bytes. Real configs
// are kilobytes; the bound keeps a runaway file from costing a reload its
// memory.
const MaxConfigSize = 4 << 20

// Parse decodes, validates and compiles one config. name is used in error
// messages (give the file name) and picks the format: a name ending in
// ".json" is strict JSON, anything else YAML.
//
// Decoding is strict: an unknown field, a duplicate key, a value of the
// wrong type, a YAML alias, a second document or an empty file is an error.
// Every problem is reported at once in a [*ConfigError] whose entries name
// the file, line and field.
func Parse(name string, data []byte) (*Table, error) {
	cfg, p := decode(name, data)
	// Validation runs even when decoding found problems, so that one run
	// reports everything; decoding left neutral values behind and marked
	// broken fields, so nothing is reported twice.
	return compile(cfg, p)
}

// decode turns data into a Config, recording where each field sits and
// every problem that decoding alone can see. The returned Config is always
// usable for validation: a field with a problem holds a neutral value so
// that one mistake yields one message.
func decode(name string, data []byte) (*Config, *problems) {
	p := &problems{file: name, lines: map[string]int{}, broken: map[string]bool{}}
	cfg := &Config{}
	if len(data) > MaxConfigSize {
		p.addAt(0, "", "config is larger than "+strconv.Itoa(MaxConfigSize)+" bytes")
		return cfg, p
	}
	if strings.EqualFold(filepath.Ext(name), ".json") {
		if line, msg, ok := checkJSON(data); !ok {
			p.addAt(line, "", msg)
			return cfg, p
		}
		// Valid JSON is valid YAML, once yamlSafe has rewritten the few
		// forms YAML reads otherwise: from here on one decoder serves both
		// formats and gives both their line numbers.
		data = yamlSafe(data)
	}
	if !utf8.Valid(data) {
		off := 0
		for off < len(data) {
			r, n := utf8.DecodeRune(data[off:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			off += n
		}
		p.addAt(lineAt(data, off), "", "config is not valid UTF-8")
		return cfg, p
	}
	root, line, err := parseYAML(data)
	if err != nil {
		p.addAt(line, "", err.Error())
		return cfg, p
	}
	if root == nil {
		p.addAt(0, "", "config is empty")
		return cfg, p
	}
	d := &decoder{p: p}
	d.config(root, cfg)
	return cfg, p
}

// checkJSON reports whether data is one well-formed JSON value, or where
// and why not. YAML accepts more than JSON; a .json file should not.
func checkJSON(data []byte) (line int, msg string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	err := dec.Decode(&v)
	if err == nil {
		if _, err2 := dec.Token(); err2 != io.EOF {
			return lineAt(data, int(dec.InputOffset())), "data after the JSON value", false
		}
		return 0, "", true
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return lineAt(data, int(se.Offset)), "invalid JSON: " + se.Error(), false
	}
	if err == io.EOF {
		return 0, "config is empty", false
	}
	return lineAt(data, len(data)), "invalid JSON: " + err.Error(), false
}

// yamlSafe rewrites valid JSON that YAML would refuse, keeping every
// newline where it was so that line numbers stay true: the escape "\/"
// becomes "/", a surrogate pair (or a lone surrogate, as U+FFFD) becomes
// the character itself, characters YAML reads as line breaks or refuses
// are escaped, and a colon on a later line than its key moves up to the
// key's (YAML keeps an implicit key on one line).
func yamlSafe(data []byte) []byte {
	out := make([]byte, 0, len(data))
	inString := false
	ws := -1 // where a run of whitespace outside strings starts in out
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			switch c {
			case ' ', '\t', '\r', '\n':
				if ws < 0 {
					ws = len(out)
				}
				out = append(out, c)
				continue
			case ':':
				if ws >= 0 && bytes.IndexAny(out[ws:], "\r\n") >= 0 {
					out = slices.Insert(out, ws, ':')
					ws = -1
					continue
				}
			case '"':
				inString = true
			}
			ws = -1
			out = append(out, c)
			continue
		}
		switch {
		case c == '"':
			inString = false
			out = append(out, c)
		case c >= utf8.RuneSelf:
			// A character YAML reads as a line break (NEL, LS, PS) or
			// refuses (C1 controls, U+FFFE, U+FFFF) is written escaped.
			r, n := utf8.DecodeRune(data[i:])
			if r == 0x85 || r == 0x2028 || r == 0x2029 || r >= 0x80 && r <= 0x9f || r == 0xfffe || r == 0xffff {
				out = fmt.Appendf(out, `\u%04x`, r)
			} else {
				out = append(out, data[i:i+n]...)
			}
			i += n - 1
		case c == 0x7f:
			out = append(out, `\u007f`...)
		case c != '\\':
			out = append(out, c)
		case data[i+1] == '/':
			out = append(out, '/')
			i++
		case data[i+1] == 'u':
			r := hex4(data[i+2 : i+6])
			n := 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+12 <= len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
					r2 = hex4(data[i+8 : i+12])
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					r, n = d, 12
				} else {
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
			} else {
				out = append(out, data[i:i+6]...)
			}
			i += n - 1
		default:
			out = append(out, c, data[i+1])
			i++
		}
	}
	return out
}

// hex4 decodes four hex digits, known valid.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// lineAt returns the line of data[off], counting line breaks as YAML does:
// LF, CR, or CR LF as one.
func lineAt(data []byte, off int) int {
	if off > len(data) {
		off = len(data)
	}
	line := 1
	for i := 0; i < off; i++ {
		switch data[i] {
		case '\n':
			line++
		case '\r':
			if i+1 >= len(data) || data[i+1] != '\n' {
				line++
			}
		}
	}
	return line
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// parseYAML parses data into a node tree and returns its root content
// node, or nil for an empty document. The YAML library has panicked on
// some malformed inputs in the past; a config parser fed by a watched file
// must not take the server down with it, so a panic becomes an error.
func parseYAML(data []byte) (root *yaml.Node, line int, err error) {
	defer func() {
		if r := recover(); r != nil {
			root, line, err = nil, 0, fmt.Errorf("malformed YAML (parser failure: %v)", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, 0, nil
		}
		line, err := yamlError(err)
		return nil, line, err
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		return nil, extra.Line, errors.New("more than one YAML document")
	case err != io.EOF:
		line, err := yamlError(err)
		return nil, line, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, 0, nil
	}
	n := doc.Content[0]
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil, 0, nil
	}
	return n, 0, nil
}

// parserProblems are the syntax errors the YAML library's parser reports,
// as opposed to its scanner. It counts their lines from 0, and the
// scanner's from 1, and reports no line for a problem on the first.
var parserProblems = []string{
	"did not find expected <stream-start>", "did not find expected <document start>",
	"found undefined tag handle", "did not find expected node content",
	"did not find expected '-' indicator", "did not find expected key",
	"did not find expected ',' or ']'", "did not find expected ',' or '}'",
	"found duplicate %YAML directive", "found incompatible YAML document", "found duplicate %TAG directive",
}

// yamlError moves the library's "yaml: line N: " prefix into a line number,
// correcting the library's count (see parserProblems).
func yamlError(err error) (int, error) {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
		if slices.Contains(parserProblems, msg) {
			line++
		}
		return line, errors.New(msg)
	}
	// Without a line, a syntax error is on the first; a problem reading
	// the bytes (as UTF-8) has no line to tell.
	msg = strings.TrimPrefix(msg, "yaml: ")
	for _, p := range readerProblems {
		if strings.HasPrefix(msg, p) {
			return 0, errors.New(msg)
		}
	}
	return 1, errors.New(msg)
}

// readerProblems start the YAML library's errors about the bytes rather
// than the syntax.
var readerProblems = []string{
	"control characters are not allowed", "expected low surrogate area", "incomplete UTF-",
	"input error", "invalid Unicode character", "invalid leading UTF-8 octet",
	"invalid length of a UTF-8 sequence", "invalid trailing UTF-8 octet", "unexpected low surrogate area",
}

// decoder walks a node tree into a Config.
type decoder struct {
	p *problems
}

// The field names of each kind of mapping. Anything else is an error.
var (
	configFields = []string{"tiers", "tenants", "anonymous"}
	tierFields   = []string{"default", "methods", "weight", "priority"}
	tenantFields = []string{"tier", "keys", "default", "methods", "weight", "priority"}
	limitFields  = []string{"rate", "burst", "per"}
	methodFields = []string{"rate", "burst", "per", "cost", "priority", "metered"}
	meterFields  = []string{"unit", "rate", "burst", "per", "debt", "estimate", "estimate_header", "chunk"}
)

func (d *decoder) config(n *yaml.Node, cfg *Config) {
	d.fields(n, "", configFields, func(name, path string, v *yaml.Node) {
		switch name {
		case "tiers":
			d.entries(v, path, namePath, func(key, path string, v *yaml.Node) {
				if cfg.Tiers == nil {
					cfg.Tiers = map[string]TierSpec{}
				}
				cfg.Tiers[key] = d.tier(v, path)
			})
		case "tenants":
			d.entries(v, path, namePath, func(key, path string, v *yaml.Node) {
				if cfg.Tenants == nil {
					cfg.Tenants = map[string]TenantSpec{}
				}
				cfg.Tenants[key] = d.tenant(v, path)
			})
		case "anonymous":
			if !isNull(v) {
				t := d.tenant(v, path)
				cfg.Anonymous = &t
			}
		}
	})
}

func (d *decoder) tier(n *yaml.Node, path string) TierSpec {
	var t TierSpec
	d.fields(n, path, tierFields, func(name, path string, v *yaml.Node) {
		switch name {
		case "default":
			t.Default = d.limit(v, path)
		case "methods":
			t.Methods = d.methods(v, path)
		case "weight":
			t.Weight = d.weight(v, path)
		case "priority":
			t.Priority, _ = d.str(v, path)
		}
	})
	return t
}

// weight accepts a number; a value of another type is reported and read as
// 0 (inherit), so that validation does not report it again.
func (d *decoder) weight(n *yaml.Node, path string) float64 {
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		var f float64
		if err := n.Decode(&f); err == nil {
			return f
		}
	}
	if !d.alias(n, path) {
		d.p.broken[path] = true
		d.p.add(path, "must be a number")
	}
	return 0
}

func (d *decoder) tenant(n *yaml.Node, path string) TenantSpec {
	var t TenantSpec
	d.fields(n, path, tenantFields, func(name, path string, v *yaml.Node) {
		switch name {
		case "tier":
			t.Tier, _ = d.str(v, path)
		case "keys":
			t.Keys = d.keys(v, path)
		case "default":
			t.Default = d.limit(v, path)
		case "methods":
			t.Methods = d.methods(v, path)
		case "weight":
			t.Weight = d.weight(v, path)
		case "priority":
			t.Priority, _ = d.str(v, path)
		}
	})
	return t
}

func (d *decoder) keys(n *yaml.Node, path string) []string {
	if isNull(n) {
		return nil
	}
	if !d.kind(n, path, yaml.SequenceNode, "must be a list of SHA-256 hex digests") {
		return nil
	}
	keys := make([]string, 0, len(n.Content))
	for i, item := range n.Content {
		ip := indexPath(path, i)
		d.p.lines[ip] = item.Line
		if item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" {
			if !d.alias(item, ip) {
				d.p.broken[ip] = true
				d.p.add(ip, "must be a string: a SHA-256 hex digest")
			}
			// Keep the index stable so later messages point at the
			// right item.
			keys = append(keys, "")
			continue
		}
		keys = append(keys, item.Value)
	}
	return keys
}

func (d *decoder) methods(n *yaml.Node, path string) map[string]MethodSpec {
	var m map[string]MethodSpec
	d.entries(n, path, quotedPath, func(key, path string, v *yaml.Node) {
		if m == nil {
			m = map[string]MethodSpec{}
		}
		m[key] = d.method(v, path)
	})
	return m
}

func (d *decoder) method(n *yaml.Node, path string) MethodSpec {
	var (
		ms MethodSpec
		l  LimitSpec
	)
	if !isNull(n) && !d.kind(n, path, yaml.MappingNode, "must be a mapping") {
		return MethodSpec{Cost: 1}
	}
	hasLimit := false
	d.fields(n, path, methodFields, func(name, path string, v *yaml.Node) {
		if name == "priority" {
			ms.Priority, _ = d.str(v, path)
			return
		}
		if name == "metered" {
			ms.Metered = d.metered(v, path)
			return
		}
		if name == "cost" {
			c, ok := d.int(v, path)
			switch {
			case !ok:
				ms.Cost = 1
			case c < 1:
				d.p.add(path, "must be ≥ 1")
				ms.Cost = 1
			default:
				ms.Cost = c
			}
			return
		}
		hasLimit = true
		d.limitField(&l, name, path, v)
	})
	if hasLimit {
		ms.Limit = &l
	}
	return ms
}

// metered decodes a metered quota. A field of the wrong type is reported
// here and left neutral, so that validation does not report it again.
func (d *decoder) metered(n *yaml.Node, path string) *MeteredSpec {
	if isNull(n) {
		return nil
	}
	if !d.kind(n, path, yaml.MappingNode, "must be a mapping") {
		return nil
	}
	var (
		m MeteredSpec
		l LimitSpec
	)
	d.fields(n, path, meterFields, func(name, path string, v *yaml.Node) {
		switch name {
		case "unit":
			m.Unit, _ = d.str(v, path)
		case "estimate_header":
			m.EstimateHeader, _ = d.str(v, path)
		case "debt":
			switch c, ok := d.int(v, path); {
			case !ok:
				d.p.broken[path] = true
			case c == 0:
				// Written, 0 means no debt; left out, one burst.
				m.Debt = floodgate.NoDebt
			case c < 0:
				d.p.add(path, "must be ≥ 0 (0 for no debt)")
			default:
				m.Debt = c
			}
		case "estimate", "chunk":
			c, ok := d.int(v, path)
			if !ok {
				d.p.broken[path] = true
			}
			if name == "estimate" {
				m.Estimate = c
			} else {
				m.Chunk = c
			}
		default:
			d.limitField(&l, name, path, v)
		}
	})
	m.Rate, m.Burst, m.Per = l.Rate, l.Burst, l.Per
	return &m
}

func (d *decoder) limit(n *yaml.Node, path string) *LimitSpec {
	if isNull(n) {
		return nil
	}
	if !d.kind(n, path, yaml.MappingNode, "must be a mapping") {
		// A neutral limit, so the level does not also lack a fallback.
		return &LimitSpec{Rate: 1, Burst: 1}
	}
	var l LimitSpec
	d.fields(n, path, limitFields, func(name, path string, v *yaml.Node) {
		d.limitField(&l, name, path, v)
	})
	return &l
}

// limitField decodes one of rate, burst and per. A value of the wrong type
// is reported here and replaced by a neutral one, so that validation does
// not report it a second time.
func (d *decoder) limitField(l *LimitSpec, name, path string, v *yaml.Node) {
	switch name {
	case "rate":
		r, ok := d.rate(v, path)
		if !ok {
			r = 1
		}
		l.Rate = r
	case "burst":
		b, ok := d.int(v, path)
		if !ok {
			b = 1
		}
		l.Burst = b
	case "per":
		per, err := time.ParseDuration(v.Value)
		if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" || err != nil {
			if d.alias(v, path) {
				return
			}
			d.p.add(path, "must be a duration such as 1s, 1m or 1h")
			per = time.Second
		}
		l.Per = per
		if per == 0 {
			// A written zero is a mistake, not "the default".
			d.p.add(path, "must be > 0")
			l.Per = time.Second
		}
	}
}

// fields walks a mapping whose keys are field names. known lists the names
// fn handles; others are errors. A null value stands for an empty mapping.
func (d *decoder) fields(n *yaml.Node, path string, known []string, fn func(name, path string, v *yaml.Node)) {
	d.entries(n, path, fieldPath, func(key, kpath string, v *yaml.Node) {
		for _, k := range known {
			if k == key {
				fn(key, kpath, v)
				return
			}
		}
		if !isIdent(key) || len(key) > 40 || strings.ContainsAny(key, "0123456789") {
			// The name itself may be a pasted secret (field names are
			// short words; keys are long and hold digits): do not echo it.
			d.p.addAt(d.p.lines[kpath], path, unknownField(key)+" (name not shown)")
			return
		}
		d.p.add(kpath, unknownField(key))
	})
}

// entries walks a mapping, calls fn for each key with the key's path, and
// reports duplicate keys and non-scalar keys.
func (d *decoder) entries(n *yaml.Node, path string, join func(parent, key string) string, fn func(key, path string, v *yaml.Node)) {
	if isNull(n) {
		return
	}
	if !d.kind(n, path, yaml.MappingNode, "must be a mapping") {
		return
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			if !d.alias(k, path) {
				d.p.addAt(k.Line, path, "keys must be plain strings")
			}
			continue
		}
		kpath := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.p.addAt(k.Line, kpath, "duplicate key (first at line "+strconv.Itoa(first)+")")
			continue
		}
		seen[k.Value] = k.Line
		d.p.lines[kpath] = k.Line
		if d.alias(v, kpath) {
			continue
		}
		fn(k.Value, kpath, v)
	}
}

// unknownField names the problem with an unexpected field. A name that
// suggests a secret gets a pointed message; a name that is not a short
// identifier might itself be a pasted secret, so it is not echoed (it is
// part of the field path only when the caller built one).
func unknownField(name string) string {
	lower := strings.ToLower(name)
	for _, s := range []string{"key", "secret", "token", "password"} {
		if strings.Contains(lower, s) {
			return "plain-text API keys are not accepted: list SHA-256 hex digests under keys"
		}
	}
	return "unknown field"
}

// alias reports (and rejects) YAML aliases: expanding them invites
// exponential blow-ups, and a config gains nothing from them.
func (d *decoder) alias(n *yaml.Node, path string) bool {
	if n.Kind == yaml.AliasNode {
		d.p.broken[path] = true
		d.p.addAt(n.Line, path, "YAML aliases are not supported")
		return true
	}
	return false
}

func (d *decoder) kind(n *yaml.Node, path string, k yaml.Kind, msg string) bool {
	if n.Kind == k {
		return true
	}
	if !d.alias(n, path) {
		d.p.broken[path] = true
		d.p.add(path, msg)
	}
	return false
}

func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
		return n.Value, true
	}
	if !d.alias(n, path) {
		d.p.broken[path] = true
		d.p.add(path, "must be a string")
	}
	return "", false
}

func (d *decoder) int(n *yaml.Node, path string) (int, bool) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" {
		var i int
		if err := n.Decode(&i); err == nil {
			return i, true
		}
		d.p.add(path, "integer out of range")
		return 0, false
	}
	if !d.alias(n, path) {
		d.p.add(path, "must be an integer")
	}
	return 0, false
}

// rate accepts a number, YAML's .inf, or the string "inf" (JSON has no
// infinity).
func (d *decoder) rate(n *yaml.Node, path string) (float64, bool) {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!int", "!!float":
			var f float64
			if err := n.Decode(&f); err == nil {
				return f, true
			}
		case "!!str":
			if n.Value == "inf" {
				return math.Inf(1), true
			}
		}
	}
	if !d.alias(n, path) {
		d.p.add(path, `must be a number or "inf"`)
	}
	return 0, false
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}
