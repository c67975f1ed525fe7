package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
)

// These tests measure conversation affinity across gateway replicas: two `serve` replicas in one process, each
// with its own routing state (prefix index, latency models, accounting), sharing load and prefix hints through a
// real redis-server at the deployed sync interval, in front of simulated backends over loopback HTTP. A
// conversation is multi-turn: each turn's prompt is the previous turn's prompt, its answer and a new question,
// and turns alternate between the replicas, so each replica sees only every other turn of it.

// convReply is one turn's outcome.
type convReply struct {
	code    int
	backend string
	answer  string
}

// converse sends one chat turn and returns the backend that served it and the answer's text.
func converse(t testing.TB, base, model string, msgs []map[string]string, maxTokens int) convReply {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens, "messages": msgs})
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("request: %v", err)
		return convReply{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := convReply{code: resp.StatusCode, backend: resp.Header.Get("X-Switchyard-Backend")}
	var r struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if json.Unmarshal(raw, &r) == nil && len(r.Choices) > 0 {
		out.answer = r.Choices[0].Message.Content
	}
	return out
}

// convWorkload is a set of conversations alternating between two replicas.
type convWorkload struct {
	conversations, turns int
	stagger              time.Duration // between conversation starts
	think                time.Duration // between a turn's answer and the next question (plus up to 60 ms)
	answerTokens         int
}

// convResult is what a workload measured.
type convResult struct {
	same, followUps int
	moves           []string // "conversation c turn i: bX -> bY (replica r)"
}

func (r convResult) share() float64 { return float64(r.same) / float64(max(r.followUps, 1)) }

// run plays the workload on reps and counts the follow-up turns that landed on the backend of the turn before
// (which the other replica routed).
func (w convWorkload) run(t testing.TB, reps []gwReplica, label string) convResult {
	t.Helper()
	var mu sync.Mutex
	var res convResult
	var wg sync.WaitGroup
	for c := range w.conversations {
		wg.Go(func() {
			time.Sleep(time.Duration(c) * w.stagger)
			// About 1,000 tokens of system prompt, distinct per conversation from its first block on.
			msgs := []map[string]string{{"role": "system", "content": fmt.Sprintf("%s conversation %d. ", label, c) +
				strings.Repeat(fmt.Sprintf("Rule %d of %s: answer precisely and kindly. ", c, label), 110)}}
			prev := ""
			for turn := range w.turns {
				msgs = append(msgs, map[string]string{"role": "user",
					"content": fmt.Sprintf("Question %d of conversation %d: what about item %d?", turn, c, turn*7+c)})
				rep := (c + turn) % 2
				r := converse(t, reps[rep].api, "sim-model", msgs, w.answerTokens)
				if r.code != http.StatusOK {
					t.Errorf("conversation %d turn %d: status %d", c, turn, r.code)
					return
				}
				msgs = append(msgs, map[string]string{"role": "assistant", "content": r.answer})
				if prev != "" {
					mu.Lock()
					res.followUps++
					if r.backend == prev {
						res.same++
					} else {
						res.moves = append(res.moves, fmt.Sprintf("conversation %d turn %d: %s -> %s (replica %d)", c, turn, prev, r.backend, rep))
					}
					mu.Unlock()
				}
				prev = r.backend
				time.Sleep(w.think + time.Duration((c*37+turn*53)%60)*time.Millisecond)
			}
		})
	}
	wg.Wait()
	return res
}

// warmReplicas sends each replica unrelated long prompts round robin over every backend (the "warm" model), so
// that each has measured every backend's prefill rate, as in a fleet that has been running for a while. Every
// warm-up prompt is new to the engines.
func warmReplicas(t testing.TB, reps []gwReplica, rounds int) {
	t.Helper()
	for i := range rounds {
		for j, r := range reps {
			msgs := []map[string]string{{"role": "user", "content": strings.Repeat(fmt.Sprintf("warm-up %d of replica %d. ", i, j), 150)}}
			if got := converse(t, r.api, "warm", msgs, 2); got.code != http.StatusOK {
				t.Fatalf("warm-up: status %d", got.code)
			}
		}
	}
}

// logBackends logs what each replica's /debug/backends says of the backends besides routing's figures: the
// guards that can take a backend out of a pick before routing sees it.
func logBackends(t *testing.T, reps []gwReplica) {
	t.Helper()
	for i, r := range reps {
		for _, b := range debugBackends(t, r) {
			m, _ := b["ttft_model"].(map[string]any)
			t.Logf("replica %d %v: requests %v, breaker %v, outlier %v, concurrency limit %v, seats %v; TTFT observed/predicted p10 %.2f p50 %.2f p90 %.2f",
				i, b["name"], b["requests"], b["breaker"], b["outlier"], b["concurrency_limit"], b["seats"], m["error_p10"], m["error_p50"], m["error_p90"])
		}
	}
}

// deployedRedis is the policy's redis value with the deployed defaults (sync interval included) and a key prefix
// of the test's own.
func deployedRedis(t testing.TB) string {
	if os.Getenv(redistest.EnvAddr) == "" {
		t.Skipf("needs a redis-server: set %s (./scripts/test does)", redistest.EnvAddr)
	}
	return fmt.Sprintf("{url: 'redis://%s/0', key_prefix: '%s'}", redistest.Addr(t), redistest.Prefix(t))
}

// TestConversationAffinityAcrossReplicas: multi-turn conversations that alternate between two adaptive replicas
// turn by turn stay on their backend for at least 95% of their follow-up turns, on a fleet with room for them
// all.
func TestConversationAffinityAcrossReplicas(t *testing.T) {
	redis := deployedRedis(t)
	pol := policyFor(startSims(t, 4, nil), "adaptive", redis, "auth: none\n")
	reps := []gwReplica{startServe(t, pol), startServe(t, pol)}
	warmReplicas(t, reps, 8)
	w := convWorkload{conversations: 24, turns: 8, stagger: 60 * time.Millisecond, think: 150 * time.Millisecond, answerTokens: 24}
	res := w.run(t, reps, "affinity")
	t.Logf("adaptive across two replicas: %d of %d follow-up turns (%.1f%%) on the backend of the turn before",
		res.same, res.followUps, 100*res.share())
	for _, m := range res.moves {
		t.Log("moved: " + m)
	}
	logBackends(t, reps)
	if res.followUps < w.conversations*(w.turns-1) {
		t.Fatalf("only %d follow-up turns completed", res.followUps)
	}
	if res.share() < 0.95 {
		t.Fatalf("conversation stickiness %.3f, want >= 0.95", res.share())
	}
}

// TestConversationMovesOffAnOverloadedOwner: the counter-test. Once a conversation's backend has several long
// prefills queued (sent through both replicas, so one replica knows them from its own accounting and the other
// from the load hints), waiting behind them costs seconds against the ~150 ms the cached prefix saves, and the
// next turn, through either replica, goes elsewhere.
func TestConversationMovesOffAnOverloadedOwner(t *testing.T) {
	redis := deployedRedis(t)
	sims := startSims(t, 4, nil)
	var pins strings.Builder
	for i := range sims {
		fmt.Fprintf(&pins, "  - name: pin-b%d\n    strategy: round_robin\n    targets:\n      - {backend: b%d, model: sim-model}\n", i, i)
	}
	pol := policyFor(sims, "adaptive", redis, pins.String()+"auth: none\n")
	reps := []gwReplica{startServe(t, pol), startServe(t, pol)}
	warmReplicas(t, reps, 8)

	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("Rule: answer the overloaded question precisely. ", 110)}}
	owner := ""
	for turn := range 4 { // settle the conversation on its backend
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Question %d?", turn)})
		r := converse(t, reps[turn%2].api, "sim-model", msgs, 16)
		if r.code != http.StatusOK {
			t.Fatalf("turn %d: status %d", turn, r.code)
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": r.answer})
		if owner != "" && r.backend != owner {
			t.Logf("turn %d moved %s -> %s before any load", turn, owner, r.backend)
		}
		owner = r.backend
		time.Sleep(150 * time.Millisecond)
	}

	// Four cold prompts of about 8,800 tokens on the owner (3.5 s of prefill at 10,000 tokens/s), two through each
	// replica.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			flood := []map[string]string{{"role": "user", "content": strings.Repeat(fmt.Sprintf("flood %d of the owner. ", i), 1600)}}
			if r := converse(t, reps[i%2].api, "pin-"+owner, flood, 1); r.code != http.StatusOK {
				t.Errorf("flood %d: status %d", i, r.code)
			}
		})
	}
	defer wg.Wait()
	// The next turn goes through replica 0, which routed two of the four itself and learns of the other two from
	// replica 1's hints and load report: wait until it counts all four in flight there.
	deadline := time.Now().Add(5 * time.Second)
	var seen map[string]any
	for {
		n := 0.0
		for _, b := range debugBackends(t, reps[0]) {
			if b["name"] == owner {
				seen = b
				local, _ := b["inflight"].(float64)
				peer, _ := b["peer_inflight"].(float64)
				n = local + peer
			}
		}
		if n >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica 0 never counted the flood in flight on %s: %v", owner, seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("replica 0 on %s: %.0f prefill tokens queued, TTFT model %v", owner, seen["queued_tokens"], seen["ttft_model"])
	msgs = append(msgs, map[string]string{"role": "user", "content": "Question after the flood?"})
	r := converse(t, reps[0].api, "sim-model", msgs, 16)
	if r.code != http.StatusOK {
		t.Fatalf("turn after the flood: status %d", r.code)
	}
	t.Logf("the turn after the flood went to %s (owner %s)", r.backend, owner)
	if r.backend == owner {
		t.Fatalf("the conversation stayed on %s behind about 35,000 tokens of queued prefill", owner)
	}
}
