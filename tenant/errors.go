package tenant

import (
	"errors"
	"sort"
	"strconv"
	"strings"
)

// ErrInvalidConfig is matched (with errors.Is) by every error [Parse] and
// [Compile] return for a config they reject.
var ErrInvalidConfig = errors.New("tenant: invalid config")

// A FieldError is one problem in a config: where it is and what is wrong.
type FieldError struct {
	// File is the name given to [Parse], or "" for [Compile].
	File string
	// Line is the 1-based line of the offending key or item, or 0 when
	// unknown (always for [Compile]).
	Line int
	// Field is the path of the offending field, such as
	// tiers.free.methods["/x.Y/Z"].rate, or "" for the file as a whole.
	Field string
	// Msg says what is wrong. It never quotes a value that might be a
	// secret.
	Msg string
}

// Error formats e as "file:line: field: msg", leaving out what is unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// A ConfigError lists every problem found in one config, so that a single
// run reports all of them rather than one per edit.
type ConfigError struct {
	// Errors are sorted by line, then field; never empty.
	Errors []*FieldError
}

// Error formats the list, one problem per line after a summary line.
func (e *ConfigError) Error() string {
	if len(e.Errors) == 1 {
		return "tenant: invalid config: " + e.Errors[0].Error()
	}
	var b strings.Builder
	b.WriteString("tenant: invalid config: ")
	b.WriteString(strconv.Itoa(len(e.Errors)))
	b.WriteString(" errors:")
	for _, fe := range e.Errors {
		b.WriteByte('\n')
		b.WriteString(fe.Error())
	}
	return b.String()
}

// Is reports whether target is [ErrInvalidConfig].
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Unwrap returns the individual problems, for errors.As.
func (e *ConfigError) Unwrap() []error {
	errs := make([]error, len(e.Errors))
	for i, fe := range e.Errors {
		errs[i] = fe
	}
	return errs
}

// problems collects FieldErrors for one config and knows where its fields
// sit in the source, if there is a source.
type problems struct {
	file string
	// lines maps a field path to the line of its key; nil for Compile.
	lines map[string]int
	// broken marks fields decoding could not read: validation stays quiet
	// about what follows from their absence.
	broken map[string]bool
	errs   []*FieldError
}

// add records a problem at field, on the line of the field or, failing
// that, of its nearest recorded parent (a missing field has no line of its
// own; its parent's is where to look).
func (p *problems) add(field, msg string) {
	p.errs = append(p.errs, &FieldError{File: p.file, Line: p.lineOf(field), Field: field, Msg: msg})
}

// addAt records a problem at an explicit line.
func (p *problems) addAt(line int, field, msg string) {
	p.errs = append(p.errs, &FieldError{File: p.file, Line: line, Field: field, Msg: msg})
}

func (p *problems) lineOf(field string) int {
	for f := field; f != ""; f = parentPath(f) {
		if l, ok := p.lines[f]; ok {
			return l
		}
	}
	return 0
}

// has reports whether the source set field explicitly. Without a source
// (Compile) nothing is explicit.
func (p *problems) has(field string) bool {
	_, ok := p.lines[field]
	return ok
}

// err returns the collected problems as a *ConfigError, sorted and without
// duplicates, or nil.
func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	sort.SliceStable(p.errs, func(i, j int) bool {
		a, b := p.errs[i], p.errs[j]
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Field != b.Field {
			return a.Field < b.Field
		}
		return a.Msg < b.Msg
	})
	out := p.errs[:1]
	for _, fe := range p.errs[1:] {
		if last := out[len(out)-1]; *fe != *last {
			out = append(out, fe)
		}
	}
	return &ConfigError{Errors: out}
}

// Field paths. Struct fields join with '.', names that are plain
// identifiers too; anything else (method patterns, odd names) is quoted in
// brackets so the path stays unambiguous.

func fieldPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func namePath(parent, name string) string {
	if isIdent(name) {
		return fieldPath(parent, name)
	}
	return parent + "[" + strconv.Quote(name) + "]"
}

func quotedPath(parent, key string) string {
	return parent + "[" + strconv.Quote(key) + "]"
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// parentPath strips the last element of a path, or returns "".
func parentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		// The bracket may be quoted content containing '['; scan for the
		// opening bracket outside quotes from the left instead.
		if i := openBracket(p); i >= 0 {
			return p[:i]
		}
		return ""
	}
	if i := strings.LastIndexAny(p, ".]"); i >= 0 {
		if p[i] == ']' {
			return p[:i+1]
		}
		return p[:i]
	}
	return ""
}

// openBracket finds the '[' that opens the final bracketed element of p.
func openBracket(p string) int {
	last, inQuote := -1, false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '[':
			last = i
		}
	}
	return last
}

// isIdent reports whether s is a plain identifier that needs no quoting in
// a field path: a letter or '_' then letters, digits, '_' or '-'.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case i > 0 && (c == '-' || '0' <= c && c <= '9'):
		default:
			return false
		}
	}
	return true
}
