package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
)

// predictAt runs h to at and predicts p there.
func (h *harness) predictAt(at time.Duration, p probe) Prediction {
	h.t.Helper()
	h.runUntil(at)
	got, err := h.e.predict(p)
	if err != nil {
		h.t.Fatal(err)
	}
	return got
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func TestPredictMatchesMeasuredTTFT(t *testing.T) {
	shared := promptBytes("You are a helpful assistant. Answer briefly. ", 8000) // 125 blocks
	tail := append(bytes.Clone(shared), promptBytes("and then a question ", 800)...)
	tests := []struct {
		name   string
		change func(*Config)
		load   func(h *harness) // requests before the probe, from t=0
		at     time.Duration
		prompt []byte
		delay  time.Duration
	}{
		{"idle", nil, func(*harness) {}, 0, promptBytes("hello there ", 4000), 0},
		{"decoding batch", nil, func(h *harness) {
			for range 8 {
				h.submit(0, 500, 200, nil)
			}
		}, 300 * time.Millisecond, promptBytes("a fresh prompt ", 6000), 0},
		{"waits for a seat behind a queue", func(c *Config) { c.MaxNumSeqs = 2 }, func(h *harness) {
			for i := range 5 {
				h.submit(time.Duration(i)*time.Millisecond, 300, 40+10*i, nil)
			}
		}, 100 * time.Millisecond, promptBytes("queued behind ", 2000), 0},
		{"out of KV blocks", func(c *Config) { c.KVBlocks = 200 }, func(h *harness) {
			h.submit(0, 2400, 300, nil)
		}, 50 * time.Millisecond, promptBytes("needs blocks ", 4000), 0},
		{"cached prefix", nil, func(h *harness) {
			h.submit(0, len(shared)/4, 3, AppendBlockHashes(nil, shared))
			h.submit(0, 700, 100, nil)
		}, 2 * time.Second, tail, 0},
		{"rtt while the batch moves on", func(c *Config) { c.MaxNumSeqs = 4 }, func(h *harness) {
			for range 3 {
				h.submit(0, 200, 30, nil)
			}
		}, 20 * time.Millisecond, promptBytes("from far away ", 3000), 45 * time.Millisecond},
		{"slowdown fault and priority", func(c *Config) { c.SchedulingPolicy = PolicyPriority; c.MaxNumSeqs = 2 },
			func(h *harness) {
				h.e.setFaults(Faults{Slowdown: 2.5})
				for i := range 4 {
					s := newSeq(400, 50, nil)
					s.priority = i % 3
					h.runUntil(0)
					if err := h.e.submit(s); err != nil {
						t.Fatal(err)
					}
					h.seqs = append(h.seqs, s)
				}
			}, 10 * time.Millisecond, promptBytes("urgent ", 1200), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.change != nil {
				tc.change(&cfg)
			}
			h := newHarness(t, cfg)
			tc.load(h)
			p := probe{prompt: (len(tc.prompt) + 3) / 4, maxTokens: 20, hashes: AppendBlockHashes(nil, tc.prompt),
				delay: tc.delay, priority: 1}
			if cfg.SchedulingPolicy != PolicyPriority {
				p.priority = 0
			}
			pred := h.predictAt(tc.at, p)
			s := newSeq(p.prompt, p.maxTokens, p.hashes)
			s.priority = p.priority
			h.runUntil(tc.at + tc.delay)
			if err := h.e.submit(s); err != nil {
				t.Fatal(err)
			}
			h.seqs = append(h.seqs, s)
			h.runIdle()
			want := millis(h.ttft(s) + tc.delay)
			if math.Abs(pred.TTFTMillis-want) > 1e-6 {
				t.Errorf("predicted TTFT %.4fms, measured %.4fms", pred.TTFTMillis, want)
			}
			if pred.CachedTokens != s.cachedTokens() {
				t.Errorf("predicted cached_tokens %d, got %d", pred.CachedTokens, s.cachedTokens())
			}
			if pred.PromptTokens != p.prompt || pred.MaxNumSeqs != cfg.MaxNumSeqs || pred.Backend != cfg.Name {
				t.Errorf("prediction %+v", pred)
			}
		})
	}
}

func TestPredictReportsQueues(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = 2
	h := newHarness(t, cfg)
	for range 5 {
		h.submit(0, 100, 50, nil)
	}
	pred := h.predictAt(100*time.Millisecond, probe{prompt: 10, maxTokens: 5})
	if pred.Running != 2 || pred.Waiting != 3 {
		t.Errorf("running %d, waiting %d; want 2, 3", pred.Running, pred.Waiting)
	}
	if pred.TTFTMillis < millis(50*20*time.Millisecond) {
		t.Errorf("TTFT %.1fms: behind three queued 50-token requests it cannot beat one of them", pred.TTFTMillis)
	}
}

// engineState is what predict must not change: the KV pool, every queue's sequences, and the metrics' text.
func engineState(t *testing.T, e *engine) (pool *blockPool, seqs []seq, metrics string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, list := range [][]*seq{e.pending, e.waiting, e.running, e.batch} {
		for _, s := range list {
			seqs = append(seqs, seq{prompt: s.prompt, computed: s.computed, output: s.output, state: s.state,
				blocks: append([]int32(nil), s.blocks...), registered: s.registered, cached: s.cached})
		}
	}
	mfs, err := e.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			t.Fatal(err)
		}
	}
	return e.pool.clone(), seqs, buf.String()
}

func TestPredictLeavesTheEngineUntouched(t *testing.T) {
	// A cache whose LRU order a lookup that touched it would change: prompt 0 is the least recently used, and
	// predicting it (a full hit) must not make it the most recent. Under every eviction rule and batching law.
	for _, phys := range []struct{ batching, eviction string }{
		{BatchStepped, EvictLRU}, {BatchStepped, EvictRadix}, {BatchStepped, EvictFIFO}, {BatchSeats, EvictLRU},
	} {
		t.Run(phys.batching+"/"+phys.eviction, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.KVBlocks, cfg.Batching, cfg.Eviction, cfg.Jitter = 400, phys.batching, phys.eviction, 0.2
			predictUntouched(t, cfg)
		})
	}
}

func predictUntouched(t *testing.T, cfg Config) {
	h := newHarness(t, cfg)
	prompts := make([][]byte, 3)
	for i := range prompts {
		prompts[i] = promptBytes(strings.Repeat(string(rune('a'+i)), 3)+" document. ", 6400)
		h.submit(time.Duration(i)*time.Second, 1600, 2, AppendBlockHashes(nil, prompts[i]))
		h.runIdle()
	}
	h.submit(3*time.Second, 800, 100, nil) // one running, mid-step, at the prediction
	h.runUntil(3*time.Second + 55*time.Millisecond)
	pool, seqs, metrics := engineState(t, h.e)
	before := *h.e.jit
	for i := range prompts {
		pred, err := h.e.predict(probe{prompt: 1600, maxTokens: 10, hashes: AppendBlockHashes(nil, prompts[i])})
		if err != nil {
			t.Fatal(err)
		}
		if pred.CachedTokens != 1584 {
			t.Errorf("prompt %d: predicted cached_tokens %d, want 1584", i, pred.CachedTokens)
		}
	}
	pool2, seqs2, metrics2 := engineState(t, h.e)
	if !reflect.DeepEqual(pool, pool2) {
		t.Error("predict changed the KV pool (free queue order or cached hashes)")
	}
	if !reflect.DeepEqual(seqs, seqs2) {
		t.Errorf("predict changed the sequences:\n%+v\n%+v", seqs, seqs2)
	}
	if metrics != metrics2 {
		t.Errorf("predict changed the metrics:\n%s\n---\n%s", metrics, metrics2)
	}
	if jit := *h.e.jit; jit != before {
		t.Error("predict drew from the engine's jitter generator")
	}
}

// predictHTTP posts body to b's /sim/predict.
func predictHTTP(t *testing.T, b *Backend, body string) (int, Prediction, apiError) {
	t.Helper()
	resp := post(t.Context(), t, b.URL()+"/sim/predict", []byte(body))
	defer resp.Body.Close()
	var p Prediction
	var e apiError
	var raw json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
	} else if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, p, e
}

func TestServePredict(t *testing.T) {
	b := startBackend(t, func(c *Config) {
		fastConfig(c)
		c.Name = "oracle-a"
		c.KVBlocks = 64
		c.RTT = 3 * time.Millisecond
	})
	content := strings.Repeat("the same long system prompt ", 20) // 560 bytes + "user:" and "\n"
	code, p, _ := predictHTTP(t, b, string(chatBody(t, content, 4, true, false)))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	promptTokens := (len("user:"+content+"\n") + 3) / 4
	// Idle: RTT + overhead + the prefill of every token (1e6 tokens/s), and nothing cached.
	want := millis(3*time.Millisecond+time.Millisecond) + float64(promptTokens)/1e3
	if p.Backend != "oracle-a" || p.PromptTokens != promptTokens || p.CachedTokens != 0 || p.Running != 0 ||
		p.Waiting != 0 || p.MaxNumSeqs != 256 || math.Abs(p.TTFTMillis-want) > 1e-3 {
		t.Errorf("idle prediction %+v, want ttft_ms %.3f", p, want)
	}
	before := scrape(t, b, "vllm:prefix_cache_queries_total")
	if got, code := cachedTokens(t, b, content); code != http.StatusOK || got != 0 {
		t.Fatalf("first request: status %d, cached %d", code, got)
	}
	// The completions form of the same canonical prompt is told apart by "prompt".
	code, p, _ = predictHTTP(t, b, `{"model":"sim-model","prompt":"user:`+content+`\n","max_tokens":3}`)
	wantCached := (len("user:"+content+"\n") / BlockBytes) * BlockTokens
	if code != http.StatusOK || p.CachedTokens != wantCached {
		t.Errorf("completions form: status %d, %+v; want cached_tokens %d", code, p, wantCached)
	}
	if got := scrape(t, b, "vllm:prefix_cache_queries_total"); got != before+float64(promptTokens) {
		t.Errorf("prefix_cache_queries_total %v, want %v: a prediction is not a query", got, before+float64(promptTokens))
	}
	if got := scrape(t, b, "vllm:prompt_tokens_total"); got != float64(promptTokens) {
		t.Errorf("prompt_tokens_total %v, want %d: predictions prefill nothing", got, promptTokens)
	}

	hostile := []struct {
		name, body string
		status     int
	}{
		{"bad JSON", `{"messages":`, 400},
		{"neither messages nor prompt", `{"model":"sim-model"}`, 400},
		{"empty messages", `{"messages":[]}`, 400},
		{"content of the wrong type", `{"messages":[{"role":"user","content":5}]}`, 400},
		{"max_tokens 0", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, 400},
		{"past the context", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2000}`, 400},
		{"n 2", `{"prompt":"hi","n":2}`, 400},
		{"priority under fcfs", `{"prompt":"hi","priority":3}`, 400},
		{"unknown model", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, 404},
		{"not an object", `[1,2,3]`, 400},
	}
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			code, _, e := predictHTTP(t, b, tc.body)
			if code != tc.status || e.Error.Code != tc.status || e.Error.Message == "" || e.Error.Param != nil {
				t.Errorf("got %d %+v, want %d", code, e, tc.status)
			}
			// The same answer as the endpoint the body was meant for.
			path := "/v1/chat/completions"
			if strings.Contains(tc.body, `"prompt"`) {
				path = "/v1/completions"
			}
			resp := post(t.Context(), t, b.URL()+path, []byte(tc.body))
			defer resp.Body.Close()
			var want apiError
			_ = json.NewDecoder(resp.Body).Decode(&want)
			if resp.StatusCode != code || want.Error.Message != e.Error.Message || want.Error.Type != e.Error.Type {
				t.Errorf("predict answered %d %q, %s answers %d %q", code, e.Error.Message, path,
					resp.StatusCode, want.Error.Message)
			}
		})
	}
	t.Run("too large", func(t *testing.T) {
		big := `{"prompt":"` + strings.Repeat("x", maxBodyBytes) + `"}`
		if code, _, e := predictHTTP(t, b, big); code != http.StatusRequestEntityTooLarge || e.Error.Code != 413 {
			t.Errorf("got %d %+v, want 413", code, e)
		}
	})
	t.Run("GET", func(t *testing.T) {
		resp, err := http.Get(b.URL() + "/sim/predict")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
			t.Errorf("GET: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
		}
	})
	t.Run("down", func(t *testing.T) {
		if code, _ := control(t, b, `{"down":true}`); code != http.StatusOK {
			t.Fatal(code)
		}
		defer control(t, b, `{}`)
		if code, _, _ := predictHTTP(t, b, `{"prompt":"hi"}`); code != http.StatusServiceUnavailable {
			t.Errorf("down: %d, want 503", code)
		}
	})
}

func TestPredictDocExample(t *testing.T) {
	// The package doc's example: a 1,000-token prompt an idle default backend has served before.
	h := newHarness(t, DefaultConfig())
	prompt := promptBytes("an example prompt ", 4000)
	h.submit(0, 1000, 5, AppendBlockHashes(nil, prompt))
	h.runIdle()
	got := h.predictAt(time.Minute, probe{prompt: 1000, maxTokens: 5, hashes: AppendBlockHashes(nil, prompt)})
	want := Prediction{Backend: "sim", PromptTokens: 1000, CachedTokens: 992, TTFTMillis: 10.8, MaxNumSeqs: 256}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// BenchmarkPredict is the cost of one prediction on a busy backend (32 sequences decoding, 8 queued, a warm
// cache): the fork's copy of the KV cache's bookkeeping and the steps simulated until the probe's first token.
func BenchmarkPredict(b *testing.B) {
	for _, bc := range []struct {
		name   string
		change func(*Config)
	}{
		{"vllm-v1", func(c *Config) { c.KVBlocks = 2048 }},
		{"sglang", func(c *Config) { _ = c.SetPhysics(PhysicsSGLang); c.KVBlocks = 32768 }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			bc.change(&cfg)
			cfg.MaxNumSeqs = 32
			clk := &predictClock{t: t0}
			e := newEngine(cfg, clk)
			hashes := func(i int) []uint64 {
				prompt := promptBytes(fmt.Sprintf("conversation %d, a long shared history. ", i%8), 4000)
				return appendBlockHashes(nil, prompt, cfg.blockSize()*4)
			}
			events := 0
			for i := range 40 {
				e.runUntil(clk, t0.Add(time.Duration(i)*10*time.Millisecond), &events, nil)
				if err := e.submit(newSeq(1000, 200, hashes(i))); err != nil {
					b.Fatal(err)
				}
			}
			e.runUntil(clk, t0.Add(2*time.Second), &events, nil)
			p := probe{prompt: 1000, maxTokens: 50, hashes: hashes(3)}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := e.predict(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
