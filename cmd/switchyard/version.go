package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set at link time by builds that know better than the build info (the Dockerfile, whose context may have no
// usable .git):
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD) -X main.commitTime=..."
//
// Empty: what runtime/debug.ReadBuildInfo says (the module version, and the vcs.* settings of a build with
// -buildvcs=true in a checkout).
var (
	version    string
	commit     string
	commitTime string
)

// runVersion implements "switchyard version" (also --version and -version).
func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "switchyard version: unexpected argument %q\n", args[0])
		return 2
	}
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionLine(bi, version, commit, commitTime, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH))
	return 0
}

// versionLine formats the build as one line that scripts can split on spaces:
//
//	switchyard v1.2.3 (commit abc123, 2026-12-01T10:00:00Z, modified) go1.26.8 linux/amd64
//
// The parenthesis is there only when a commit is known. The link-time values (ver, rev, at) win over bi's (nil:
// no build info); a version that neither gives is "(devel)", as the go command writes it.
func versionLine(bi *debug.BuildInfo, ver, rev, at, goVersion, platform string) string {
	modified := false
	if bi != nil {
		if ver == "" {
			ver = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if rev == "" {
					rev = s.Value
				}
			case "vcs.time":
				if at == "" {
					at = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if ver == "" {
		ver = "(devel)"
	}
	var b strings.Builder
	b.WriteString("switchyard " + ver)
	if rev != "" {
		b.WriteString(" (commit " + rev)
		if at != "" {
			b.WriteString(", " + at)
		}
		if modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	b.WriteString(" " + goVersion + " " + platform)
	return b.String()
}
