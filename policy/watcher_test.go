package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// policyText returns a valid policy with the named backends (each serving m) and m's strategy.
func policyText(strategy string, backends ...string) string {
	var b strings.Builder
	b.WriteString("auth: none\nbackends:\n")
	for i, name := range backends {
		fmt.Fprintf(&b, "  - {name: %s, url: 'http://127.0.0.1:%d', models: [m]}\n", name, 7001+i)
	}
	fmt.Fprintf(&b, "models:\n  - {name: m, strategy: %s}\n", strategy)
	return b.String()
}

// writeFile replaces path atomically, as editors and config management tools do.
func writeFile(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a log sink the watcher's goroutine writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type fixture struct {
	path string
	reg  *routing.Registry
	m    *metrics.Gateway
	logs *syncBuffer
	w    *Watcher
}

// newFixture writes text to a policy file in a fresh directory and starts a Watcher on it; with run, Run follows
// the file until the test ends.
func newFixture(t *testing.T, text string, run bool) *fixture {
	t.Helper()
	f := &fixture{path: filepath.Join(t.TempDir(), "config.yaml"), reg: routing.NewRegistry(),
		m: metrics.New(prometheus.NewRegistry()), logs: &syncBuffer{}}
	writeFile(t, f.path, text)
	var err error
	f.w, err = NewWatcher(f.path, f.reg, f.m, slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	if run {
		f.run(t, f.w)
	}
	return f
}

// run runs w.Run until the test ends, and checks that it stops when told to.
func (f *fixture) run(t *testing.T, w *Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
	// fsnotify's watch is in place once Run has added it; give the goroutine a moment to get there.
	time.Sleep(100 * time.Millisecond)
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// waitFor polls cond for up to 2 s (the reload promise), failing the test if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 2s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func backendNamed(s *proxy.Snapshot, name string) *routing.Backend {
	for _, b := range s.Backends {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

func TestWatcherSwapsOnValidEdit(t *testing.T) {
	f := newFixture(t, policyText("round_robin", "a", "b"), true)
	old := f.w.Snapshot()
	if got := gauge(t, f.m.ConfigReloadSuccess); got != 1 {
		t.Fatalf("reload success after the first load = %v, want 1", got)
	}
	a := backendNamed(old, "a")
	a.Begin(10) // live state that must survive the reload

	writeFile(t, f.path, policyText("random", "a", "c"))
	waitFor(t, "new snapshot", func() bool { return f.w.Snapshot() != old })
	s := f.w.Snapshot()
	if s.Models["m"].StrategyName != "random" {
		t.Errorf("strategy = %s, want random", s.Models["m"].StrategyName)
	}
	if backendNamed(s, "a") != a || a.Inflight() != 1 {
		t.Error("backend a, which stays, is not the same *routing.Backend with its state")
	}
	if backendNamed(s, "b") != nil || backendNamed(s, "c") == nil {
		t.Errorf("backends = %v, want a and c", s.Backends)
	}
	// A request that loaded the old snapshot keeps seeing it whole.
	if old.Models["m"].StrategyName != "round_robin" || backendNamed(old, "b") == nil {
		t.Error("the old snapshot changed")
	}
	if got := gauge(t, f.m.ConfigReloadSuccess); got != 1 {
		t.Errorf("reload success = %v, want 1", got)
	}
	if ts := gauge(t, f.m.ConfigReloadTime); ts < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("reload timestamp = %v, want about now", ts)
	}
	if s.Hash == old.Hash || !s.Loaded.After(old.Loaded) {
		t.Error("hash and load time do not identify the new snapshot")
	}
}

func TestWatcherKeepsOldSnapshotOnInvalidEdit(t *testing.T) {
	f := newFixture(t, policyText("round_robin", "a", "b"), true)
	old := f.w.Snapshot()

	writeFile(t, f.path, policyText("round_robin", "a", "b")+"  - {name: n, strategy: fastest}\n")
	waitFor(t, "reload failure", func() bool { return f.w.LastError() != nil })
	if f.w.Snapshot() != old {
		t.Fatal("an invalid file replaced the snapshot")
	}
	if got := gauge(t, f.m.ConfigReloadSuccess); got != 0 {
		t.Errorf("reload success = %v, want 0", got)
	}
	var es Errors
	if !errors.As(f.w.LastError(), &es) {
		t.Fatalf("LastError = %v, want Errors", f.w.LastError())
	}
	want := f.path + ":7: models[1].strategy: unknown strategy" // slog quotes the rest
	if !strings.Contains(f.logs.String(), want) {
		t.Errorf("the log does not carry the error %q:\n%s", want, f.logs.String())
	}

	writeFile(t, f.path, policyText("least_request", "a", "b"))
	waitFor(t, "recovery", func() bool { return f.w.Snapshot() != old })
	if got := gauge(t, f.m.ConfigReloadSuccess); got != 1 || f.w.LastError() != nil {
		t.Errorf("after a valid edit: reload success = %v, LastError = %v", got, f.w.LastError())
	}
	if backendNamed(f.w.Snapshot(), "a") != backendNamed(old, "a") {
		t.Error("backend a lost its state across the failed and the good reload")
	}
}

func TestWatcherFollowsKubernetesSymlinkSwap(t *testing.T) {
	// A mounted ConfigMap: config.yaml -> ..data/config.yaml, ..data -> ..<timestamp>. An update writes a new
	// timestamped directory, points a temporary symlink at it, renames that over ..data and removes the old one.
	dir := t.TempDir()
	version := func(name, text string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "config.yaml"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	version("..2024_01_01_00_00_00.1", policyText("round_robin", "a"))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("..2024_01_01_00_00_00.1", filepath.Join(dir, "..data")))
	must(os.Symlink("..data/config.yaml", filepath.Join(dir, "config.yaml")))

	f := &fixture{path: filepath.Join(dir, "config.yaml"), reg: routing.NewRegistry(), m: metrics.New(prometheus.NewRegistry()), logs: &syncBuffer{}}
	w, err := NewWatcher(f.path, f.reg, f.m, slog.New(slog.NewTextHandler(f.logs, nil)))
	must(err)
	f.run(t, w)
	old := w.Snapshot()

	version("..2024_01_01_00_01_00.2", policyText("random", "a", "b"))
	must(os.Symlink("..2024_01_01_00_01_00.2", filepath.Join(dir, "..data_tmp")))
	must(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	must(os.RemoveAll(filepath.Join(dir, "..2024_01_01_00_00_00.1")))

	waitFor(t, "snapshot after the ..data swap", func() bool { return w.Snapshot() != old })
	s := w.Snapshot()
	if s.Models["m"].StrategyName != "random" || len(s.Backends) != 2 {
		t.Fatalf("after the swap: strategy %s, %d backends", s.Models["m"].StrategyName, len(s.Backends))
	}
	if backendNamed(s, "a") != backendNamed(old, "a") {
		t.Error("backend a is a new *routing.Backend")
	}
}

func TestReloadWithoutFileEvent(t *testing.T) {
	f := newFixture(t, policyText("round_robin", "a"), false) // no Run: only Reload (SIGHUP) reloads
	old := f.w.Snapshot()
	loaded := gauge(t, f.m.ConfigReloadTime)
	time.Sleep(10 * time.Millisecond)
	if err := f.w.Reload(); err != nil || f.w.Snapshot() != old {
		t.Fatalf("reloading the same bytes: err %v, snapshot replaced %v", err, f.w.Snapshot() != old)
	}
	if got := gauge(t, f.m.ConfigReloadTime); got != loaded {
		t.Errorf("reloading the same bytes moved the load timestamp from %v to %v", loaded, got)
	}
	writeFile(t, f.path, policyText("random", "a", "b"))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	if s := f.w.Snapshot(); s == old || s.Models["m"].StrategyName != "random" {
		t.Fatal("Reload did not swap in the new policy")
	}
	writeFile(t, f.path, "backends: [")
	if err := f.w.Reload(); err == nil {
		t.Fatal("Reload accepted a broken file")
	}
	if got := gauge(t, f.m.ConfigReloadSuccess); got != 0 {
		t.Errorf("reload success = %v, want 0", got)
	}
	os.Remove(f.path)
	if err := f.w.Reload(); err == nil || f.w.Snapshot().Models["m"].StrategyName != "random" {
		t.Fatalf("a missing file: err %v; the policy must stay", err)
	}
}

func TestRunPicksUpAnEditMadeBeforeIt(t *testing.T) {
	f := newFixture(t, policyText("round_robin", "a"), false)
	old := f.w.Snapshot()
	writeFile(t, f.path, policyText("random", "a"))
	f.run(t, f.w)
	waitFor(t, "the edit made before Run", func() bool { return f.w.Snapshot() != old })
}

func TestStaticFieldsNeedARestart(t *testing.T) {
	text := "listen: 127.0.0.1:18080\nlimits: {max_body_bytes: 1MiB}\n" + policyText("round_robin", "a")
	f := newFixture(t, text, false)
	text = strings.NewReplacer("18080", "18081", "1MiB", "2MiB", "round_robin", "random").Replace(text)
	writeFile(t, f.path, text)
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	c := f.w.Config()
	if c.Listen != "127.0.0.1:18080" || c.Limits.MaxBodyBytes != 1<<20 {
		t.Errorf("static fields changed without a restart: listen %s, max_body_bytes %d", c.Listen, c.Limits.MaxBodyBytes)
	}
	if f.w.Snapshot().Models["m"].StrategyName != "random" {
		t.Error("the dynamic part of the edit was not applied")
	}
	for _, field := range []string{"field=listen", "field=limits.max_body_bytes"} {
		if !strings.Contains(f.logs.String(), field) || !strings.Contains(f.logs.String(), "needs a restart") {
			t.Errorf("no restart warning for %s:\n%s", field, f.logs.String())
		}
	}
}

func TestNewWatcherRefusesAnInvalidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, "models: []\n")
	m := metrics.New(prometheus.NewRegistry())
	if _, err := NewWatcher(path, routing.NewRegistry(), m, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("NewWatcher accepted an invalid file")
	}
	if got := gauge(t, m.ConfigReloadSuccess); got != 0 {
		t.Errorf("reload success = %v, want 0", got)
	}
}

// follower runs w.follow, Run's loop, in the test's synctest bubble on events the test sends (touch), so that the
// debounce runs on the bubble's clock. It stops when the returned stop is called.
func (f *fixture) follower(t *testing.T) (touch, stop func()) {
	events := make(chan fsnotify.Event)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.w.follow(ctx, events, nil, "") }()
	touch = func() { events <- fsnotify.Event{Name: f.path, Op: fsnotify.Write} }
	stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("follow: %v", err)
		}
	}
	return touch, stop
}

// inPlace opens path for writing over its content, as a tool that does not rename does.
func inPlace(t *testing.T, path string) *os.File {
	t.Helper()
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func write(t *testing.T, out *os.File, text string) {
	t.Helper()
	if _, err := out.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

func TestFollowAppliesASettledFileOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, policyText("round_robin", "a"), false)
		touch, stop := f.follower(t)
		defer stop()
		synctest.Wait()
		old := f.w.Snapshot()

		// Written in place in three pieces, each followed by its event, 100 ms apart: one window that ends
		// debounce after the last event.
		next := policyText("random", "a", "b")
		out := inPlace(t, f.path)
		defer out.Close()
		for _, piece := range []string{next[:20], next[20:60], next[60:]} {
			write(t, out, piece)
			touch()
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(debounce - 100*time.Millisecond - time.Millisecond)
		synctest.Wait()
		if f.w.Snapshot() != old {
			t.Fatal("reloaded before the file had been quiet for the debounce")
		}
		time.Sleep(2 * debounce)
		synctest.Wait()
		if s := f.w.Snapshot(); s.Hash != hash([]byte(next)) {
			t.Fatalf("the settled file is not in force (strategy %s)", s.Models["m"].StrategyName)
		}
		if n := strings.Count(f.logs.String(), "config reloaded"); n != 1 {
			t.Errorf("%d reloads, want 1:\n%s", n, f.logs.String())
		}
		if strings.Contains(f.logs.String(), "config error") {
			t.Errorf("a piece of the file was parsed:\n%s", f.logs.String())
		}
	})
}

func TestFollowWaitsForTheFileToStopChanging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, policyText("round_robin", "a"), false)
		touch, stop := f.follower(t)
		defer stop()
		synctest.Wait()

		// The first piece is a valid policy by itself; the rest arrives without an event of its own (events are
		// coalesced, or lost): the file must still be seen to change.
		first := policyText("random", "a")
		rest := "  - {name: m2, targets: [{backend: a, model: m}]}\n"
		out := inPlace(t, f.path)
		defer out.Close()
		write(t, out, first)
		touch()
		time.Sleep(debounce / 2)
		write(t, out, rest)
		time.Sleep(debounce / 2)
		synctest.Wait() // the window has ended: the file is not what it was when it started
		if f.w.Snapshot().Models["m"].StrategyName != "round_robin" {
			t.Fatal("the first piece was applied: the file changed during the window")
		}
		time.Sleep(debounce)
		synctest.Wait()
		if s := f.w.Snapshot(); s.Hash != hash([]byte(first+rest)) || s.Models["m2"] == nil {
			t.Fatal("the whole file is not in force after a quiet window")
		}
	})
}

func TestFollowReportsAMissingFileOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, policyText("round_robin", "a"), false)
		touch, stop := f.follower(t)
		defer stop()
		synctest.Wait()
		old := f.w.Snapshot()
		os.Remove(f.path)
		touch()
		time.Sleep(10 * debounce)
		synctest.Wait()
		if f.w.Snapshot() != old || gauge(t, f.m.ConfigReloadSuccess) != 0 || f.w.LastError() == nil {
			t.Fatal("a removed file: want the old policy, reload success 0 and an error")
		}
		if n := strings.Count(f.logs.String(), "config load failed"); n != 1 {
			t.Errorf("%d failures logged, want 1 (no polling while nothing happens):\n%s", n, f.logs.String())
		}
		writeFile(t, f.path, policyText("random", "a"))
		touch()
		time.Sleep(2 * debounce)
		synctest.Wait()
		if f.w.Snapshot().Models["m"].StrategyName != "random" || gauge(t, f.m.ConfigReloadSuccess) != 1 {
			t.Fatal("the file written again is not in force")
		}
	})
}

// TestHalfWrittenConfigNeverDropsKeys writes the shipped config.yaml (with an edit, so that the end is a new
// policy) over itself in place, each line in two pieces, each piece with its event; the pauses after them
// alternate between shorter and longer than the debounce, so that the watcher settles on a prefix cut at every
// line, in the middle of a line or at its end. Authentication never turns off, no prefix that drops a key is
// applied, and the whole file is in force at the end.
func TestHalfWrittenConfigNeverDropsKeys(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	next := strings.Replace(string(data), "queue_size: 1024", "queue_size: 512", 1)
	if next == string(data) {
		t.Fatal("config.yaml has no queue_size: 1024 to edit")
	}
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, string(data), false)
		want := keyNamesOf(f.w.Config())
		touch, stop := f.follower(t)
		defer stop()
		synctest.Wait()

		out := inPlace(t, f.path)
		defer out.Close()
		short, long := debounce/5, 2*debounce+time.Millisecond // long: a window that settles, and its check
		written, settled := 0, 0
		for i, line := range strings.SplitAfter(next, "\n") {
			half := len(line) / 2
			for j, piece := range []string{line[:half], line[half:]} {
				write(t, out, piece)
				written += len(piece)
				touch()
				pause := short
				if (i+j)%2 == 1 {
					pause = long
					settled++
				}
				time.Sleep(pause)
				synctest.Wait()
				c := f.w.Config()
				if c.Auth != AuthAPIKeys || !slices.Equal(keyNamesOf(c), want) {
					t.Fatalf("after %d of %d bytes: auth %s, keys %v; want %s, %v", written, len(next), c.Auth, keyNamesOf(c), AuthAPIKeys, want)
				}
			}
		}
		time.Sleep(3 * debounce)
		synctest.Wait()
		if f.w.Snapshot().Hash != hash([]byte(next)) || f.w.Config().Limits.QueueSize != 512 {
			t.Fatalf("the whole file is not in force at the end:\n%s", f.logs.String())
		}
		t.Logf("%d prefixes settled before the file was whole; %d reloads applied, %d refused or invalid", settled,
			strings.Count(f.logs.String(), "config reloaded"), strings.Count(f.logs.String(), "config load failed"))
	})
}
