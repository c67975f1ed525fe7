// Package browsertest runs pages in a real headless Chromium for tests: the status page's script, its charts
// and tables (proxy's browser tests), and the screenshot in docs/ (cmd/switchyard). ./scripts/test installs
// chromium and sets SWITCHYARD_REQUIRE_BROWSER=1, so that a missing browser fails there; elsewhere a test
// without chromium is skipped. Every run is bounded by its context and its whole process group is killed when
// it ends, so that no renderer outlives the test.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// EnvRequire names the environment variable that makes a missing chromium a failure instead of a skip.
const EnvRequire = "SWITCHYARD_REQUIRE_BROWSER"

// Chromium returns the path of the chromium binary, skipping t (failing it under SWITCHYARD_REQUIRE_BROWSER)
// when there is none.
func Chromium(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv(EnvRequire) != "" {
			t.Fatal("chromium is not installed (./scripts/test installs it)")
		}
		t.Skip("chromium is not installed; ./scripts/test installs it and runs this test")
	}
	return p
}

// Options set a run. Zero fields take the defaults.
type Options struct {
	// Width and Height are the window's size in CSS pixels; default 1400 x 1000.
	Width, Height int
	// Budget is the virtual time the page runs for before the DOM is dumped or the screenshot taken: its
	// timers fire in virtual time, its fetches are real; default 5 s.
	Budget time.Duration
	// Timeout bounds the whole run in wall time; default 60 s.
	Timeout time.Duration
}

func (o *Options) defaults() {
	if o.Width <= 0 || o.Height <= 0 {
		o.Width, o.Height = 1400, 1000
	}
	if o.Budget <= 0 {
		o.Budget = 5 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
}

// DumpDOM loads url and returns the DOM as the page's script left it.
func DumpDOM(t testing.TB, url string, o Options) string {
	t.Helper()
	return string(run(t, o, "--dump-dom", url))
}

// Screenshot loads url and writes a PNG of the window to path.
func Screenshot(t testing.TB, url, path string, o Options) {
	t.Helper()
	run(t, o, "--screenshot="+path, "--hide-scrollbars", url)
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("chromium wrote no screenshot at %s: %v", path, err)
	}
}

func run(t testing.TB, o Options, args ...string) []byte {
	t.Helper()
	o.defaults()
	chromium := Chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	argv := append([]string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--user-data-dir=" + t.TempDir(), fmt.Sprintf("--window-size=%d,%d", o.Width, o.Height),
		fmt.Sprintf("--virtual-time-budget=%d", o.Budget.Milliseconds())}, args...)
	cmd := exec.CommandContext(ctx, chromium, argv...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	_ = killGroup(cmd) // its helpers (zygote, renderers) must not outlive it
	if ctx.Err() != nil {
		t.Fatalf("chromium did not finish within %v", o.Timeout)
	}
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("chromium: %v\n%s", err, stderr)
	}
	return out
}
