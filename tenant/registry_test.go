package tenant_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/tenant"
)

// Two good configs that differ in acme's Export limit, and a bad one.
const (
	goodA = `tiers: {free: {default: {rate: 10, burst: 20}}}
tenants:
  acme:
    tier: free
    keys: [52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32]
    methods: {"/inventory.v1.Inventory/Export": {rate: 1, burst: 1}}
`
	goodB = `tiers: {free: {default: {rate: 10, burst: 20}}}
tenants:
  acme:
    tier: free
    keys: [52aeec85af00794a9d685869f6e086bae037282ef483189cbc4ac286d096fe32]
    methods: {"/inventory.v1.Inventory/Export": {rate: 2, burst: 2}}
`
	bad = `tiers: {free: {default: {rate: 10, burst: 20}}}
tenants:
  acme:
    tier: gold
`
)

// event is one call of the WithOnReload function.
type event struct {
	path  string
	table *tenant.Table
	err   error
}

// recorder collects reload events.
type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) hook(path string, t *tenant.Table, err error) {
	r.mu.Lock()
	r.events = append(r.events, event{path, t, err})
	r.mu.Unlock()
}

// take returns the events since the last call.
func (r *recorder) take() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replaceFile writes content next to path and renames it over path, the
// way the Watch documentation asks writers to: a poll never sees a
// partial file.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// exportBurst reads acme's Export burst from the registry's table, or -1
// when acme is unknown.
func exportBurst(r *tenant.Registry) int {
	tn, ok := r.Table().TenantByKey("demo-key-acme-1")
	if !ok {
		return -1
	}
	return tn.Rule(export).Limit.Burst
}

func newRegistry(t *testing.T, opts ...tenant.Option) (*tenant.Registry, *recorder) {
	t.Helper()
	rec := &recorder{}
	r, err := tenant.New(append([]tenant.Option{tenant.WithLogger(nil), tenant.WithOnReload(rec.hook)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r, rec
}

func TestRegistryStartsClosed(t *testing.T) {
	r, _ := newRegistry(t)
	tbl := r.Table()
	if tbl == nil {
		t.Fatal("Table() = nil before any load")
	}
	if tn, ok := tbl.TenantByKey("demo-key-acme-1"); ok || !tn.Rule(export).Limit.IsZero() {
		t.Errorf("before any load: TenantByKey = %q, %v, limit %v; want anonymous with the zero limit", tn.ID(), ok, tn.Rule(export).Limit)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := tenant.New(tenant.WithPollInterval(d)); err == nil {
			t.Errorf("New(WithPollInterval(%v)) = nil error, want one", d)
		}
	}
}

func TestLoadGoodBadGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	r, rec := newRegistry(t)

	writeFile(t, path, goodA)
	if err := r.Load(path); err != nil {
		t.Fatal(err)
	}
	first := r.Table()
	if got, want := exportBurst(r), 1; got != want {
		t.Fatalf("after good load: Export burst = %d, want %d", got, want)
	}

	writeFile(t, path, bad)
	err := r.Load(path)
	var ce *tenant.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Load(bad) = %v, want a *ConfigError", err)
	}
	if want := path + `:4: tenants.acme.tier: unknown tier "gold"`; ce.Errors[0].Error() != want {
		t.Errorf("Load(bad) error %q, want %q", ce.Errors[0].Error(), want)
	}
	if r.Table() != first {
		t.Fatal("a bad config replaced the table in force")
	}

	if err := r.Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNotExist", err)
	}
	if r.Table() != first {
		t.Fatal("a missing file replaced the table in force")
	}

	writeFile(t, path, goodB)
	if err := r.Load(path); err != nil {
		t.Fatal(err)
	}
	if got, want := exportBurst(r), 2; got != want {
		t.Errorf("after second good load: Export burst = %d, want %d", got, want)
	}

	ev := rec.take()
	if len(ev) != 4 {
		t.Fatalf("%d reload events, want 4: %+v", len(ev), ev)
	}
	for i, wantErr := range []bool{false, true, true, false} {
		if got := ev[i].err != nil; got != wantErr {
			t.Errorf("event %d error = %v, want error %v", i, ev[i].err, wantErr)
		}
		if ev[i].table == nil {
			t.Errorf("event %d has no table", i)
		}
	}
	if ev[1].table != first || ev[2].table != first {
		t.Error("failure events do not carry the table still in force")
	}
}

func TestSet(t *testing.T) {
	r, _ := newRegistry(t)
	tbl, err := tenant.Parse("a.yaml", []byte(goodA))
	if err != nil {
		t.Fatal(err)
	}
	r.Set(tbl)
	r.Set(nil)
	if r.Table() != tbl {
		t.Error("Set did not put the table in force, or Set(nil) replaced it")
	}
}

// TestWatchPolls drives Watch's poll step by step: good → unchanged → bad
// (reported once) → good → file gone (reported once) → back.
func TestWatchPolls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	var logs bytes.Buffer
	r, rec := newRegistry(t, tenant.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	w := r.NewWatcher(path)

	steps := []struct {
		name      string
		do        func()
		wantBurst int
		wantErrs  int // failure events
		wantOK    int // success events
	}{
		{"missing at start", func() {}, 0, 1, 0},
		{"still missing: not reported again", func() {}, 0, 0, 0},
		{"good", func() { writeFile(t, path, goodA) }, 1, 0, 1},
		{"unchanged", func() {}, 1, 0, 0},
		{"bad", func() { writeFile(t, path, bad) }, 1, 1, 0},
		{"still bad: not reported again", func() {}, 1, 0, 0},
		{"good again", func() { writeFile(t, path, goodB) }, 2, 0, 1},
		{"removed", func() { os.Remove(path) }, 2, 1, 0},
		{"restored unchanged", func() { writeFile(t, path, goodB) }, 2, 0, 0},
		{"changed", func() { writeFile(t, path, goodA) }, 1, 0, 1},
	}
	for _, s := range steps {
		s.do()
		w.Poll()
		var errs, oks int
		for _, e := range rec.take() {
			if e.err != nil {
				errs++
			} else {
				oks++
			}
		}
		burst := exportBurst(r)
		if burst == -1 {
			burst = 0
		}
		if burst != s.wantBurst || errs != s.wantErrs || oks != s.wantOK {
			t.Errorf("%s: burst %d, %d failures, %d loads; want %d, %d, %d",
				s.name, burst, errs, oks, s.wantBurst, s.wantErrs, s.wantOK)
		}
	}
	if got := strings.Count(logs.String(), "config rejected"); got != 3 {
		t.Errorf("logged %d rejections, want 3 (missing, bad, removed):\n%s", got, logs.String())
	}
	if got := strings.Count(logs.String(), "config loaded"); got != 3 {
		t.Errorf("logged %d loads, want 3:\n%s", got, logs.String())
	}
}

// TestWatchSameSizeRewrite checks the racily-clean case: a rewrite that
// keeps the size and the modification time is still seen while that time
// is recent.
func TestWatchSameSizeRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	r, _ := newRegistry(t)
	w := r.NewWatcher(path)
	mtime := time.Now().Truncate(time.Second)
	writeFile(t, path, goodA)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	w.Poll()
	if len(goodA) != len(goodB) {
		t.Fatal("fixtures must have the same size")
	}
	writeFile(t, path, goodB)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	w.Poll()
	if got, want := exportBurst(r), 2; got != want {
		t.Errorf("after a same-size, same-mtime rewrite: Export burst = %d, want %d", got, want)
	}
}

// TestWatchAfterLoad checks that Watch does not reload (or report) the
// content Load already put in force.
func TestWatchAfterLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeFile(t, path, goodA)
	r, rec := newRegistry(t)
	if err := r.Load(path); err != nil {
		t.Fatal(err)
	}
	tbl := r.Table()
	rec.take()
	r.NewWatcher(path).Poll()
	if ev := rec.take(); len(ev) != 0 || r.Table() != tbl {
		t.Errorf("Watch reloaded unchanged content: %d events", len(ev))
	}
}

// TestWatchLoop runs the real loop with a short interval: it loads the
// file, picks up a change, and returns when its context ends.
func TestWatchLoop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeFile(t, path, goodA)
	loaded := make(chan *tenant.Table, 16)
	r, err := tenant.New(tenant.WithLogger(nil), tenant.WithPollInterval(time.Millisecond),
		tenant.WithOnReload(func(_ string, tbl *tenant.Table, err error) {
			if err == nil {
				loaded <- tbl
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx, path) }()

	<-loaded
	if got, want := exportBurst(r), 1; got != want {
		t.Errorf("first load: Export burst = %d, want %d", got, want)
	}
	// Replaced, not rewritten in place: a poll racing an in-place write
	// could read a truncated file that happens to be a valid config.
	replaceFile(t, path, goodB)
	<-loaded
	if got, want := exportBurst(r), 2; got != want {
		t.Errorf("after change: Export burst = %d, want %d", got, want)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v, want context.Canceled", err)
	}
}

// TestConcurrentLookupsDuringReloads runs lookups on several goroutines
// while configs flip between two good ones and a bad one. Under -race this
// checks the swap; the values check that no reader sees a torn or empty
// table.
func TestConcurrentLookupsDuringReloads(t *testing.T) {
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "bad.yaml")}
	for i, c := range []string{goodA, goodB, bad} {
		writeFile(t, paths[i], c)
	}
	r, _ := newRegistry(t)
	if err := r.Load(paths[0]); err != nil {
		t.Fatal(err)
	}
	const readers, reloads = 4, 200
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, readers)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tn, ok := r.Table().TenantByKey("demo-key-acme-1")
				if b := tn.Rule(export).Limit.Burst; !ok || (b != 1 && b != 2) {
					errs <- "acme unknown or Export burst " + tn.Rule(export).Limit.String()
					return
				}
			}
		}()
	}
	for i := range reloads {
		_ = r.Load(paths[i%3]) // the bad one fails and must change nothing
	}
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestOnReloadSeesItsOwnTable: loads of two files race; each successful
// load's callback must receive the table that load built, not whichever
// table a racing load put in force since. The window is narrow: against the
// fault, a run catches it about once in a few thousand loads.
func TestOnReloadSeesItsOwnTable(t *testing.T) {
	dir := t.TempDir()
	paths := map[string]int{filepath.Join(dir, "a.yaml"): 1, filepath.Join(dir, "b.yaml"): 2}
	for p, burst := range paths {
		writeFile(t, p, map[int]string{1: goodA, 2: goodB}[burst])
	}
	var mismatches, reports atomic.Int64
	r, err := tenant.New(tenant.WithLogger(nil), tenant.WithOnReload(func(path string, tbl *tenant.Table, err error) {
		if err != nil {
			return
		}
		reports.Add(1)
		tn, ok := tbl.TenantByKey("demo-key-acme-1")
		if !ok || tn.Rule(export).Limit.Burst != paths[path] {
			mismatches.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for p := range paths {
		wg.Go(func() {
			for range 3000 {
				if err := r.Load(p); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := mismatches.Load(); n != 0 {
		t.Errorf("%d of %d callbacks received another load's table", n, reports.Load())
	}
}

// TestWatchSwappedWithSameStat: a config swapped for another of the same
// size and modification time is reloaded, whether a symlink is swapped
// (as Kubernetes does for a mounted ConfigMap) or the file is rewritten in
// place with its time restored (cp -p, rsync -a, tar). Otherwise a revoked
// key would stay in force.
func TestWatchSwappedWithSameStat(t *testing.T) {
	old := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	if len(goodA) != len(goodB) {
		t.Fatal("fixtures must have the same size")
	}
	mustDo := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Run("symlink swap", func(t *testing.T) {
		dir := t.TempDir()
		for name, content := range map[string]string{"..v1": goodA, "..v2": goodB} {
			mustDo(os.Mkdir(filepath.Join(dir, name), 0o755))
			p := filepath.Join(dir, name, "tenants.yaml")
			writeFile(t, p, content)
			mustDo(os.Chtimes(p, old, old))
		}
		mustDo(os.Symlink("..v1", filepath.Join(dir, "..data")))
		mustDo(os.Symlink("..data/tenants.yaml", filepath.Join(dir, "tenants.yaml")))
		r, _ := newRegistry(t)
		w := r.NewWatcher(filepath.Join(dir, "tenants.yaml"))
		w.Poll()
		if got := exportBurst(r); got != 1 {
			t.Fatalf("first load: Export burst = %d, want 1", got)
		}
		mustDo(os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
		mustDo(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
		w.Poll()
		if got := exportBurst(r); got != 2 {
			t.Errorf("after the swap: Export burst = %d, want 2", got)
		}
	})
	t.Run("rewrite with the time restored", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tenants.yaml")
		writeFile(t, path, goodA)
		mustDo(os.Chtimes(path, old, old))
		r, _ := newRegistry(t)
		w := r.NewWatcher(path)
		w.Poll()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		mustDo(err)
		_, err = f.WriteString(goodB)
		mustDo(err)
		mustDo(f.Close())
		mustDo(os.Chtimes(path, old, old))
		w.Poll()
		if runtime.GOOS == "linux" {
			if got := exportBurst(r); got != 2 {
				t.Errorf("after an in-place rewrite: Export burst = %d, want 2", got)
			}
		}
	})
}

// TestWatchDoneContext: Watch with a context already done loads nothing.
func TestWatchDoneContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeFile(t, path, goodA)
	r, rec := newRegistry(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Watch(ctx, path); !errors.Is(err, context.Canceled) {
		t.Errorf("Watch = %v, want context.Canceled", err)
	}
	if got := exportBurst(r); got != -1 || len(rec.take()) != 0 {
		t.Errorf("Watch with a done context loaded the file (Export burst %d)", got)
	}
}

// TestReloadLogAndStats checks what an operator sees of reloads: each
// applied reload's log line says what changed, a config with several
// problems logs one line per problem, and Stats counts the outcomes.
func TestReloadLogAndStats(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	var logs bytes.Buffer
	r, _ := newRegistry(t, tenant.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if st := r.Stats(); st != (tenant.Stats{}) {
		t.Errorf("Stats() before any load = %+v, want zero", st)
	}
	w := r.NewWatcher(path)
	const twoProblems = `tiers: {free: {default: {rate: -1, burst: 20}}}
tenants:
  acme: {tier: gold}
`
	const moved = `tiers:
  free: {default: {rate: 10, burst: 20}}
  pro: {default: {rate: 100, burst: 200}}
tenants:
  globex: {tier: pro}
`
	steps := []struct {
		content string
		want    []string // in the lines logged by this step
	}{
		{goodA, []string{`msg="tenant: config loaded"`, "tenants=1 tiers=1 tiers_added=free tenants_added=acme\n"}},
		{goodB, []string{"tenants=1 tiers=1 tenants_changed=acme\n"}},
		{twoProblems, []string{"problems=2\n", `problem="tenants.yaml:1: tiers.free.default.rate: must be > 0"`, `problem="tenants.yaml:3: tenants.acme.tier:`}},
		{moved, []string{"tenants=1 tiers=2 tiers_added=pro tenants_added=globex tenants_removed=acme\n"}},
	}
	var before time.Time
	for i, s := range steps {
		logs.Reset()
		before = time.Now()
		replaceFile(t, path, s.content)
		w.Poll()
		got := strings.ReplaceAll(logs.String(), path, "tenants.yaml")
		for _, want := range s.want {
			if !strings.Contains(got, want) {
				t.Errorf("step %d: log lacks %q:\n%s", i, want, got)
			}
		}
		if strings.Contains(got, `\n`) {
			t.Errorf("step %d: log holds a \\n escape:\n%s", i, got)
		}
	}
	st := r.Stats()
	if st.Applied != 3 || st.Rejected != 1 {
		t.Errorf("Stats() = %+v, want 3 applied, 1 rejected", st)
	}
	if st.LoadedAt.Before(before) || st.LoadedAt.After(time.Now()) {
		t.Errorf("Stats().LoadedAt = %v, want the last load, after %v", st.LoadedAt, before)
	}
}

func TestNewRejectsPollInterval(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		r, err := tenant.New(tenant.WithPollInterval(d))
		if r != nil || !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), "WithPollInterval") {
			t.Errorf("New(WithPollInterval(%v)) = %v, %v, want nil and ErrInvalidOption naming WithPollInterval", d, r, err)
		}
	}
}
