package main

import (
	"bytes"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionLine(t *testing.T) {
	const tail = " go1.26.8 linux/amd64"
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"},
		{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		name         string
		bi           *debug.BuildInfo
		ver, rev, at string
		want         string
	}{
		{"no build info", nil, "", "", "", "switchyard (devel)" + tail},
		{"devel without vcs", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "", "", "", "switchyard (devel)" + tail},
		{"vcs settings", vcs, "", "", "", "switchyard v1.2.3 (commit abc123, 2026-12-01T10:00:00Z, modified)" + tail},
		{"clean checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"},
		}}, "", "", "", "switchyard (devel) (commit abc123)" + tail},
		{"link-time values win", vcs, "v2.0.0", "def456", "2026-12-02T00:00:00Z", "switchyard v2.0.0 (commit def456, 2026-12-02T00:00:00Z, modified)" + tail},
		{"link-time commit only", nil, "", "def456", "", "switchyard (devel) (commit def456)" + tail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionLine(tc.bi, tc.ver, tc.rev, tc.at, "go1.26.8", "linux/amd64"); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, stderr.String())
		}
		want := " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
		if out := stdout.String(); !strings.HasPrefix(out, "switchyard ") || !strings.HasSuffix(out, want) {
			t.Errorf("%v: %q", args, out)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"version", "extra"}, &stdout, &stderr); code != 2 {
		t.Errorf("version extra: exit %d, want 2", code)
	}
}

// TestVersionBinary runs the binary built the way the Dockerfile builds it (commit and version given at link
// time, testLDFlags): the line carries them, the Go version and the platform.
func TestVersionBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t) // with testLDFlags
	want := "switchyard v9.9.9-test (commit 0123abcd, 2026-12-01T10:00:00Z) " + runtime.Version() + " " +
		runtime.GOOS + "/" + runtime.GOARCH + "\n"
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		if string(out) != want {
			t.Errorf("%s:\ngot  %q\nwant %q", arg, out, want)
		}
	}
}
