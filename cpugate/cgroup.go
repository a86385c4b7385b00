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
	// process's CPU affinity alone bounds the CPUs it may run on.
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

// readBudget returns the CPUs this process can use: the smallest quota among
// its cgroup and their ancestors, bounded by the size of the cgroup's cpuset
// (a quota of 8 CPUs on a 2-CPU cpuset is 2 CPUs) and by procs, its affinity
// and GOMAXPROCS (a quota of 2 CPUs with GOMAXPROCS 1 is 1 CPU). The kernel
// keeps the affinity within the cpuset, but the cpuset still bounds the
// budget where the affinity cannot be read. Missing files mean no limit at
// that level; malformed ones are errors. read returns a file's content
// (fs.ReadFile in tests, the sampler's kept-open files in production).
func readBudget(read func(name string) ([]byte, error), p cgroupPaths, procs procLimits) (float64, error) {
	budget := math.Inf(1)
	for _, d := range p.quotaDirs {
		var cpus float64
		var limited bool
		if p.version == 2 {
			b, err := read(path.Join(d, "cpu.max"))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return 0, err
			}
			if cpus, limited, err = parseCPUMax(b); err != nil {
				return 0, err
			}
		} else {
			q, err := read(path.Join(d, "cpu.cfs_quota_us"))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return 0, err
			}
			per, err := read(path.Join(d, "cpu.cfs_period_us"))
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
	n := procs.cpus()
	for _, f := range p.cpusets {
		b, err := read(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return 0, err
		}
		set, err := parseCPUList(path.Base(f), b)
		if err != nil {
			return 0, err
		}
		n = min(n, set)
		break
	}
	return min(budget, float64(n)), nil
}

// A CgroupSampler measures the CPU use of this process's cgroup (its
// container, on most orchestrators) against the CPU this process can use:
// the smallest of the cpu quotas of the cgroup and its ancestors, the CPUs
// the process may run on (the cgroup's cpuset and the process's affinity
// mask), and GOMAXPROCS. A process pinned to one CPU in a cgroup allowed two
// is saturated at one CPU's worth of use, and reads 1 there, not 0.5.
//
// It supports cgroup v2 (cpu.stat usage_usec, cpu.max,
// cpuset.cpus.effective) and v1 (cpuacct.usage, cpu.cfs_quota_us and
// cpu.cfs_period_us, cpuset.cpus). The usage counter file stays open and is
// re-read in place, with no allocation, and so do the limit files. The limits
// (files, affinity and GOMAXPROCS) are re-read every few seconds because
// they change while the process runs: orchestrators resize containers, and
// GOMAXPROCS moves with runtime.GOMAXPROCS calls and, by default, with the
// quota.
//
// Usage counts every process in the cgroup, not only this one: in a
// container that is the right measure, since they share the quota. But when
// this process's affinity or GOMAXPROCS is what bounds the budget, the other
// processes' use is counted against a budget that is this process's alone,
// and the fraction can exceed 1; like any value above 1 it is reported as 1.
// Such a reading says the cgroup is busy, not that this process is: where
// busy processes share the cgroup with one held to fewer CPUs, a
// [ProcessSampler] measures this process alone.
//
// A CgroupSampler is not safe for concurrent use. Close releases the open
// files.
type CgroupSampler struct {
	paths    cgroupPaths
	procs    procLimits
	source   string
	usage    kept
	limits   map[string]*kept // by path; read only every limitsEvery
	readFn   func(string) ([]byte, error)
	budget   float64
	limitsAt time.Time
	last     time.Duration // cumulative usage at lastAt
	lastAt   time.Time
}

// A kept file stays open and is re-read from offset 0: a pread costs a
// fraction of an open, a read and a close, and allocates nothing. After a
// failed read it is closed and reopened on the next call, in case the
// kernel replaced it (a controller disabled and enabled again).
type kept struct {
	name string // OS path
	f    *os.File
	buf  []byte
}

func (k *kept) read() ([]byte, error) {
	if k.f == nil {
		f, err := os.Open(k.name)
		if err != nil {
			return nil, err
		}
		k.f = f
		if k.buf == nil {
			k.buf = make([]byte, 512)
		}
	}
	for {
		n, err := k.f.ReadAt(k.buf, 0)
		if err != nil && err != io.EOF {
			k.close()
			return nil, err
		}
		if n < len(k.buf) {
			return k.buf[:n], nil
		}
		// Filled the buffer: the file may be longer (a long cpu list).
		k.buf = make([]byte, 2*len(k.buf))
	}
}

func (k *kept) close() error {
	if k.f == nil {
		return nil
	}
	err := k.f.Close()
	k.f = nil
	return err
}

// NewCgroupSampler finds this process's cgroup through /proc/self/cgroup and
// /proc/self/mountinfo and opens its usage counter. It returns an error
// wrapping [ErrNoCgroup] when there is no cgroup cpu accounting (for instance
// outside Linux), and an error naming the file when a file cannot be parsed.
func NewCgroupSampler() (*CgroupSampler, error) {
	return newCgroupSampler("/", time.Now(), liveLimits)
}

// newCgroupSampler reads the cgroup files under root and this process's
// limits from procs, so tests can point it at a fixture tree and set them.
func newCgroupSampler(root string, now time.Time, procs procLimits) (*CgroupSampler, error) {
	p, err := findCgroup(os.DirFS(root))
	if err != nil {
		return nil, err
	}
	osPath := func(name string) string { return filepath.Join(root, filepath.FromSlash(name)) }
	c := &CgroupSampler{
		paths:  p,
		procs:  procs,
		source: SourceCgroup1,
		usage:  kept{name: osPath(p.usage)},
		limits: make(map[string]*kept),
	}
	if p.version == 2 {
		c.source = SourceCgroup2
	}
	c.readFn = func(name string) ([]byte, error) {
		k := c.limits[name]
		if k == nil {
			k = &kept{name: osPath(name)}
			c.limits[name] = k
		}
		return k.read()
	}
	if c.budget, err = readBudget(c.readFn, p, c.procs); err != nil {
		c.Close()
		if errors.Is(err, errMalformed) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: reading limits: %w", ErrNoCgroup, err)
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

// Budget returns the CPUs readings are measured against, as last read: a
// quota of 150000/100000 is 1.5, and 1 with GOMAXPROCS 1.
func (c *CgroupSampler) Budget() float64 { return c.budget }

// Sample returns the cgroup's CPU use since the previous sample. An error
// wraps [ErrNoReading]; the sampler then keeps its previous baseline, so the
// next good read covers the whole gap. A failed re-read of the limits keeps
// the previous budget and is retried at the next re-read.
func (c *CgroupSampler) Sample() (Reading, error) { return c.sampleAt(time.Now()) }

// sampleAt is Sample at time now, which must come from the same clock as the
// previous call's.
func (c *CgroupSampler) sampleAt(now time.Time) (Reading, error) {
	u, err := c.readUsage()
	if err != nil {
		return Reading{Source: c.source}, err
	}
	if now.Sub(c.limitsAt) >= limitsEvery {
		if b, err := readBudget(c.readFn, c.paths, c.procs); err == nil {
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

// readUsage returns the cgroup's cumulative CPU time.
func (c *CgroupSampler) readUsage() (time.Duration, error) {
	b, err := c.usage.read()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoReading, err)
	}
	if c.paths.version == 2 {
		us, err := parseCPUStat(b)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrNoReading, err)
		}
		return time.Duration(us) * time.Microsecond, nil
	}
	ns, err := parseCounter("cpuacct.usage", b)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoReading, err)
	}
	return time.Duration(ns), nil
}

// Close closes the files the sampler keeps open. It is idempotent; a closed
// sampler reopens them if sampled again.
func (c *CgroupSampler) Close() error {
	errs := []error{c.usage.close()}
	for _, k := range c.limits {
		errs = append(errs, k.close())
	}
	return errors.Join(errs...)
}
