package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/sim"
)

// TestReplicasSeeEachOthersRequests: replica b counts a stream that replica a sends to a backend from a's dispatch
// record, and stops counting it from a's end record, each well within a's load-report interval (1 s here), through
// a real Redis (routing/turns.go; docs/design.md, "Load between replicas"). With the load reports alone b would
// see the stream up to two intervals late and keep counting it up to two intervals after it ended.
func TestReplicasSeeEachOthersRequests(t *testing.T) {
	sims := startSims(t, 1, func(c *sim.Config) { c.ITL = 20 * time.Millisecond })
	redis := fmt.Sprintf("{url: 'redis://%s/0', key_prefix: '%s', timeout: 250ms, sync_interval: 1s}",
		redistest.Addr(t), redistest.Prefix(t))
	pol := policyFor(sims, "adaptive", redis, "auth: none\n")
	a, b := startServe(t, pol), startServe(t, pol)
	view := func() (inflight, running, reported float64) {
		for _, be := range debugBackends(t, b) {
			if be["name"] == "b0" {
				inflight, _ = be["peer_inflight"].(float64)
				running, _ = be["peer_running"].(float64)
				reported, _ = be["peer_reported"].(float64)
			}
		}
		return inflight, running, reported
	}
	// Each replica syncs when it starts and then every second: past one interval b holds a's (empty) report, and
	// the figures below are that report brought up to now, not its absence.
	time.Sleep(1200 * time.Millisecond)
	within := func(what string, limit time.Duration, inflight, running float64) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			i, r, rep := view()
			if i == inflight && r == running {
				return time.Since(start)
			}
			if time.Since(start) > limit {
				t.Fatalf("%s: after %v b counts %v in flight (%v running by the records, %v reported); want %v, %v",
					what, limit, i, r, rep, inflight, running)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	body := `{"model":"sim-model","stream":true,"max_tokens":120,"messages":[{"role":"user","content":"Tell me about KV caches."}]}`
	resp, err := http.Post(a.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: ") {
	}
	// The stream runs for about 2.4 s (120 tokens, 20 ms apart).
	seen := within("while a's stream runs", 400*time.Millisecond, 1, 1)
	done := false
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			done = true
			break
		}
	}
	if !done {
		t.Fatalf("the stream ended without [DONE]: %v", sc.Err())
	}
	gone := within("after a's stream ended", 400*time.Millisecond, 0, 0)
	t.Logf("b counted a's stream %v after its first token, and stopped %v after its end", seen, gone)
}
