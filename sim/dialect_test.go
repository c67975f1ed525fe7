package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// families fetches b's /metrics and parses it as Prometheus text, as a scraper would.
func families(t *testing.T, b *Backend) map[string]*familyView {
	t.Helper()
	resp, err := http.Get(b.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := make(map[string]*familyView, len(fams))
	for name, f := range fams {
		v := &familyView{labels: map[string]string{}}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				v.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Gauge != nil:
				v.value += m.Gauge.GetValue()
			case m.Counter != nil:
				v.value += m.Counter.GetValue()
			case m.Histogram != nil:
				v.value += float64(m.Histogram.GetSampleCount())
			}
		}
		out[name] = v
	}
	return out
}

// familyView is one parsed family: its samples' values added up (a histogram's counts) and their labels merged.
type familyView struct {
	value  float64
	labels map[string]string
}

func sortedNames(fams map[string]*familyView) []string {
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// The families each dialect exports, exactly: vLLM's as the simulator always served them (the gateway's
// routing/engines.go reads the SGLang and TGI names listed here; docs/engines.md gives their sources).
var wantFamilies = map[string][]string{
	DialectVLLM: {
		"process_start_time_seconds", "sim_engine_loop_lag_seconds", "sim_requests_pending",
		"vllm:cache_config_info", "vllm:e2e_request_latency_seconds", "vllm:generation_tokens_total",
		"vllm:gpu_cache_usage_perc", "vllm:inter_token_latency_seconds", "vllm:kv_cache_usage_perc",
		"vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
		"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:prompt_tokens_total",
		"vllm:request_success_total", "vllm:time_to_first_token_seconds",
	},
	DialectSGLang: {
		"process_start_time_seconds", "sglang:cache_config_info", "sglang:cached_tokens_total",
		"sglang:e2e_request_latency_seconds", "sglang:generation_tokens_total",
		"sglang:inter_token_latency_seconds", "sglang:num_queue_reqs", "sglang:num_retracted_reqs_total",
		"sglang:num_running_reqs", "sglang:prompt_tokens_total", "sglang:time_to_first_token_seconds",
		"sglang:token_usage", "sim_engine_loop_lag_seconds", "sim_requests_pending",
	},
	DialectTGI: {
		"sim_engine_loop_lag_seconds", "sim_requests_pending", "tgi_batch_current_size", "tgi_queue_size",
		"tgi_request_failure",
	},
}

func TestDialectMetricsMoveUnderLoad(t *testing.T) {
	gauges := map[string][2]string{ // running, waiting
		DialectVLLM:   {"vllm:num_requests_running", "vllm:num_requests_waiting"},
		DialectSGLang: {"sglang:num_running_reqs", "sglang:num_queue_reqs"},
		DialectTGI:    {"tgi_batch_current_size", "tgi_queue_size"},
	}
	// Any physics speaks any dialect: each dialect runs once on its own engine's preset and once on another.
	for _, tc := range []struct{ dialect, physics string }{
		{DialectVLLM, PhysicsVLLMV1}, {DialectSGLang, PhysicsSGLang}, {DialectTGI, PhysicsTGI},
		{DialectVLLM, PhysicsTGI}, {DialectSGLang, PhysicsLLMD}, {DialectTGI, PhysicsSGLang},
	} {
		dialect := tc.dialect
		t.Run(dialect+"/"+tc.physics, func(t *testing.T) {
			b := startBackend(t, func(c *Config) {
				fastConfig(c)
				c.ITL = 5 * time.Millisecond
				c.MaxNumSeqs = 1
				c.Dialect = dialect
				if err := c.SetPhysics(tc.physics); err != nil {
					t.Fatal(err)
				}
			})
			running, waiting := gauges[dialect][0], gauges[dialect][1]
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			first := post(ctx, t, b.URL()+"/v1/chat/completions", chatBody(t, "the first, long", 2000, true, false))
			defer first.Body.Close()
			waitMetric(t, b, running, 1, 5*time.Second)
			second := post(ctx, t, b.URL()+"/v1/chat/completions", chatBody(t, "the second, queued", 5, true, false))
			defer second.Body.Close()
			waitMetric(t, b, waiting, 1, 5*time.Second)
			if first.StatusCode != 200 || second.StatusCode != 200 {
				t.Fatalf("statuses %d, %d", first.StatusCode, second.StatusCode)
			}

			fams := families(t, b)
			if got := sortedNames(fams); !slices.Equal(got, wantFamilies[dialect]) {
				t.Errorf("families\n got %q\nwant %q", got, wantFamilies[dialect])
			}
			if got := fams[running].value; got != 1 {
				t.Errorf("%s = %v under load, want 1", running, got)
			}
			_, modelLabel := fams[running].labels["model_name"]
			if modelLabel != (dialect != DialectTGI) {
				t.Errorf("%s labels %v: TGI's carry no model_name, the others do", running, fams[running].labels)
			}

			cancel() // both clients leave: the gauges fall back
			waitMetric(t, b, running, 0, 5*time.Second)
			waitMetric(t, b, waiting, 0, 5*time.Second)
		})
	}
}

// usageOf posts a non-streaming completion and returns its usage's prompt and cached tokens.
func usageOf(t *testing.T, b *Backend, prompt string) (promptTokens, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
	resp := post(t.Context(), t, b.URL()+"/v1/completions", body)
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			PromptTokens  int `json:"prompt_tokens"`
			PromptDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Usage.PromptTokens, out.Usage.PromptDetails.CachedTokens
}

func TestDialectSGLangCacheCounters(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.Dialect = DialectSGLang; c.BlockSize = 8; c.KVBlocks = 1000 })
	text := string(promptBytes("a prefix shared by both requests ", 400))
	p1, c1 := usageOf(t, b, text)
	p2, c2 := usageOf(t, b, text)
	if c2 == 0 {
		t.Fatalf("the repeated prompt got no prefix hit (usage %d/%d): the counters below would prove nothing", c2, p2)
	}
	fams := families(t, b)
	// The gateway reads hits/queries as cached_tokens_total / prompt_tokens_total.
	if got, want := fams["sglang:prompt_tokens_total"].value, float64(p1+p2); got != want {
		t.Errorf("sglang:prompt_tokens_total = %v, want %v (every prompt token looked up)", got, want)
	}
	if got, want := fams["sglang:cached_tokens_total"].value, float64(c1+c2); got != want {
		t.Errorf("sglang:cached_tokens_total = %v, want %v (the usage's cached tokens)", got, want)
	}
	if got, want := fams["sglang:generation_tokens_total"].value, 4.0; got != want {
		t.Errorf("sglang:generation_tokens_total = %v, want %v", got, want)
	}
	if got := fams["sglang:time_to_first_token_seconds"].value; got != 2 {
		t.Errorf("sglang:time_to_first_token_seconds count = %v, want 2", got)
	}
	info := fams["sglang:cache_config_info"]
	cfg := b.Config()
	if info.value != 1 || info.labels["page_size"] != strconv.Itoa(cfg.BlockSize) ||
		info.labels["num_pages"] != strconv.Itoa(cfg.KVBlocks) {
		t.Errorf("sglang:cache_config_info = %v %v, want 1 with page_size %d, num_pages %d", info.value, info.labels,
			cfg.BlockSize, cfg.KVBlocks)
	}
	if got := fams["sglang:token_usage"].value; got != 0 {
		t.Errorf("sglang:token_usage = %v when idle, want 0", got)
	}
}

// getInfo fetches path with method and decodes a 200's JSON body (numbers kept as json.Number).
func getInfo(t *testing.T, b *Backend, method, path string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || method != http.MethodGet {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header, nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return resp.StatusCode, resp.Header, doc
}

// number returns doc's field at keys as an int, failing unless it is a JSON integer.
func number(t *testing.T, doc map[string]any, keys ...string) int {
	t.Helper()
	var v any = doc
	for _, k := range keys {
		obj, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%v: not an object at %q", keys, k)
		}
		v = obj[k]
	}
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v = %#v, want a number", keys, v)
	}
	i, err := strconv.Atoi(n.String())
	if err != nil {
		t.Fatalf("%v = %s, want an integer", keys, n)
	}
	return i
}

// isNull reports whether doc has key with the value JSON null.
func isNull(doc map[string]any, key string) bool {
	v, ok := doc[key]
	return ok && v == nil
}

func TestDialectSGLangServerInfo(t *testing.T) {
	for _, states := range []bool{true, false} {
		t.Run("states_seats="+strconv.FormatBool(states), func(t *testing.T) {
			b := startBackend(t, func(c *Config) {
				fastConfig(c)
				c.Dialect, c.StatesSeats, c.MaxNumSeqs, c.Model = DialectSGLang, states, 48, "m-sg"
				if err := c.SetPhysics(PhysicsSGLang); err != nil {
					t.Fatal(err)
				}
			})
			cfg := b.Config()
			for _, path := range []string{"/get_server_info", "/server_info"} {
				code, _, doc := getInfo(t, b, http.MethodGet, path)
				if code != 200 {
					t.Fatalf("%s: %d", path, code)
				}
				if doc["model_path"] != cfg.Model || doc["served_model_name"] != cfg.Model {
					t.Errorf("%s: model_path %v, served_model_name %v, want %s", path, doc["model_path"],
						doc["served_model_name"], cfg.Model)
				}
				if states {
					if got := number(t, doc, "max_running_requests"); got != cfg.MaxNumSeqs {
						t.Errorf("%s: max_running_requests %d, want %d", path, got, cfg.MaxNumSeqs)
					}
				} else if !isNull(doc, "max_running_requests") {
					t.Errorf("%s: max_running_requests %v, want null (not stated)", path, doc["max_running_requests"])
				}
				if doc["schedule_policy"] != PolicyFCFS {
					t.Errorf("%s: schedule_policy %v", path, doc["schedule_policy"])
				}
				if got := number(t, doc, "page_size"); got != cfg.blockSize() {
					t.Errorf("%s: page_size %d, want %d", path, got, cfg.blockSize())
				}
				if got := number(t, doc, "chunked_prefill_size"); got != cfg.MaxBatchedTokens {
					t.Errorf("%s: chunked_prefill_size %d, want %d", path, got, cfg.MaxBatchedTokens)
				}
				states, ok := doc["internal_states"].([]any)
				if !ok || len(states) != 1 {
					t.Fatalf("%s: internal_states %#v, want one element (one data-parallel rank)", path, doc["internal_states"])
				}
				st := states[0].(map[string]any)
				// SGLang always states the limit it runs with here, stated or computed.
				if got := number(t, st, "effective_max_running_requests_per_dp"); got != cfg.MaxNumSeqs {
					t.Errorf("%s: effective_max_running_requests_per_dp %d, want %d", path, got, cfg.MaxNumSeqs)
				}
				if got, want := number(t, st, "memory_usage", "token_capacity"), cfg.KVBlocks*cfg.blockSize(); got != want {
					t.Errorf("%s: token_capacity %d, want %d", path, got, want)
				}
				if _, ok := st["last_gen_throughput"].(json.Number); !ok {
					t.Errorf("%s: last_gen_throughput %#v, want a number", path, st["last_gen_throughput"])
				}
				if v, _ := doc["version"].(string); !strings.HasPrefix(v, "sim-") {
					t.Errorf("%s: version %q, want sim-...", path, v)
				}
			}
			if code, _, _ := getInfo(t, b, http.MethodGet, "/info"); code != 404 {
				t.Errorf("TGI's /info under sglang: %d, want 404", code)
			}
		})
	}
}

func TestDialectSGLangThroughputUnderLoad(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.ITL = 5 * time.Millisecond; c.Dialect = DialectSGLang })
	resp := post(t.Context(), t, b.URL()+"/v1/chat/completions", chatBody(t, "stream for a while", 2000, true, false))
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for range 3 { // tokens are flowing
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	_, _, doc := getInfo(t, b, http.MethodGet, "/get_server_info")
	st := doc["internal_states"].([]any)[0].(map[string]any)
	rate, err := st["last_gen_throughput"].(json.Number).Float64()
	if err != nil || !(rate > 0) {
		t.Errorf("last_gen_throughput %v (%v) while a stream decodes, want > 0", st["last_gen_throughput"], err)
	}
}

func TestDialectTGIInfo(t *testing.T) {
	tests := []struct {
		name       string
		states     bool
		limit      int
		wantLimit  int
		wantSeatsN bool
	}{
		{"stated, no limit", true, 0, tgiDefaultConcurrent, true},
		{"not stated, a limit", false, 7, 7, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := startBackend(t, func(c *Config) {
				fastConfig(c)
				c.Dialect, c.StatesSeats, c.MaxConcurrentRequests, c.MaxNumSeqs = DialectTGI, tc.states, tc.limit, 24
				c.Model = "m-tgi"
			})
			cfg := b.Config()
			code, _, doc := getInfo(t, b, http.MethodGet, "/info")
			if code != 200 {
				t.Fatalf("/info: %d", code)
			}
			for _, key := range []string{"model_id", "model_dtype", "model_device_type", "max_concurrent_requests",
				"max_best_of", "max_stop_sequences", "max_input_tokens", "max_total_tokens", "max_batch_total_tokens",
				"max_waiting_tokens", "max_batch_size", "validation_workers", "version"} {
				if _, ok := doc[key]; !ok {
					t.Errorf("/info lacks %s", key)
				}
			}
			if doc["model_id"] != cfg.Model {
				t.Errorf("model_id %v, want %s", doc["model_id"], cfg.Model)
			}
			if got := number(t, doc, "max_concurrent_requests"); got != tc.wantLimit {
				t.Errorf("max_concurrent_requests %d, want %d", got, tc.wantLimit)
			}
			if tc.wantSeatsN {
				if got := number(t, doc, "max_batch_size"); got != cfg.MaxNumSeqs {
					t.Errorf("max_batch_size %d, want %d", got, cfg.MaxNumSeqs)
				}
			} else if !isNull(doc, "max_batch_size") {
				t.Errorf("max_batch_size %v, want null (TGI's default: not stated)", doc["max_batch_size"])
			}
			if got, want := number(t, doc, "max_batch_total_tokens"), cfg.KVBlocks*cfg.blockSize(); got != want {
				t.Errorf("max_batch_total_tokens %d, want %d", got, want)
			}
			if got, want := number(t, doc, "max_total_tokens"), cfg.maxContextTokens(); got != want {
				t.Errorf("max_total_tokens %d, want %d", got, want)
			}
			for _, path := range []string{"/get_server_info", "/server_info"} {
				if code, _, _ := getInfo(t, b, http.MethodGet, path); code != 404 {
					t.Errorf("SGLang's %s under tgi: %d, want 404", path, code)
				}
			}
		})
	}
}

func TestDialectInfoMethodsAndDown(t *testing.T) {
	for _, tc := range []struct{ dialect, path string }{
		{DialectSGLang, "/get_server_info"}, {DialectSGLang, "/server_info"}, {DialectTGI, "/info"},
	} {
		t.Run(tc.dialect+tc.path, func(t *testing.T) {
			b := startBackend(t, func(c *Config) { fastConfig(c); c.Dialect = tc.dialect })
			if code, _, _ := getInfo(t, b, http.MethodHead, tc.path); code != 200 {
				t.Errorf("HEAD: %d, want 200", code)
			}
			code, h, _ := getInfo(t, b, http.MethodPost, tc.path)
			if code != 405 || h.Get("Allow") != "GET, HEAD" {
				t.Errorf("POST: %d Allow %q, want 405 GET, HEAD", code, h.Get("Allow"))
			}
			control(t, b, `{"down":true}`)
			if code, _, _ := getInfo(t, b, http.MethodGet, tc.path); code != 503 {
				t.Errorf("GET while down: %d, want 503", code)
			}
			control(t, b, `{}`)
			if code, _, _ := getInfo(t, b, http.MethodGet, tc.path); code != 200 {
				t.Errorf("GET back up: %d, want 200", code)
			}
		})
	}
}

func TestDialectVLLMHasNoInfo(t *testing.T) {
	b := startBackend(t, fastConfig)
	for _, path := range []string{"/get_server_info", "/server_info", "/info"} {
		if code, _, _ := getInfo(t, b, http.MethodGet, path); code != 404 {
			t.Errorf("%s under vllm: %d, want 404 (vLLM states no batch limit)", path, code)
		}
	}
}

func TestDialectTGIOverloaded(t *testing.T) {
	const limit = 2
	b := startBackend(t, func(c *Config) {
		fastConfig(c)
		c.ITL = 5 * time.Millisecond
		c.MaxNumSeqs = 1
		c.Dialect, c.MaxConcurrentRequests = DialectTGI, limit
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first := post(ctx, t, b.URL()+"/v1/chat/completions", chatBody(t, "held one", 2000, true, false))
	defer first.Body.Close()
	secondCtx, leave := context.WithCancel(t.Context())
	defer leave()
	second := post(secondCtx, t, b.URL()+"/v1/chat/completions", chatBody(t, "held two", 2000, true, false))
	defer second.Body.Close()
	if first.StatusCode != 200 || second.StatusCode != 200 {
		t.Fatalf("within the limit: %d, %d, want 200", first.StatusCode, second.StatusCode)
	}
	waitMetric(t, b, "tgi_batch_current_size", 1, 5*time.Second)
	waitMetric(t, b, "tgi_queue_size", 1, 5*time.Second)

	refuse := func(path string, body []byte) {
		t.Helper()
		resp := post(t.Context(), t, b.URL()+path, body)
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusTooManyRequests || string(got) != tgiOverloaded ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s past the limit: %d %q (%s), want 429 %q", path, resp.StatusCode, got,
				resp.Header.Get("Content-Type"), tgiOverloaded)
		}
	}
	refuse("/v1/chat/completions", chatBody(t, "one too many", 5, false, false))
	refuse("/v1/completions", []byte(`{"prompt":"one more too many","max_tokens":5,"stream":true}`))
	if got := scrape(t, b, `tgi_request_failure{err="overloaded"}`); got != 2 {
		t.Errorf(`tgi_request_failure{err="overloaded"} = %v, want 2`, got)
	}

	leave() // the queued one leaves: one is held, so one more fits
	waitMetric(t, b, "tgi_queue_size", 0, 5*time.Second)
	// A stream answers 200 as soon as the engine takes it in, queued behind the first.
	resp := post(ctx, t, b.URL()+"/v1/completions", []byte(`{"prompt":"fits again","max_tokens":2,"stream":true}`))
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("within the limit again: %d, want 200", resp.StatusCode)
	}
	if got := scrape(t, b, `tgi_request_failure{err="overloaded"}`); got != 2 {
		t.Errorf(`tgi_request_failure{err="overloaded"} = %v after a served request, want still 2`, got)
	}
}

func TestDialectLimitOnlyUnderTGI(t *testing.T) {
	for _, d := range []string{"", DialectVLLM, DialectSGLang} {
		cfg := DefaultConfig()
		cfg.Dialect, cfg.MaxConcurrentRequests = d, 4
		if b, err := Start(t.Context(), cfg); err == nil {
			_ = b.Close()
			t.Errorf("dialect %q with max_concurrent_requests started, want the config refused", d)
		} else if !strings.Contains(err.Error(), "max_concurrent_requests") {
			t.Errorf("dialect %q: error %v, want one naming max_concurrent_requests", d, err)
		}
	}
}

func TestEngineGenThroughput(t *testing.T) {
	// One sequence decoding at 20 ms a step generates 50 tokens in any second: last_gen_throughput is 50.
	cfg := DefaultConfig()
	h := newHarness(t, cfg)
	h.submit(0, 100, 1000, nil) // decodes from about 20ms to 20s
	h.runUntil(3 * time.Second)
	h.e.mu.Lock()
	got := h.e.genThroughput(h.clk.t)
	h.e.mu.Unlock()
	if want := float64(time.Second / cfg.ITL); got != want {
		t.Errorf("throughput while decoding = %v tokens/s, want %v", got, want)
	}
	h.runIdle()
	h.runUntil(h.clk.t.Sub(t0) + throughputWindow)
	h.e.mu.Lock()
	got = h.e.genThroughput(h.clk.t)
	kept := len(h.e.gen) - h.e.genHead
	h.e.mu.Unlock()
	if got != 0 {
		t.Errorf("throughput a window after the last token = %v, want 0", got)
	}
	if limit := int(throughputWindow/cfg.ITL) + 1; kept > limit {
		t.Errorf("the window keeps %d entries, want at most %d (one per step of the last window)", kept, limit)
	}
	h.e.restart()
	if got := h.e.throughput(); got != 0 {
		t.Errorf("throughput after a restart = %v, want 0", got)
	}
}

// gathered returns the value of the first sample of family name in m's registry (-1 if absent).
func gathered(t *testing.T, m *metrics, name string) float64 {
	t.Helper()
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			mm := f.GetMetric()[0]
			if mm.Counter != nil {
				return mm.Counter.GetValue()
			}
			return mm.Gauge.GetValue()
		}
	}
	return -1
}

func TestEngineSGLangPromptTokensCountLookups(t *testing.T) {
	// SGLang's prompt_tokens_total is the prefix cache's lookups: a prompt counts when it is scheduled, not at
	// its first token, so hits/queries never exceeds 1 while a long prefill is under way.
	cfg := DefaultConfig()
	cfg.Dialect = DialectSGLang
	h := newHarness(t, cfg)
	const prompt = 10000 // 4096 tokens a step: three steps of prefill
	h.submit(0, prompt, 10, nil)
	h.runUntil(cfg.Overhead + time.Millisecond) // scheduled, first chunk under way
	if got := gathered(t, h.e.m, "sglang:prompt_tokens_total"); got != prompt {
		t.Errorf("sglang:prompt_tokens_total = %v while the prompt prefills, want %v", got, prompt)
	}
	if got := gathered(t, h.e.m, "sglang:generation_tokens_total"); got != 0 {
		t.Errorf("sglang:generation_tokens_total = %v before the first token, want 0", got)
	}
	if got := gathered(t, h.e.m, "vllm:prompt_tokens_total"); got != -1 {
		t.Errorf("vllm:prompt_tokens_total exported under sglang")
	}
}
