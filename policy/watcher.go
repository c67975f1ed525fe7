package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// debounce is how long the policy file must stay the same, without events, before the watcher reloads it:
// editors and Kubernetes produce bursts of events (write, chmod, rename; a ..data symlink swap) for one change,
// and a file written in place is incomplete until its writer is done.
const debounce = 250 * time.Millisecond

// Watcher owns the current policy and replaces it when the file changes. It satisfies proxy.Source: the request
// path calls Snapshot once per request and keeps that snapshot to its end, so a reload never changes a request
// half way.
//
// A reload (a file that has changed and settled, or Reload on SIGHUP) reads, decodes, validates and compiles the
// file, then swaps the snapshot atomically. An invalid file changes nothing: the old snapshot stays, every error
// is logged, and switchyard_config_reload_success drops to 0 until a valid file loads. So does a file that
// loosens authentication (turns it off, removes a key, widens a key's models, raises or removes its limits or
// priority, turns on its cache opt-in) without acknowledging it in its reload section (auth.go); tightening always applies, and the log of
// every applied reload says what changed in authentication. Static fields (listen, admin_listen,
// redis, tracing, access_log, limits.max_body_bytes, limits.header_read_timeout) keep the values the process started with; a reload
// that changes them logs a warning that they need a restart.
//
// Backends given by discover (discover.go) are looked up when a policy loads and again every discover.interval,
// in a goroutine that Run owns; an answer that changes the addresses in force is compiled with the policy in
// force and swapped in the same way, without touching the reload metrics.
//
// Concurrency: Snapshot, Config and LastError are lock-free and safe from any goroutine; reloads are serialised.
// Run's goroutine is the caller's, and it stops when its context is done.
type Watcher struct {
	path     string
	debounce time.Duration // debounce, unless a test shortens it
	reg      *routing.Registry
	m        *metrics.Gateway
	log      *slog.Logger

	shared   Shared   // shared.go: what snapshots share with the other replicas
	resolver Resolver // discover.go: where backend templates' instances are looked up
	wake     chan struct{}

	mu      sync.Mutex            // serialises reloads and discovery's swaps
	disc    map[string]*discovery // by template backend name, for the policy in force (discover.go)
	snap    atomic.Pointer[proxy.Snapshot]
	cfg     atomic.Pointer[Config]
	lastErr atomic.Pointer[error]
}

var _ proxy.Source = (*Watcher)(nil)

// NewWatcher loads the policy file at path through reg (which the caller owns and must not sync elsewhere) and
// returns a Watcher serving it. m (may be nil) receives the reload metrics and the strategies' prefix-cache
// lookups; log (nil: slog.Default) receives every reload's outcome. An invalid file at start is an error: a
// gateway must not start without a policy. Call Run to follow the file's changes.
func NewWatcher(path string, reg *routing.Registry, m *metrics.Gateway, log *slog.Logger, opts ...WatcherOption) (*Watcher, error) {
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{path: path, debounce: debounce, reg: reg, m: m, log: log, resolver: net.DefaultResolver,
		wake: make(chan struct{}, 1)}
	for _, o := range opts {
		o(w)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		err = fmt.Errorf("policy: %w", err)
		w.failed(err)
		return nil, err
	}
	c, err := Parse(path, data)
	if err != nil {
		w.failed(err)
		return nil, err
	}
	disc, found := w.nextDiscovery(context.Background(), c)
	s, err := c.compile(reg, nil, m, found)
	if err != nil {
		w.failed(err)
		return nil, err
	}
	w.setDiscovery(disc)
	w.shared.apply(c, s, nil)
	w.cfg.Store(c)
	w.snap.Store(s)
	w.succeeded(true)
	return w, nil
}

// Snapshot returns the policy in force; never nil. It implements proxy.Source.
func (w *Watcher) Snapshot() *proxy.Snapshot { return w.snap.Load() }

// Config returns the Config in force. Its static fields (Listen, AdminListen, Redis, Tracing, AccessLog, Limits.MaxBodyBytes,
// Limits.HeaderReadTimeout) are those the process started with, whatever later reloads asked for.
func (w *Watcher) Config() *Config { return w.cfg.Load() }

// Path returns the policy file the watcher follows, as it was given (the status page shows it).
func (w *Watcher) Path() string { return w.path }

// LastError returns why the last reload failed (an Errors for an invalid file), or nil when it succeeded.
func (w *Watcher) LastError() error {
	if e := w.lastErr.Load(); e != nil {
		return *e
	}
	return nil
}

// Reload reads the file again and, if it is valid, swaps in its policy. It returns the reason when the file is
// invalid, or loosens authentication without acknowledging it (checkAuthReload, auth.go); nothing changed then.
// A file whose bytes are those in force is not compiled again. The command calls it on SIGHUP, an operator's
// word that the file is complete; Run reloads only a file that has stopped changing (see Run).
func (w *Watcher) Reload() error {
	data, err := os.ReadFile(w.path)
	if err != nil {
		err = fmt.Errorf("policy: %w", err)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.failed(err)
		return err
	}
	return w.reload(data)
}

// reload applies data, the bytes of the policy file.
func (w *Watcher) reload(data []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := w.snap.Load()
	if hash(data) == cur.Hash {
		w.succeeded(false)
		w.log.Debug("config unchanged", "file", w.path, "hash", short(cur.Hash))
		return nil
	}
	c, err := Parse(w.path, data)
	if err != nil {
		w.failed(err)
		return err
	}
	old := w.cfg.Load()
	changes := authChanges(old, c)
	if err := checkAuthReload(old, c, changes); err != nil {
		w.failed(err)
		return err
	}
	w.keepStatic(c, old)
	disc, found := w.nextDiscovery(context.Background(), c) // looks up only new or changed templates
	s, err := c.compile(w.reg, cur, w.m, found)
	if err != nil {
		w.failed(err)
		return err
	}
	w.setDiscovery(disc)
	w.shared.apply(c, s, cur)
	w.cfg.Store(c)
	w.snap.Store(s)
	w.succeeded(true)
	w.log.Info("config reloaded", "file", w.path, "hash", short(s.Hash), "backends", len(s.Backends), "models", len(s.Models),
		"auth", authSummary(changes))
	return nil
}

// keepStatic restores, in the new c, the fields the running servers were built with.
func (w *Watcher) keepStatic(c, old *Config) {
	warn := func(path string) {
		w.log.Warn("config field changed; it needs a restart to take effect, the old value stays", "file", w.path, "field", path)
	}
	if c.Listen != old.Listen {
		warn("listen")
		c.Listen = old.Listen
	}
	if c.AdminListen != old.AdminListen {
		warn("admin_listen")
		c.AdminListen = old.AdminListen
	}
	if c.Redis != old.Redis {
		warn("redis")
		c.Redis = old.Redis
	}
	if !reflect.DeepEqual(c.Tracing, old.Tracing) {
		warn("tracing")
		c.Tracing = old.Tracing
	}
	if !reflect.DeepEqual(c.AccessLog, old.AccessLog) {
		warn("access_log")
		c.AccessLog = old.AccessLog
	}
	if c.Limits.MaxBodyBytes != old.Limits.MaxBodyBytes {
		warn("limits.max_body_bytes")
		c.Limits.MaxBodyBytes = old.Limits.MaxBodyBytes
	}
	if c.Limits.HeaderReadTimeout != old.Limits.HeaderReadTimeout {
		warn("limits.header_read_timeout")
		c.Limits.HeaderReadTimeout = old.Limits.HeaderReadTimeout
	}
}

// succeeded records that the file on disk is the policy in force; loaded says it was (re)loaded just now.
func (w *Watcher) succeeded(loaded bool) {
	w.lastErr.Store(nil)
	if w.m == nil {
		return
	}
	w.m.ConfigReloadSuccess.Set(1)
	if loaded {
		w.m.ConfigReloadTime.Set(float64(time.Now().UnixNano()) / 1e9)
	}
}

func (w *Watcher) failed(err error) {
	w.lastErr.Store(&err)
	if w.m != nil {
		w.m.ConfigReloadSuccess.Set(0)
	}
	var es Errors
	if errors.As(err, &es) {
		for _, e := range es {
			w.log.Error("config error", "error", e.Error())
		}
		w.log.Error("config load failed; the previous policy stays in force", "file", w.path, "errors", len(es))
		return
	}
	w.log.Error("config load failed; the previous policy stays in force", "file", w.path, "error", err.Error())
}

// Run follows the policy file until ctx is done, reloading it once it has changed and then stopped changing. It
// watches the file's directory, not the file: editors replace files by renaming, and Kubernetes updates a mounted
// ConfigMap by swapping the ..data symlink the file points through, after which a watch on the file itself goes
// silent. It returns nil when ctx is done, or an error if the directory cannot be watched.
//
// A file is applied only when it is the same (size, modification time and SHA-256 of its bytes) at both ends of
// a debounce window without events, and then only if it is valid: a file written in place is read half way
// through now and then, and a prefix of a policy may well be valid. Writing a temporary file and renaming it
// over the policy (what editors, config management and Kubernetes do) is the way to change it; docs/config.md
// says so.
//
// Run also re-resolves the policy's discovered backends (discover.go) in a goroutine of its own, which it stops
// and waits for before it returns.
func (w *Watcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	discovering := make(chan struct{})
	go func() {
		defer close(discovering)
		w.discover(ctx)
	}()
	defer func() {
		cancel()
		<-discovering
	}()
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policy: watch %s: %w", w.path, err)
	}
	defer fw.Close()
	dir := filepath.Dir(w.path)
	if err := fw.Add(dir); err != nil {
		return fmt.Errorf("policy: watch %s: %w", dir, err)
	}
	// A file that is a symlink into another directory (not Kubernetes' ..data, which lives beside it) changes
	// there: watch that directory too.
	target := ""
	if t, err := filepath.EvalSymlinks(w.path); err == nil {
		if abs, err := filepath.Abs(t); err == nil {
			target = abs
		}
		if td := filepath.Dir(target); target != "" && !inDir(td, mustAbs(dir)) {
			if err := fw.Add(td); err != nil {
				w.log.Warn("cannot watch the config file's symlink target directory", "dir", td, "error", err.Error())
			}
		}
	}
	return w.follow(ctx, fw.Events, fw.Errors, target)
}

// follow is Run's loop over the file's events (target: the absolute path a symlinked policy file resolves to).
// Time is the package time's, so that tests run it in a testing/synctest bubble with events of their own.
func (w *Watcher) follow(ctx context.Context, events <-chan fsnotify.Event, errs <-chan error, target string) error {
	// The file may have changed between NewWatcher and now, before the watch was in place: look at it as if an
	// event had come.
	first := w.observe()
	pending := &first // the observation a window started with; nil when no change is pending
	timer := time.NewTimer(w.debounce)
	defer timer.Stop()
	base := filepath.Base(w.path)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue // noise (indexers, chmod by editors); a real change comes with another event
			}
			if n := filepath.Base(ev.Name); n == base || n == "..data" || target != "" && mustAbs(ev.Name) == target {
				if pending == nil {
					o := w.observe()
					pending = &o
				}
				timer.Reset(w.debounce)
			}
		case err, ok := <-errs:
			if !ok {
				return nil
			}
			w.log.Warn("config watch error", "file", w.path, "error", err.Error())
		case <-timer.C:
			o := w.observe()
			if pending == nil || !o.same(*pending) {
				// Still changing: a new window starts from what the file is now.
				w.log.Debug("config file still changing; waiting for it to settle", "file", w.path, "debounce", w.debounce)
				pending = &o
				timer.Reset(w.debounce)
				continue
			}
			pending = nil
			if o.err != nil {
				w.mu.Lock()
				w.failed(o.err)
				w.mu.Unlock()
				continue
			}
			_ = w.reload(o.data) // reload logs the outcome and keeps the old policy on failure
		}
	}
}

// observation is what the watcher saw of the policy file at one moment.
type observation struct {
	size  int64
	mtime time.Time
	hash  string
	data  []byte
	err   error // the file could not be read; the other fields are zero
}

// observe stats and reads the policy file (through symlinks).
func (w *Watcher) observe() observation {
	fi, err := os.Stat(w.path)
	if err != nil {
		return observation{err: fmt.Errorf("policy: %w", err)}
	}
	data, err := os.ReadFile(w.path)
	if err != nil {
		return observation{err: fmt.Errorf("policy: %w", err)}
	}
	return observation{size: fi.Size(), mtime: fi.ModTime(), hash: hash(data), data: data}
}

// same reports whether o and p saw the same file: same size, modification time and bytes, or the same error.
func (o observation) same(p observation) bool {
	if o.err != nil || p.err != nil {
		return o.err != nil && p.err != nil && o.err.Error() == p.err.Error()
	}
	return o.size == p.size && o.mtime.Equal(p.mtime) && o.hash == p.hash && int64(len(o.data)) == o.size
}

// inDir reports whether path is dir or lies below it.
func inDir(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, string(filepath.Separator))+string(filepath.Separator))
}

func mustAbs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// short abbreviates a hash for logs.
func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
