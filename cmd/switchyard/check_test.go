package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const invalidDir = "../../policy/testdata/invalid"

// want returns the exact errors a broken example must produce: its "# want: LINE: path: msg" lines, prefixed with
// the file name as given.
func want(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if w, ok := strings.CutPrefix(l, "# want: "); ok {
			lines = append(lines, file+":"+w)
		}
	}
	if len(lines) == 0 {
		t.Fatalf("%s has no # want: lines", file)
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestCheckRejectsEachBrokenExample(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(invalidDir, "*.yaml"))
	if len(files) < 30 {
		t.Fatalf("found %d broken examples in %s", len(files), invalidDir)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := runCheck([]string{file}, &stdout, &stderr); code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if got, want := stderr.String(), want(t, file); got != want {
				t.Errorf("stderr:\n%s\nwant:\n%s", got, want)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout is not empty: %s", stdout.String())
			}
		})
	}
}

func TestCheckAcceptsTheShippedConfig(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runCheck([]string{"../../config.yaml"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, s := range []string{
		"../../config.yaml: valid (sha256 ",
		"us-east  use-1 use-2 use-3 use-4  (local)",
		"eu-west  euw-1 euw-2",
		"sim-model     strategy adaptive  retries 2  slo ttft 500ms itl 50ms",
		"targets use-1 use-2 use-3 use-4 euw-1 euw-2\n                hedge after 300ms budget 5%\n",
		"priority  header x-switchyard-priority  default standard  slo_factor critical 2 standard 1 sheddable 0.5\n",
		"queue     1024 per model  timeout 10s\n",
		"api keys  2: requests need Authorization: Bearer <key>\n",
		"  demo        standard   all models  6000 requests/min 6000000 tokens/min\n",
		"  demo-batch  sheddable  models sim-model  600 requests/min 1000000 tokens/min\n",
		"  max_concurrency use-4 64; the others adaptive\n",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("summary lacks %q:\n%s", s, out)
		}
	}
	// Keys by name and class only: never their text or their hashes (config.yaml's demo keys are public, but
	// check prints every file the same way).
	for _, s := range []string{"sk-switchyard-demo", "37cbfc18", "5cca7d10", "sha256:"} {
		if strings.Contains(out, s) {
			t.Errorf("summary shows a key or its hash (%q):\n%s", s, out)
		}
	}
	if n := strings.Count(out, "\n"); n > 24 {
		t.Errorf("summary is %d lines, more than a screen", n)
	}
}

func TestCheckUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{nil, 2},
		{[]string{"a.yaml", "b.yaml"}, 2},
		{[]string{"-nope", "a.yaml"}, 2},
		{[]string{"-h"}, 0},
		{[]string{filepath.Join(t.TempDir(), "missing.yaml")}, 1},
	} {
		var stdout, stderr bytes.Buffer
		if code := runCheck(tc.args, &stdout, &stderr); code != tc.code {
			t.Errorf("check %v: exit %d, want %d\n%s", tc.args, code, tc.code, stderr.String())
		}
	}
}

// TestCheckBinary runs the built binary once, for the exit codes a shell sees.
func TestCheckBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	exitCode := func(err error) int {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}
	if out, err := exec.Command(bin, "check", "../../config.yaml").CombinedOutput(); exitCode(err) != 0 {
		t.Errorf("check config.yaml: %v\n%s", err, out)
	}
	file := filepath.Join(invalidDir, "unknown_field.yaml")
	cmd := exec.Command(bin, "check", file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if code := exitCode(cmd.Run()); code != 1 || stderr.String() != want(t, file) {
		t.Errorf("check %s: exit %d, stderr:\n%s", file, code, stderr.String())
	}
	if code := exitCode(exec.Command(bin, "check").Run()); code != 2 {
		t.Errorf("check without FILE: exit %d, want 2", code)
	}
}
