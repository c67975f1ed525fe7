package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the running command and the test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSimBadArguments(t *testing.T) {
	badFleet := writeFile(t, "fleet.yaml", "- name: a\n  listen: 127.0.0.1:0\n  itl: fast\n")
	tests := []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"unknown flag", []string{"-speed", "3"}, 2, "-speed"},
		{"bad duration", []string{"-itl", "fast"}, 2, "-itl"},
		{"zero prefill", []string{"-prefill-tps", "0"}, 2, "-prefill-tps"},
		{"negative overhead", []string{"-overhead", "-1ms"}, 2, "-overhead"},
		{"fail rate above 1", []string{"-fail-rate", "1.5"}, 2, "-fail-rate"},
		{"zero kv blocks", []string{"-kv-blocks", "0"}, 2, "-kv-blocks"},
		{"not a number", []string{"-max-num-seqs", "many"}, 2, "-max-num-seqs"},
		{"empty name", []string{"-name", ""}, 2, "-name"},
		{"stray argument", []string{"extra"}, 2, `"extra"`},
		{"fleet with a knob", []string{"-fleet", badFleet, "-itl", "5ms"}, 2, "-itl"},
		{"missing fleet file", []string{"-fleet", filepath.Join(t.TempDir(), "none.yaml")}, 1, "none.yaml"},
		{"bad fleet line", []string{"-fleet", badFleet}, 1, "fleet.yaml:3: itl:"},
		{"bad listen address", []string{"-listen", "256.0.0.1:1"}, 1, "listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr syncBuffer
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			code := runSimContext(ctx, tc.args, &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not name %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

var listening = regexp.MustCompile(`sim: (\S+) listening on (http://\S+) model=(\S+)`)

// runUntilListening starts runSimContext and waits for n "listening" lines; the cleanup stops it and checks the
// clean exit.
func runUntilListening(t *testing.T, args []string, n int) [][]string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- runSimContext(ctx, args, &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("exit code %d after stop; stderr:\n%s", code, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Error("switchyard sim did not stop within 10s")
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := listening.FindAllStringSubmatch(stdout.String(), -1); len(m) == n {
			return m
		}
		select {
		case code := <-done:
			t.Fatalf("exited with %d before listening; stderr:\n%s", code, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d listening lines within 10s; stdout:\n%s", n, stdout.String())
		}
	}
}

func TestSimServesFromFlags(t *testing.T) {
	m := runUntilListening(t, []string{"-listen", "127.0.0.1:0", "-name", "solo", "-model", "m", "-itl", "1ms"}, 1)
	if m[0][1] != "solo" || m[0][3] != "m" {
		t.Errorf("listening line %q", m[0][0])
	}
	resp, err := http.Post(m[0][2]+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Sim-Backend") != "solo" || !bytes.Contains(body, []byte(`"completion_tokens":3`)) {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
}

func TestSimServesAFleet(t *testing.T) {
	fleet := writeFile(t, "fleet.yaml", `
- {name: use-1, region: us-east, listen: "127.0.0.1:0", itl: 1ms}
- name: euw-1
  region: eu-west
  listen: 127.0.0.1:0
  rtt: 5ms
`)
	m := runUntilListening(t, []string{"-fleet", fleet}, 2)
	for i, name := range []string{"use-1", "euw-1"} {
		if m[i][1] != name {
			t.Errorf("line %d names %q, want %q", i, m[i][1], name)
		}
		resp, err := http.Get(m[i][2] + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("X-Sim-Backend") != name {
			t.Errorf("%s answered as %q", name, resp.Header.Get("X-Sim-Backend"))
		}
	}
}
