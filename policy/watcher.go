package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// debounce is how long the watcher waits after the last file event before it reloads: editors and Kubernetes
// produce bursts of events (write, chmod, rename; a ..data symlink swap) for one change.
const debounce = 250 * time.Millisecond

// Watcher owns the current policy and replaces it when the file changes. It satisfies proxy.Source: the request
// path calls Snapshot once per request and keeps that snapshot to its end, so a reload never changes a request
// half way.
//
// A reload (a file event, or Reload on SIGHUP) reads, decodes, validates and compiles the file, then swaps the
// snapshot atomically. An invalid file changes nothing: the old snapshot stays, every error is logged, and
// switchyard_config_reload_success drops to 0 until a valid file loads. So does a file that loosens
// authentication (turns it off, removes a key, widens a key's models, raises or removes its limits or priority)
// without acknowledging it in its reload section (auth.go); tightening always applies, and the log of every
// applied reload says what changed in authentication. Static fields (listen, admin_listen,
// redis, limits.max_body_bytes, limits.header_read_timeout) keep the values the process started with; a reload
// that changes them logs a warning that they need a restart.
//
// Concurrency: Snapshot, Config and LastError are lock-free and safe from any goroutine; reloads are serialised.
// Run's goroutine is the caller's, and it stops when its context is done.
type Watcher struct {
	path string
	reg  *routing.Registry
	m    *metrics.Gateway
	log  *slog.Logger

	shared  Shared     // shared.go: what snapshots share with the other replicas
	mu      sync.Mutex // serialises reloads
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
	w := &Watcher{path: path, reg: reg, m: m, log: log}
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
	s, err := c.Compile(reg, nil, m)
	if err != nil {
		w.failed(err)
		return nil, err
	}
	w.shared.apply(c, s, nil)
	w.cfg.Store(c)
	w.snap.Store(s)
	w.succeeded(true)
	return w, nil
}

// Snapshot returns the policy in force; never nil. It implements proxy.Source.
func (w *Watcher) Snapshot() *proxy.Snapshot { return w.snap.Load() }

// Config returns the Config in force. Its static fields (Listen, AdminListen, Redis, Limits.MaxBodyBytes,
// Limits.HeaderReadTimeout) are those the process started with, whatever later reloads asked for.
func (w *Watcher) Config() *Config { return w.cfg.Load() }

// LastError returns why the last reload failed (an Errors for an invalid file), or nil when it succeeded.
func (w *Watcher) LastError() error {
	if e := w.lastErr.Load(); e != nil {
		return *e
	}
	return nil
}

// Reload reads the file again and, if it is valid, swaps in its policy. It returns the reason when the file is
// invalid, or loosens authentication without acknowledging it (checkAuthReload, auth.go); nothing changed then.
// A file whose bytes are those in force is not compiled again. The command calls it on SIGHUP; Run calls it on
// file events.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	data, err := os.ReadFile(w.path)
	if err != nil {
		err = fmt.Errorf("policy: %w", err)
		w.failed(err)
		return err
	}
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
	s, err := c.Compile(w.reg, cur, w.m)
	if err != nil {
		w.failed(err)
		return err
	}
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

// Run follows the policy file until ctx is done, reloading it shortly (debounce) after it changes. It watches the
// file's directory, not the file: editors replace files by renaming, and Kubernetes updates a mounted ConfigMap
// by swapping the ..data symlink the file points through, after which a watch on the file itself goes silent.
// It returns nil when ctx is done, or an error if the directory cannot be watched.
func (w *Watcher) Run(ctx context.Context) error {
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

	// The file may have changed between NewWatcher and now, before the watch was in place.
	_ = w.Reload()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	base := filepath.Base(w.path)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue // noise (indexers, chmod by editors); a real change comes with another event
			}
			if n := filepath.Base(ev.Name); n == base || n == "..data" || mustAbs(ev.Name) == target {
				timer.Reset(debounce)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			w.log.Warn("config watch error", "file", w.path, "error", err.Error())
		case <-timer.C:
			_ = w.Reload() // Reload logs the outcome and keeps the old policy on failure
		}
	}
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
