//go:build unix

package policy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard/sim"
)

// This file tests hot reload end to end: the real binary (`switchyard serve`, a child process) in front of
// simulated backends (in process), under streaming load, watched from outside through the admin port.

// gatewayProc is a `switchyard serve` child process.
type gatewayProc struct {
	cmd        *exec.Cmd
	api, admin string // http://127.0.0.1:PORT
	logs       *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var listening = regexp.MustCompile(`msg="switchyard listening" api=(http://\S+)/v1 admin=(http://\S+)`)

// startGateway builds the binary and runs `switchyard serve -config path`; it is stopped (SIGTERM, then killed)
// when the test ends.
func startGateway(t *testing.T, path string) *gatewayProc {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "switchyard")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/switchyard/switchyard/cmd/switchyard").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	g := &gatewayProc{cmd: exec.Command(bin, "serve", "-config", path), logs: &lockedBuffer{}}
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = g.cmd.Process.Kill()
			<-exited
			t.Errorf("the gateway did not stop on SIGTERM; logs:\n%s", g.logs.String())
		}
	})
	addrs := make(chan []string, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(g.logs, sc.Text())
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- m[1:]
			}
		}
		_ = g.cmd.Wait()
	}()
	select {
	case a := <-addrs:
		g.api, g.admin = a[0], a[1]
	case <-exited:
		t.Fatalf("the gateway exited at start:\n%s", g.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway did not start:\n%s", g.logs.String())
	}
	return g
}

// debugConfig is what /debug/config says about the policy in force.
type debugConfig struct {
	Hash   string `json:"hash"`
	Models []struct {
		Name     string   `json:"name"`
		Strategy string   `json:"strategy"`
		Backends []string `json:"backends"`
	} `json:"models"`
}

func (g *gatewayProc) config(t *testing.T) debugConfig {
	t.Helper()
	var dc debugConfig
	resp, err := http.Get(g.admin + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&dc); err != nil || len(dc.Models) == 0 {
		t.Fatalf("/debug/config: %v %+v", err, dc)
	}
	return dc
}

// reloadSuccess reads switchyard_config_reload_success from /metrics.
func (g *gatewayProc) reloadSuccess(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(g.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, "switchyard_config_reload_success "); ok {
			return v
		}
	}
	t.Fatal("no switchyard_config_reload_success in /metrics")
	return ""
}

// within polls cond for up to 2 s, the reload promise, and returns how long it took.
func within(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%s: not within 2s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// streamed is one streaming request through the gateway.
type streamed struct {
	start   time.Time
	backend string
	err     error
}

// stream sends a streaming chat completion and reads it to the end. It fails unless the answer is a 200 whose
// stream ends with "data: [DONE]" and carries no error event: a cut stream is a failure.
func stream(client *http.Client, api string, i int) streamed {
	r := streamed{start: time.Now()}
	body := fmt.Sprintf(`{"model":"sim-model","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"question %d"}]}`, i)
	resp, err := client.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	r.backend = resp.Header.Get("X-Switchyard-Backend")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		r.err = fmt.Errorf("status %d: %s", resp.StatusCode, msg)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		switch line := sc.Text(); {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"error"`):
			r.err = fmt.Errorf("error event: %s", line)
			return r
		}
	}
	if !done {
		r.err = fmt.Errorf("stream cut before [DONE]: %v", sc.Err())
	}
	return r
}

func TestReloadEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it under load for several seconds")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfgs := make([]sim.Config, 3)
	for i, name := range []string{"a", "b", "c"} {
		cfgs[i] = sim.DefaultConfig()
		cfgs[i].Name = name // 40 tokens at the default 20 ms: streams of about 0.8 s, many in flight at each edit
	}
	fleet, err := sim.StartFleet(ctx, cfgs)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	url := map[string]string{}
	for i, u := range fleet.URLs() {
		url[cfgs[i].Name] = u
	}
	policy := func(strategy string, backends ...string) []byte {
		var b strings.Builder
		// No shutdown grace: the test stops the gateway with SIGTERM, which would otherwise keep it serving,
		// unready, for the default 5 s before it drains.
		b.WriteString("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nauth: none\nlimits: {drain_timeout: 5s, shutdown_grace: 0s}\nbackends:\n")
		for _, n := range backends {
			fmt.Fprintf(&b, "  - {name: %s, url: '%s', models: [sim-model]}\n", n, url[n])
		}
		fmt.Fprintf(&b, "models:\n  - {name: sim-model, strategy: %s, retries: 2}\n", strategy)
		return []byte(b.String())
	}
	// The file sits in a directory of its own, so that the SIGHUP step can take the watch away.
	dir := filepath.Join(t.TempDir(), "conf")
	path := filepath.Join(dir, "config.yaml")
	write := func(data []byte) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(policy("round_robin", "a", "b"))
	g := startGateway(t, path)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway logs:\n%s", g.logs.String())
		}
	})

	// Streaming load for the whole test: 8 clients, each sending its next request when the last one ends.
	var (
		mu      sync.Mutex
		results []streamed
		stop    atomic.Bool
		n       atomic.Int64
		load    sync.WaitGroup
	)
	client := &http.Client{Timeout: 30 * time.Second}
	for range 8 {
		load.Go(func() {
			for !stop.Load() {
				r := stream(client, g.api, int(n.Add(1)))
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	defer func() { stop.Store(true); load.Wait() }()
	time.Sleep(time.Second)

	// 1. A valid edit: another strategy, backend a removed, backend c added.
	before := g.config(t)
	write(policy("least_request", "b", "c"))
	took := within(t, "the edit", func() bool {
		m := g.config(t).Models[0]
		return m.Strategy == "least_request" && slices.Equal(m.Backends, []string{"b", "c"})
	})
	swapped := time.Now()
	t.Logf("edit in force after %v", took)
	time.Sleep(1500 * time.Millisecond)

	// 2. An invalid edit changes nothing, and says so in the metric.
	inForce := g.config(t)
	write([]byte("backends: [\n"))
	within(t, "the failed reload", func() bool { return g.reloadSuccess(t) == "0" })
	time.Sleep(time.Second)
	if now := g.config(t); now.Hash != inForce.Hash || now.Hash == before.Hash {
		t.Errorf("policy hash after the invalid edit = %s, want %s", now.Hash, inForce.Hash)
	}
	invalidEnd := time.Now()

	// 3. SIGHUP: replace the file's directory, which takes the watch away (it follows the old directory), so
	// only the signal can make the gateway read the new file.
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(policy("random", "a", "b", "c"))
	time.Sleep(600 * time.Millisecond) // more than the watcher's debounce: a file event would have been seen
	if m := g.config(t).Models[0]; m.Strategy != "least_request" {
		t.Fatalf("the policy changed without SIGHUP (strategy %s): the test cannot tell the signal did it", m.Strategy)
	}
	if err := g.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	within(t, "the reload on SIGHUP", func() bool {
		m := g.config(t).Models[0]
		return m.Strategy == "random" && len(m.Backends) == 3 && g.reloadSuccess(t) == "1"
	})
	time.Sleep(500 * time.Millisecond)

	stop.Store(true)
	load.Wait()
	mu.Lock()
	defer mu.Unlock()
	failed := 0
	between := map[string]int{} // requests started between the edit (plus a margin) and the SIGHUP step
	for _, r := range results {
		if r.err != nil {
			failed++
			if failed <= 5 {
				t.Errorf("request to %q failed: %v", r.backend, r.err)
			}
		}
		if r.start.After(swapped.Add(100*time.Millisecond)) && r.start.Before(invalidEnd) {
			between[r.backend]++
		}
	}
	t.Logf("%d streamed requests, %d failed; between the edit and SIGHUP: %v", len(results), failed, between)
	if len(results) < 40 {
		t.Errorf("only %d requests: the load did not run", len(results))
	}
	if between["a"] > 0 || between["b"] == 0 || between["c"] == 0 {
		t.Errorf("after the edit, traffic went to %v; want b and c only", between)
	}
}
