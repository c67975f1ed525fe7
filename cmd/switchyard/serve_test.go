package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// testLDFlags stamp the test binary's version as the Dockerfile does (at link time); TestVersionBinary checks
// the line they make.
const testLDFlags = "-X main.version=v9.9.9-test -X main.commit=0123abcd -X main.commitTime=2026-12-01T10:00:00Z"

// built is the switchyard binary the tests run, built once per test process: a build and its link are most of
// what a test that runs the binary costs, and each test built its own. TestMain removes its directory.
var built struct {
	once     sync.Once
	dir, bin string
	out      []byte
	err      error
}

// buildBinary returns the switchyard binary, built on first use with testLDFlags (and -buildvcs=false, as the
// Dockerfile builds it). Tests must not modify it.
func buildBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "switchyard-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "switchyard")
		if runtime.GOOS == "windows" {
			built.bin += ".exe"
		}
		built.out, built.err = exec.Command("go", "build", "-buildvcs=false", "-ldflags", testLDFlags, "-o", built.bin, ".").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// serveProc is a `switchyard serve` child process and the addresses its log announced.
type serveProc struct {
	cmd        *exec.Cmd
	api, admin string        // http://host:port, without /v1
	exited     chan struct{} // closed when the process has exited; err is then its exit error
	err        error
}

var listeningRE = regexp.MustCompile(`api=http://(\S+)/v1 admin=http://(\S+)`)

// startServeProc starts bin serve on the policy text and waits (at most 10 s) until it listens. The process is
// killed at cleanup if it is still running.
func startServeProc(t *testing.T, bin, policy string) *serveProc {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "-config", path)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, exited: make(chan struct{})}
	addrs := make(chan []string, 1)
	logged := make(chan string, 1)
	go func() { // ends when the process closes its stderr
		var all strings.Builder
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			all.WriteString(sc.Text() + "\n")
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- m[1:]
			}
		}
		logged <- all.String()
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("serve log:\n%s", <-logged)
		}
	})
	select {
	case a := <-addrs:
		p.api, p.admin = "http://"+a[0], "http://"+a[1]
	case <-p.exited:
		t.Fatalf("serve exited: %v", p.err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not start")
	}
	return p
}

// get returns the status and body of a GET on a fresh connection.
func get(client *http.Client, url string) (int, string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestServeDrainGraceOnSIGTERM runs the real binary: after SIGTERM, for limits.shutdown_grace, /readyz is 503
// "draining" while a new chat request on a new connection still succeeds; after it the API port is closed, and the
// process exits 0.
func TestServeDrainGraceOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	sims := startSims(t, 1, nil)
	const grace = 2 * time.Second
	policy := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
auth: none
backends:
  - {name: b0, url: %s, models: [sim-model]}
models:
  - {name: sim-model}
limits: {shutdown_grace: %v, drain_timeout: 1s}
`, sims[0].URL(), grace)
	p := startServeProc(t, bin, policy)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	if r := chat(t, client, p.api, "", smallChat); r.code != http.StatusOK {
		t.Fatalf("chat before SIGTERM: %d", r.code)
	}
	if code, body, err := get(client, p.admin+"/readyz"); err != nil || strings.TrimSpace(body) == "draining" {
		t.Fatalf("readyz before SIGTERM: %d %q %v", code, body, err)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	term := time.Now()
	for {
		code, body, err := get(client, p.admin+"/readyz")
		if err == nil && code == http.StatusServiceUnavailable && strings.TrimSpace(body) == "draining" {
			break
		}
		if time.Since(term) > grace/2 {
			t.Fatalf("readyz %v after SIGTERM: %d %q %v; want 503 draining", time.Since(term), code, body, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := chat(t, client, p.api, "", smallChat); r.code != http.StatusOK {
		t.Errorf("chat during the grace: %d, want 200", r.code)
	}
	if d := time.Since(term); d >= grace {
		t.Fatalf("the checks took %v, longer than the grace: they prove nothing", d)
	}

	apiAddr := strings.TrimPrefix(p.api, "http://")
	for {
		c, err := net.DialTimeout("tcp", apiAddr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Since(term) > grace+5*time.Second {
			t.Fatal("the API port is still open 5 s after the grace")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(term); d < grace {
		t.Errorf("the API port closed %v after SIGTERM, before the grace (%v) ended", d, grace)
	}
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("serve exit: %v, want 0", p.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit")
	}
}

// TestServeSIGINTSkipsGrace: Ctrl-C (SIGINT) stops at once, whatever the grace.
func TestServeSIGINTSkipsGrace(t *testing.T) {
	ctx, stop := stopOnSignal()
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGINT did not end the context")
	}
	if errors.Is(context.Cause(ctx), errTerminated) {
		t.Errorf("SIGINT: cause %v, want context.Canceled", context.Cause(ctx))
	}
}
