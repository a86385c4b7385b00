package cpugate

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// cgroupPaths locates this process's CPU accounting, as paths relative to the
// filesystem root (fs.FS style: no leading slash).
type cgroupPaths struct {
	version int
	// usage is the counter file: v2 cpu.stat, v1 cpuacct.usage.
	usage string
	// quotaDirs are the directories whose quota bounds this process: its own
	// cgroup and every ancestor up to the mount point, because a parent's
	// quota caps all its children (a Kubernetes pod around its containers).
	quotaDirs []string
	// cpusets are candidate cpu list files, nearest first. None means the
	// budget falls back to the process's CPU affinity.
	cpusets []string
}

// findCgroup locates the cgroup of the process whose /proc/self is in fsys.
// On a hybrid host (v1 controllers plus a v2 mount without them) the v1 cpu
// accounting wins, because the v2 hierarchy then counts nothing useful.
func findCgroup(fsys fs.FS) (cgroupPaths, error) {
	b, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return cgroupPaths{}, fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	groups, err := parseProcCgroup(b)
	if err != nil {
		return cgroupPaths{}, err
	}
	b, err = fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		return cgroupPaths{}, fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	mounts, err := parseMountinfo(b)
	if err != nil {
		return cgroupPaths{}, err
	}
	if p, ok := findV1(fsys, groups, mounts); ok {
		return p, nil
	}
	if p, ok := findV2(fsys, groups, mounts); ok {
		return p, nil
	}
	return cgroupPaths{}, fmt.Errorf("%w: no cpu accounting in /proc/self/cgroup and mountinfo", ErrNoCgroup)
}

func findV2(fsys fs.FS, groups []procCgroup, mounts []mount) (cgroupPaths, bool) {
	for _, g := range groups {
		if !g.v2 {
			continue
		}
		for _, m := range mounts {
			if m.fstype != "cgroup2" {
				continue
			}
			dir, ok := resolve(fsys, m, g.path)
			if !ok || !exists(fsys, path.Join(dir, "cpu.stat")) {
				continue
			}
			p := cgroupPaths{version: 2, usage: path.Join(dir, "cpu.stat")}
			for _, d := range ancestors(dir, rel(m.point)) {
				p.quotaDirs = append(p.quotaDirs, d)
				p.cpusets = append(p.cpusets, path.Join(d, "cpuset.cpus.effective"))
			}
			return p, true
		}
	}
	return cgroupPaths{}, false
}

func findV1(fsys fs.FS, groups []procCgroup, mounts []mount) (cgroupPaths, bool) {
	acct, ok := v1Dir(fsys, groups, mounts, "cpuacct")
	if !ok || !exists(fsys, path.Join(acct.dir, "cpuacct.usage")) {
		return cgroupPaths{}, false
	}
	p := cgroupPaths{version: 1, usage: path.Join(acct.dir, "cpuacct.usage")}
	// The cpu controller (CFS quota) is usually co-mounted with cpuacct, but
	// need not be; without it there is no quota to honour.
	if cpu, ok := v1Dir(fsys, groups, mounts, "cpu"); ok {
		p.quotaDirs = ancestors(cpu.dir, rel(cpu.point))
	}
	if cs, ok := v1Dir(fsys, groups, mounts, "cpuset"); ok {
		p.cpusets = []string{path.Join(cs.dir, "cpuset.effective_cpus"), path.Join(cs.dir, "cpuset.cpus")}
	}
	return p, true
}

type v1Mount struct{ dir, point string }

func v1Dir(fsys fs.FS, groups []procCgroup, mounts []mount, ctrl string) (v1Mount, bool) {
	for _, g := range groups {
		if !slices.Contains(g.controllers, ctrl) {
			continue
		}
		for _, m := range mounts {
			if m.fstype != "cgroup" || !slices.Contains(m.superOpts, ctrl) {
				continue
			}
			if dir, ok := resolve(fsys, m, g.path); ok {
				return v1Mount{dir: dir, point: m.point}, true
			}
		}
	}
	return v1Mount{}, false
}

// resolve maps a cgroup path from /proc/self/cgroup to a directory under
// mount m. The mount shows the hierarchy from m.root down, so the path must
// lie under it; with a cgroup namespace both are "/".
func resolve(fsys fs.FS, m mount, cg string) (string, bool) {
	sub := cg
	if m.root != "/" {
		r, ok := strings.CutPrefix(cg, m.root)
		if !ok || (r != "" && !strings.HasPrefix(r, "/")) {
			return "", false
		}
		sub = r
	}
	dir := path.Join(rel(m.point), sub)
	if !exists(fsys, dir) {
		return "", false
	}
	return dir, true
}

// ancestors returns dir and its parents up to and including top.
func ancestors(dir, top string) []string {
	out := []string{dir}
	for dir != top && strings.HasPrefix(dir, top+"/") {
		dir = path.Dir(dir)
		out = append(out, dir)
	}
	return out
}

func rel(p string) string {
	p = strings.TrimPrefix(path.Clean(p), "/")
	if p == "" {
		return "."
	}
	return p
}

func exists(fsys fs.FS, name string) bool {
	_, err := fs.Stat(fsys, name)
	return err == nil
}

// readBudget returns the CPUs this cgroup may use: the smallest quota among
// it and its ancestors, bounded by the size of its cpuset (a quota of 8 CPUs
// on a 2-CPU cpuset is 2 CPUs). Missing files mean no limit at that level;
// malformed ones are errors. affinity supplies the CPU count when no cpuset
// file is readable.
func readBudget(fsys fs.FS, p cgroupPaths, affinity func() int) (float64, error) {
	budget := math.Inf(1)
	for _, d := range p.quotaDirs {
		var cpus float64
		var limited bool
		if p.version == 2 {
			b, err := fs.ReadFile(fsys, path.Join(d, "cpu.max"))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return 0, err
			}
			if cpus, limited, err = parseCPUMax(b); err != nil {
				return 0, err
			}
		} else {
			q, err := fs.ReadFile(fsys, path.Join(d, "cpu.cfs_quota_us"))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return 0, err
			}
			per, err := fs.ReadFile(fsys, path.Join(d, "cpu.cfs_period_us"))
			if err != nil {
				return 0, err
			}
			if cpus, limited, err = parseCFS(q, per); err != nil {
				return 0, err
			}
		}
		if limited {
			budget = min(budget, cpus)
		}
	}
	n := 0
	for _, f := range p.cpusets {
		b, err := fs.ReadFile(fsys, f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return 0, err
		}
		if n, err = parseCPUList(path.Base(f), b); err != nil {
			return 0, err
		}
		break
	}
	if n == 0 {
		n = affinity()
	}
	return min(budget, float64(n)), nil
}

// A CgroupSampler measures the CPU use of this process's cgroup (its
// container, on most orchestrators) against the CPU the cgroup may use: the
// smallest cpu quota of the cgroup and its ancestors, bounded by its cpuset.
//
// It supports cgroup v2 (cpu.stat usage_usec, cpu.max,
// cpuset.cpus.effective) and v1 (cpuacct.usage, cpu.cfs_quota_us and
// cpu.cfs_period_us, cpuset.cpus). The usage counter file stays open and is
// re-read in place, with no allocation; the limits are re-read every few
// seconds, because orchestrators resize containers while they run.
//
// Usage counts every process in the cgroup, not only this one: in a
// container that is the right measure, since they share the quota.
//
// A CgroupSampler is not safe for concurrent use. Close releases the open
// file.
type CgroupSampler struct {
	root     string
	fsys     fs.FS
	paths    cgroupPaths
	source   string
	usage    *os.File
	buf      [512]byte
	budget   float64
	limitsAt time.Time
	last     time.Duration // cumulative usage at lastAt
	lastAt   time.Time
}

// NewCgroupSampler finds this process's cgroup through /proc/self/cgroup and
// /proc/self/mountinfo and opens its usage counter. It returns an error
// wrapping [ErrNoCgroup] when there is no cgroup cpu accounting (for instance
// outside Linux) and one wrapping [ErrMalformed] when a file cannot be
// parsed.
func NewCgroupSampler() (*CgroupSampler, error) {
	return newCgroupSampler("/", time.Now())
}

// newCgroupSampler reads the cgroup files under root, so tests can point it
// at a fixture tree.
func newCgroupSampler(root string, now time.Time) (*CgroupSampler, error) {
	fsys := os.DirFS(root)
	p, err := findCgroup(fsys)
	if err != nil {
		return nil, err
	}
	c := &CgroupSampler{root: root, fsys: fsys, paths: p, source: SourceCgroup1}
	if p.version == 2 {
		c.source = SourceCgroup2
	}
	if c.budget, err = readBudget(fsys, p, affinityCPUs); err != nil {
		return nil, err
	}
	c.limitsAt = now
	u, err := c.readUsage()
	if err != nil {
		c.Close()
		return nil, err
	}
	c.last, c.lastAt = u, now
	return c, nil
}

// Source returns [SourceCgroup2] or [SourceCgroup1].
func (c *CgroupSampler) Source() string { return c.source }

// Budget returns the CPUs the cgroup may use, as last read: a quota of
// 150000/100000 is 1.5.
func (c *CgroupSampler) Budget() float64 { return c.budget }

// Sample returns the cgroup's CPU use since the previous sample.
func (c *CgroupSampler) Sample() (Reading, error) { return c.SampleAt(time.Now()) }

// SampleAt is [CgroupSampler.Sample] at time now, which must come from the
// same clock as the previous call's.
//
// An error wraps [ErrNoReading]; the sampler then keeps its previous
// baseline, so the next good read covers the whole gap. A failed re-read of
// the limits keeps the previous budget and is retried at the next re-read.
func (c *CgroupSampler) SampleAt(now time.Time) (Reading, error) {
	u, err := c.readUsage()
	if err != nil {
		return Reading{Source: c.source}, err
	}
	if now.Sub(c.limitsAt) >= limitsEvery {
		if b, err := readBudget(c.fsys, c.paths, affinityCPUs); err == nil {
			c.budget = b
		}
		c.limitsAt = now
	}
	wall := now.Sub(c.lastAt)
	if wall < minInterval {
		return Reading{Source: c.source}, ErrNoReading
	}
	busy := u - c.last
	c.last, c.lastAt = u, now
	if busy < 0 { // the counter was reset: start over from here
		return Reading{Source: c.source}, ErrNoReading
	}
	return Reading{CPU: fraction(busy, wall, c.budget), Source: c.source}, nil
}

// readUsage returns the cgroup's cumulative CPU time. The file is opened
// once and re-read at offset 0; after a failure it is reopened on the next
// call, in case the kernel replaced it.
func (c *CgroupSampler) readUsage() (time.Duration, error) {
	if c.usage == nil {
		f, err := os.Open(filepath.Join(c.root, filepath.FromSlash(c.paths.usage)))
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrNoReading, err)
		}
		c.usage = f
	}
	n, err := c.usage.ReadAt(c.buf[:], 0)
	if err != nil && err != io.EOF {
		c.usage.Close()
		c.usage = nil
		return 0, fmt.Errorf("%w: %w", ErrNoReading, err)
	}
	if c.paths.version == 2 {
		us, err := parseCPUStat(c.buf[:n])
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrNoReading, err)
		}
		return time.Duration(us) * time.Microsecond, nil
	}
	ns, err := parseCounter("cpuacct.usage", c.buf[:n])
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoReading, err)
	}
	return time.Duration(ns), nil
}

// Close closes the usage file. It is idempotent; a closed sampler reopens
// the file if sampled again.
func (c *CgroupSampler) Close() error {
	if c.usage == nil {
		return nil
	}
	err := c.usage.Close()
	c.usage = nil
	return err
}
