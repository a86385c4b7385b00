package cpugate

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The parsers below are pure functions of a file's bytes, so fixture files
// stand in for /proc and /sys in tests. Each error wraps errMalformed and
// names the file.

// malformed builds the error for a file whose content is not as expected.
// It runs only on failure, so fmt is fine here.
func malformed(file string, content []byte) error {
	const max = 64
	if len(content) > max {
		content = content[:max]
	}
	return fmt.Errorf("%w: %s: %q", errMalformed, file, content)
}

// parseDecimal parses an unsigned decimal integer without allocating: the
// usage counter is parsed on every sample. It takes up to 20 digits, all a
// uint64 counter such as cpuacct.usage can reach, and refuses overflow.
func parseDecimal(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for i, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if i == 19 && (n > (math.MaxUint64-d)/10) { // only a 20th digit can overflow
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// parseCounter parses a file holding one unsigned integer and a newline,
// such as cgroup v1 cpuacct.usage (nanoseconds).
func parseCounter(file string, b []byte) (uint64, error) {
	n, ok := parseDecimal(bytes.TrimSpace(b))
	if !ok {
		return 0, malformed(file, b)
	}
	return n, nil
}

// parseCPUStat returns the usage_usec field of a cgroup v2 cpu.stat file.
// The kernel writes it first, but the parser does not rely on that.
func parseCPUStat(b []byte) (usec uint64, err error) {
	rest := b
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte{'\n'})
		if v, ok := bytes.CutPrefix(line, []byte("usage_usec ")); ok {
			if n, ok := parseDecimal(bytes.TrimSpace(v)); ok {
				return n, nil
			}
			break
		}
	}
	return 0, malformed("cpu.stat", b)
}

// parseCPUMax parses a cgroup v2 cpu.max file, "$MAX $PERIOD", where $MAX is
// a quota in microseconds or "max". It returns the quota in CPUs and whether
// there is one.
func parseCPUMax(b []byte) (cpus float64, limited bool, err error) {
	f := strings.Fields(string(b))
	if len(f) == 0 || len(f) > 2 {
		return 0, false, malformed("cpu.max", b)
	}
	period := uint64(100000) // the kernel's default when only $MAX is given
	if len(f) == 2 {
		p, ok := parseDecimal([]byte(f[1]))
		if !ok || p == 0 {
			return 0, false, malformed("cpu.max", b)
		}
		period = p
	}
	if f[0] == "max" {
		return 0, false, nil
	}
	q, ok := parseDecimal([]byte(f[0]))
	if !ok || q == 0 {
		return 0, false, malformed("cpu.max", b)
	}
	return float64(q) / float64(period), true, nil
}

// parseCFS parses the cgroup v1 pair cpu.cfs_quota_us and cpu.cfs_period_us.
// A quota of -1 means none.
func parseCFS(quota, period []byte) (cpus float64, limited bool, err error) {
	q, err := strconv.ParseInt(string(bytes.TrimSpace(quota)), 10, 64)
	if err != nil || q == 0 || q < -1 {
		return 0, false, malformed("cpu.cfs_quota_us", quota)
	}
	p, ok := parseDecimal(bytes.TrimSpace(period))
	if !ok || p == 0 {
		return 0, false, malformed("cpu.cfs_period_us", period)
	}
	if q == -1 {
		return 0, false, nil
	}
	return float64(q) / float64(p), true, nil
}

// parseCPUList counts the CPUs in a kernel cpu list such as "0-3,8-11"
// (cpuset.cpus, cpuset.cpus.effective). An empty list is an error: a cgroup
// with no CPUs runs nothing, so the file cannot be describing this process.
func parseCPUList(file string, b []byte) (int, error) {
	s := strings.TrimSpace(string(b))
	if s == "" {
		return 0, malformed(file, b)
	}
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, ok := parseDecimal([]byte(lo))
		if !ok {
			return 0, malformed(file, b)
		}
		z := a
		if isRange {
			if z, ok = parseDecimal([]byte(hi)); !ok || z < a {
				return 0, malformed(file, b)
			}
		}
		if z-a >= math.MaxInt32 {
			return 0, malformed(file, b)
		}
		n += int(z-a) + 1
	}
	return n, nil
}

// A procCgroup is one line of /proc/self/cgroup: "id:controllers:path".
// Cgroup v2 has the line "0::/path"; v1 has one line per hierarchy.
type procCgroup struct {
	controllers []string
	path        string
	v2          bool
}

func parseProcCgroup(b []byte) ([]procCgroup, error) {
	var out []procCgroup
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		ctrls, p, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || !strings.HasPrefix(p, "/") {
			return nil, malformed("/proc/self/cgroup", []byte(line))
		}
		var c procCgroup
		c.path = p
		if id == "0" && ctrls == "" {
			c.v2 = true
		} else if ctrls != "" {
			c.controllers = strings.Split(ctrls, ",")
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, malformed("/proc/self/cgroup", b)
	}
	return out, nil
}

// A mount is the part of a /proc/self/mountinfo line that locates a cgroup
// hierarchy: the hierarchy's directory shown at this mount (root), where it
// is mounted (point), the filesystem type and its super options, which list
// a v1 hierarchy's controllers.
type mount struct {
	root, point string
	fstype      string
	superOpts   []string
}

// parseMountinfo returns the cgroup and cgroup2 mounts in a mountinfo file
// (see proc(5)): "36 35 98:0 /root /point opts [optional...] - fstype src super".
func parseMountinfo(b []byte) ([]mount, error) {
	var out []mount
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 {
			return nil, malformed("/proc/self/mountinfo", []byte(line))
		}
		if g[0] != "cgroup" && g[0] != "cgroup2" {
			continue
		}
		out = append(out, mount{
			root:      unescapeOctal(f[3]),
			point:     unescapeOctal(f[4]),
			fstype:    g[0],
			superOpts: strings.Split(g[2], ","),
		})
	}
	return out, nil
}

// unescapeOctal undoes mountinfo's escaping of space, tab, newline and
// backslash as \ooo.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				sb.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		sb.WriteByte(s[i])
	}
	return sb.String()
}
