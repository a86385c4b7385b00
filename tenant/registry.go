package tenant

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-go/floodgate"
)

// A Registry holds the Table in force and replaces it when the config
// changes. Readers call [Registry.Table] on every request: one atomic load.
// A config that fails to load never replaces the table in force.
//
// Before the first successful [Registry.Load] or [Registry.Set], the table in
// force treats every caller as anonymous and admits no one: a server whose
// config never loaded fails closed.
//
// A Registry is safe for concurrent use. It starts no goroutine: polling
// happens in [Registry.Watch], on the caller's goroutine. The zero Registry
// is not usable; call [New].
type Registry struct {
	table atomic.Pointer[Table]
	opts  options

	// mu serializes reloads, so that a slow parse of older content cannot
	// replace a table built from newer content, and guards loaded.
	mu     sync.Mutex
	loaded source

	// For Stats: outcomes of config loads, and when the table in force
	// was put in force (Unix ns, 0 for the empty table).
	applied, rejected atomic.Uint64
	loadedAt          atomic.Int64
}

// Stats are a Registry's counts of config loads since it was made, for
// metrics (promfloodgate.WithRegistry exports them).
type Stats struct {
	// Applied counts tables put in force, by Load, Watch or Set. Loading
	// the content already in force is not counted.
	Applied uint64
	// Rejected counts load attempts that left the table in force: an
	// unreadable file or an invalid config, as reported to WithOnReload.
	// Watch reports (and counts) one problem once, not once per poll.
	Rejected uint64
	// LoadedAt is when the table in force was put in force, or the zero
	// Time while the empty table of New is.
	LoadedAt time.Time
}

// Stats returns the Registry's load counts. Each is read atomically;
// together they are not a consistent snapshot.
func (r *Registry) Stats() Stats {
	s := Stats{Applied: r.applied.Load(), Rejected: r.rejected.Load()}
	if ns := r.loadedAt.Load(); ns != 0 {
		s.LoadedAt = time.Unix(0, ns)
	}
	return s
}

// source identifies the file content a table was built from.
type source struct {
	path string
	sum  [32]byte
}

// An Option configures a Registry. [New] applies the options in order to a
// copy of the defaults, skipping nil ones, then validates the result (the
// convention of [floodgate.ErrInvalidOption]).
type Option func(*options)

type options struct {
	interval time.Duration
	logger   *slog.Logger
	onReload func(path string, t *Table, err error)
}

// DefaultPollInterval is how often Watch checks the file unless
// [WithPollInterval] says otherwise.
const DefaultPollInterval = 2 * time.Second

// WithPollInterval sets how often [Registry.Watch] checks the file; it must
// be > 0. A repeated call replaces the earlier value.
func WithPollInterval(d time.Duration) Option {
	return func(o *options) { o.interval = d }
}

// WithLogger sets where [Registry.Watch] logs reloads (Info) and rejected
// configs (Error); the default is slog.Default(), and nil turns logging
// off. A repeated call replaces the earlier logger.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithOnReload sets a function called after every reload attempt, by
// [Registry.Load] and [Registry.Watch]: with the new table and a nil error
// on success, or with the table still in force and the error on failure.
// It runs on the reloading goroutine, after the registry's lock is
// released; it must not block for long. A repeated call replaces the
// earlier function; nil removes it.
func WithOnReload(f func(path string, t *Table, err error)) Option {
	return func(o *options) { o.onReload = f }
}

// New returns a Registry holding the empty table (see [Registry]). It
// returns an error wrapping [floodgate.ErrInvalidOption] for an invalid
// option.
func New(opts ...Option) (*Registry, error) {
	o := options{interval: DefaultPollInterval, logger: slog.Default()}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.interval <= 0 {
		return nil, fmt.Errorf("%w: tenant: WithPollInterval = %v, want > 0", floodgate.ErrInvalidOption, o.interval)
	}
	r := &Registry{opts: o}
	r.table.Store(emptyTable)
	return r, nil
}

// Table returns the table in force. It never returns nil.
func (r *Registry) Table() *Table { return r.table.Load() }

// Set puts t in force, for tables built with [Compile]. A nil t is ignored.
func (r *Registry) Set(t *Table) {
	if t == nil {
		return
	}
	r.mu.Lock()
	r.table.Store(t)
	r.loaded = source{}
	r.loadedAt.Store(time.Now().UnixNano())
	r.mu.Unlock()
	r.applied.Add(1)
}

// Load reads, parses and compiles the config at path and puts it in force.
// On error the table in force stays and the error says why (a
// [*ConfigError] for an invalid config). The file's name in messages is
// path as given. Loading the content already in force from the same path
// does nothing and reports nothing.
func (r *Registry) Load(path string) error {
	data, err := readConfig(path)
	if err != nil {
		r.report(path, r.Table(), err)
		return err
	}
	_, err = r.apply(path, data, sha256.Sum256(data))
	return err
}

// applied is the outcome of a load that put a table in force.
type applied struct {
	t  *Table
	ch changeSet // from the table it replaced
}

// apply parses data and puts it in force unless it is what is in force
// already; it reports the outcome. It returns a nil *applied when nothing
// was put in force.
func (r *Registry) apply(path string, data []byte, sum [32]byte) (*applied, error) {
	r.mu.Lock()
	if r.loaded == (source{path, sum}) {
		r.mu.Unlock()
		return nil, nil
	}
	var a *applied
	t, err := Parse(path, data)
	if err == nil {
		a = &applied{t: t, ch: changes(r.table.Load(), t)}
		r.table.Store(t)
		r.loaded = source{path, sum}
		r.loadedAt.Store(time.Now().UnixNano())
	} else {
		t = r.table.Load()
	}
	r.mu.Unlock()
	// t, not Table(): a reload racing this one may have put another
	// table in force since, and the callback must see the table this
	// attempt left in force.
	r.report(path, t, err)
	return a, err
}

func (r *Registry) report(path string, t *Table, err error) {
	if err != nil {
		r.rejected.Add(1)
	} else {
		r.applied.Add(1)
	}
	if f := r.opts.onReload; f != nil {
		f(path, t, err)
	}
}

// readConfig reads a config file, refusing one too large to be a config
// before reading it all.
func readConfig(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	if len(data) > MaxConfigSize {
		return nil, errors.New("tenant: " + path + ": config is larger than " + strconv.Itoa(MaxConfigSize) + " bytes")
	}
	return data, nil
}

// Watch polls the config at path and reloads it whenever its content
// changes, until ctx is done; it returns ctx.Err(). It checks at once, then
// every poll interval ([WithPollInterval]).
//
// Each poll stats the file and reads it only when it is another file than
// at the last read (a symlink or rename swap), or its size, modification
// time or (on Linux) change time differ, or its modification time was
// within the file system's timestamp granularity of the last read, where a
// same-size rewrite could hide behind it; the content's SHA-256 then
// decides whether anything changed. Content that fails to load is reported once (through
// [WithOnReload] and the logger) and leaves the table in force; the next
// change is tried again. Writers should replace the file atomically
// (write a temporary file, then rename it over the config, as Kubernetes
// does for mounted ConfigMaps): a half-written file that happens to be
// valid would otherwise be loaded.
func (r *Registry) Watch(ctx context.Context, path string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w := r.watcher(path)
	w.poll()
	tick := time.NewTicker(r.opts.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			w.poll()
		}
	}
}

// racyWindow bounds how close to the last read a modification time must be
// for Watch to distrust an unchanged stat (the "racily clean" problem git's
// index has): coarse file system clocks can let a rewrite made just after
// the read keep the size and time the read saw.
const racyWindow = 3 * time.Second

// watcher is one Watch loop's memory of the file.
type watcher struct {
	r    *Registry
	path string
	// fi is the file as stat saw it at the last read, and readAt when
	// that read was; fi is nil before the first.
	fi     os.FileInfo
	readAt time.Time
	// tried is the last content tried, good or bad, so that a bad file is
	// reported once rather than every poll.
	tried   [32]byte
	lastErr string
}

func (r *Registry) watcher(path string) *watcher {
	w := &watcher{r: r, path: path}
	r.mu.Lock()
	if r.loaded.path == path {
		w.tried = r.loaded.sum
	}
	r.mu.Unlock()
	return w
}

// poll is one check of the file: the step Watch repeats.
func (w *watcher) poll() {
	fi, err := os.Stat(w.path)
	if err != nil {
		w.fi = nil
		w.fail(fmt.Errorf("tenant: %w", err))
		return
	}
	if !fi.Mode().IsRegular() {
		w.fail(errors.New("tenant: " + w.path + ": not a regular file"))
		return
	}
	if w.unchanged(fi) {
		return
	}
	readAt := time.Now()
	data, err := readConfig(w.path)
	if err != nil {
		w.fail(err)
		return
	}
	w.fi, w.readAt = fi, readAt
	// The file is readable again: its next failure is news.
	w.lastErr = ""
	sum := sha256.Sum256(data)
	if sum == w.tried {
		return
	}
	w.tried = sum
	a, err := w.r.apply(w.path, data, sum)
	if err != nil {
		w.fail(err)
		return
	}
	if l := w.r.opts.logger; a != nil && l != nil {
		attrs := []any{"path", w.path, "tenants", len(a.t.tenants), "tiers", len(a.t.sums.tiers)}
		l.Info("tenant: config loaded", append(attrs, a.ch.logAttrs()...)...)
	}
}

// unchanged reports whether fi shows the file read last, not rewritten
// since: the same file (a swapped symlink or a file renamed over the path
// is another), with the same size, modification and change times, and
// modified well before the last read.
func (w *watcher) unchanged(fi os.FileInfo) bool {
	return w.fi != nil && os.SameFile(w.fi, fi) && fi.Size() == w.fi.Size() &&
		fi.ModTime().Equal(w.fi.ModTime()) && changeTime(fi).Equal(changeTime(w.fi)) &&
		fi.ModTime().Before(w.readAt.Add(-racyWindow))
}

// maxProblemsLogged bounds the log records of one rejected config.
const maxProblemsLogged = 50

// logRejected logs a rejected config. A config with several problems is
// logged as a summary and then one record per problem: a handler quotes a
// value with line breaks, and the problems would come out as one line
// joined by "\n" escapes.
func logRejected(l *slog.Logger, path string, err error) {
	var ce *ConfigError
	const msg = "tenant: config rejected; the previous table stays in force"
	if !errors.As(err, &ce) || len(ce.Errors) < 2 {
		l.Error(msg, "path", path, "err", err)
		return
	}
	l.Error(msg, "path", path, "problems", len(ce.Errors))
	for i, fe := range ce.Errors {
		if i == maxProblemsLogged {
			l.Error("tenant: config problem", "path", path, "problem", strconv.Itoa(len(ce.Errors)-i)+" more problems not logged")
			break
		}
		l.Error("tenant: config problem", "path", path, "problem", fe.Error())
	}
}

// fail reports a problem unless it is the one reported last.
func (w *watcher) fail(err error) {
	msg := err.Error()
	if msg == w.lastErr {
		return
	}
	w.lastErr = msg
	if l := w.r.opts.logger; l != nil {
		logRejected(l, w.path, err)
	}
	// apply reports its own outcome; other failures are reported here.
	var ce *ConfigError
	if !errors.As(err, &ce) {
		w.r.report(w.path, w.r.Table(), err)
	}
}
