package routing

import (
	"bufio"
	"context"
	"encoding/pem"
	"math/bits"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// engineExpositions are one /metrics page per built-in engine, in the engine's own format (names, labels, other
// families around them), and the EngineStats a scrape must find in it. The names are those docs/engines.md
// cites.
var engineExpositions = []struct {
	engine, path, text string
	want               EngineStats       // Has, Waiting, Running, KVUsage, BlockSize, NumGPUBlocks, prefix, preemptions, start
	info               map[string]string // the engine's info documents by path, in its own shape
}{
	{engine: EngineVLLM, path: "/metrics", text: vllmText(2, 7, 0.5, 4096, 1e9, false), want: EngineStats{
		Waiting: 2, Running: 7, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 4096, Preemptions: 3,
		PrefixHits: 600, PrefixQueries: 1000, StartTime: 1e9, Has: AllSignals &^ (HasMaxSeqs | HasMaxInflight)}},
	{engine: EngineSGLang, path: "/metrics", text: `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 11.0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 4.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.9
sglang:cache_hit_rate{model_name="m",tp_rank="0"} 0.4
sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 300000
sglang:cache_config_info{model_name="m",page_size="16",num_pages="20000"} 1.0
sglang:num_retracted_reqs_total{model_name="m"} 1.0
sglang:cached_tokens_total{model_name="m"} 40.0
sglang:prompt_tokens_total{model_name="m"} 100.0
process_start_time_seconds 1.2e9
`, want: EngineStats{Waiting: 4, Running: 11, KVUsage: 0.9, BlockSize: 16, NumGPUBlocks: 20000, Preemptions: 1,
		PrefixHits: 40, PrefixQueries: 100, StartTime: 1.2e9, MaxSeqs: 96, MaxSeqsFrom: "/get_server_info",
		Has: AllSignals &^ HasMaxInflight},
		// Two data-parallel ranks of 48 seats; the top-level server argument is null (SGLang computed them).
		info: map[string]string{"/get_server_info": `{"model_path":"m","max_running_requests":null,"dp_size":2,` +
			`"internal_states":[{"last_gen_throughput":120.5,"memory_usage":{"token_capacity":20480},` +
			`"effective_max_running_requests_per_dp":48},{"effective_max_running_requests_per_dp":48}],` +
			`"version":"0.5.4"}`}},
	{engine: EngineTGI, path: "/metrics", text: `# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 5
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 9000
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_request_count counter
tgi_request_count 1200
`, want: EngineStats{Waiting: 3, Running: 5, MaxSeqs: 32, MaxSeqsFrom: "/info", MaxInflight: 128,
		MaxInflightFrom: "/info", Has: HasWaiting | HasRunning | HasMaxSeqs | HasMaxInflight},
		info: map[string]string{"/info": `{"model_id":"m","model_dtype":"torch.float16","model_device_type":"cuda",` +
			`"max_concurrent_requests":128,"max_best_of":2,"max_stop_sequences":4,"max_input_tokens":4095,` +
			`"max_total_tokens":4096,"max_batch_total_tokens":16000,"max_waiting_tokens":20,` +
			`"max_batch_size":32,"validation_workers":2,"version":"3.0.1"}`}},
	{engine: EngineTRTLLMServe, path: "/prometheus/metrics", text: `# TYPE trtllm_request_success_total counter
trtllm_request_success_total{finished_reason="stop",model_name="m"} 7.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="m"} 0.25
trtllm_kv_cache_hit_rate{engine_type="trtllm",model_name="m"} 0.5
`, want: EngineStats{KVUsage: 0.25, Has: HasKVUsage}},
	{engine: EngineTriton, path: "/metrics", text: `# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 6
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 8
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 14
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.4875
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 3042
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 3197
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6239
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 2
`, want: EngineStats{Waiting: 6, Running: 8, KVUsage: 0.4875, BlockSize: 64, NumGPUBlocks: 6239,
		MaxSeqs: 512, MaxSeqsFrom: "metrics", Has: HasWaiting | HasRunning | HasKVUsage | HasCacheConfig | HasMaxSeqs}},
	{engine: EngineNIM, path: "/v1/metrics", text: `# HELP num_requests_running Number of requests currently running on GPU.
# TYPE num_requests_running gauge
num_requests_running{model_name="meta/llama"} 9.0
num_requests_waiting{model_name="meta/llama"} 1.0
num_request_max{model_name="meta/llama"} 256.0
gpu_cache_usage_perc{model_name="meta/llama"} 0.75
process_start_time_seconds 1.3e9
`, want: EngineStats{Waiting: 1, Running: 9, KVUsage: 0.75, StartTime: 1.3e9, MaxSeqs: 256,
		MaxSeqsFrom: "metrics", Has: HasWaiting | HasRunning | HasKVUsage | HasStartTime | HasMaxSeqs}},
	{engine: EngineLlamaCpp, path: "/metrics", text: `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
llamacpp:kv_cache_tokens 512
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
`, want: EngineStats{Waiting: 1, Running: 2, KVUsage: 0.125, Has: HasWaiting | HasRunning | HasKVUsage}},
}

// exposition serves text at path on loopback, each of docs at its path as JSON, and answers /health.
func exposition(t *testing.T, path, text string, docs ...map[string]string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, d := range docs {
			if body, ok := d[r.URL.Path]; ok {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(body))
				return
			}
		}
		switch r.URL.Path {
		case path:
			_, _ = w.Write([]byte(text))
		case "/health":
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestScrapeEachBuiltinEngine(t *testing.T) {
	var covered []string
	for _, tc := range engineExpositions {
		covered = append(covered, tc.engine)
		t.Run(tc.engine, func(t *testing.T) {
			srv := exposition(t, tc.path, tc.text, tc.info)
			s, b, _ := scraperFor(t, srv.URL, tc.engine)
			settled(t, s)
			got := *b.Engine()
			got.At, got.sent = time.Time{}, time.Time{}
			if got != tc.want {
				t.Fatalf("scraped\n%+v\nwant\n%+v", got, tc.want)
			}
			st := b.Status()
			if st.Stale || !slices.Equal(st.Signals, SignalsOf(tc.want.Has)) || len(st.Missing) != 0 {
				t.Fatalf("status: stale %v signals %v missing %v", st.Stale, st.Signals, st.Missing)
			}
			if want := SignalsOf(AllSignals &^ tc.want.Has); !slices.Equal(st.Lacks, want) {
				t.Fatalf("lacks %v, want %v", st.Lacks, want)
			}
		})
	}
	if want := slices.DeleteFunc(BuiltinEngineNames(), func(n string) bool { return n == EngineOpenAIHosted }); !slices.Equal(slices.Sorted(slices.Values(covered)), want) {
		t.Fatalf("expositions cover %v, built-in engines are %v", covered, want)
	}
}

func TestEngineWithFewerSignalsDegrades(t *testing.T) {
	// TGI exports no KV usage: routing sees its queue and batch, and the gateway's own counts stand in for the
	// rest. A scrape that lacks a signal the spec lists reports it missing, not zero.
	srv := exposition(t, "/metrics", "tgi_queue_size 2\n")
	s, b, clk := scraperFor(t, srv.URL, EngineTGI)
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		a := b.Begin(100)
		a.FirstToken()
	}
	l := b.loadAt(clk.Now())
	if !l.fresh || l.waiting != 2 || l.running != 3 || l.kv != 0 {
		t.Fatalf("load %+v: want the engine's queue (2) and the gateway's 3 decoding", l)
	}
	// Nor does it serve /info here: the seats and the ceiling it would state are missing too.
	if st := b.Status(); !slices.Equal(st.Missing, []string{"running", "max_seqs", "max_inflight"}) ||
		slices.Contains(st.Signals, "kv_usage") {
		t.Fatalf("status signals %v missing %v", st.Signals, st.Missing)
	}
}

func TestOperatorEngine(t *testing.T) {
	// An engine the gateway does not know, described as data: its own path, a percentage, a label filter and
	// capacity from two gauges.
	spec := NewEngineSpec(EngineSpec{Name: "mine", MetricsPath: "/stats", Signals: [NumSignals][]Series{
		SignalRunning:     {{Name: "mine_requests", Labels: map[string]string{"state": "running"}}},
		SignalWaiting:     {{Name: "mine_requests", Labels: map[string]string{"state": "queued"}}},
		SignalKVUsage:     {{Name: "mine_kv_percent", Percent: true}},
		SignalKVBlocks:    {{Name: "mine_kv_blocks"}},
		SignalKVBlockSize: {{Name: "mine_kv_info", ValueLabel: "block"}},
	}})
	srv := exposition(t, "/stats", `mine_requests{state="running"} 4
mine_requests{state="queued"} 2
mine_requests{state="done"} 90
mine_kv_percent 42
mine_kv_blocks 100
mine_kv_info{block="32"} 1
`)
	reg := NewRegistry(WithClock(newFakeClock()))
	b := reg.Sync([]*BackendConfig{{Name: "e", URL: srv.URL, Engine: "mine", EngineSpec: spec}})[0]
	m := NewMonitor(reg, MonitorOptions{Timeout: 5 * time.Second})
	t.Cleanup(m.client.CloseIdleConnections)
	s := &scraper{m: m, b: b, br: bufio.NewReader(nil)}
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := b.Engine()
	if e.Running != 4 || e.Waiting != 2 || e.KVUsage != 0.42 || e.BlockSize != 32 || e.NumGPUBlocks != 100 {
		t.Fatalf("got %+v", e)
	}
	if spec.IdleProbes || s.idleProbeDue() {
		t.Fatal("an engine that does not allow idle probes gets them")
	}
}

func TestUnscrapedEngineHasNoSignals(t *testing.T) {
	for _, name := range []string{EngineOpenAIHosted, EngineOpenAI, "no-such-engine"} {
		cfg := &BackendConfig{Name: "h", URL: "http://127.0.0.1:1", Engine: name}
		if sp := cfg.Spec(); sp.Scrapes() || sp.IdleProbes || sp.Exports() != 0 {
			t.Fatalf("%s: scrapes %v idle %v exports %b", name, sp.Scrapes(), sp.IdleProbes, sp.Exports())
		}
		st := NewBackend(cfg).Status()
		if st.Stale || len(st.Signals) != 0 || len(st.Lacks) != int(bits.OnesCount16(uint16(AllSignals))) {
			t.Fatalf("%s: status %+v", name, st)
		}
	}
}

func TestMetricsPort(t *testing.T) {
	spec := NewEngineSpec(EngineSpec{MetricsPath: "/metrics", MetricsPort: 8002})
	if got := metricsURL("https://triton.internal:8000/base", spec); got != "https://triton.internal:8002/base/metrics" {
		t.Fatal(got)
	}
	if got := metricsURL("http://[::1]:8000", spec); got != "http://[::1]:8002/metrics" {
		t.Fatal(got)
	}
}

func TestScrapeHostedTLSWithHeaders(t *testing.T) {
	// A backend behind TLS with a private CA and its own auth header: the Monitor scrapes it with the same CA,
	// headers and key the proxy uses, and fails without the CA.
	var mu sync.Mutex
	var seen http.Header
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Header.Clone()
		mu.Unlock()
		if r.Header.Get("Api-Key") != "k1" || r.Header.Get("Authorization") != "Bearer sk" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("vllm:num_requests_waiting 5\n"))
	}))
	defer srv.Close()
	ca, err := NewCABundle(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	if err != nil {
		t.Fatal(err)
	}
	s, b, _ := scraperFor(t, srv.URL, EngineVLLM)
	defer s.closeCA()
	if err := s.scrape(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("scrape without the CA: %v, want a certificate error", err)
	}
	cfg := *b.Config()
	cfg.CA, cfg.APIKey = ca, "sk"
	cfg.Headers = []Header{{Name: "api-key", Value: "k1"}}
	b.cfg.Store(&cfg)
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e := b.Engine(); e.Waiting != 5 {
		t.Fatalf("waiting %v", e.Waiting)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen.Get("Api-Key") != "k1" || seen.Get("Authorization") != "Bearer sk" {
		t.Fatalf("scrape headers %v", seen)
	}
}

func TestPathTemplate(t *testing.T) {
	for _, tc := range []struct{ tmpl, path, model, want, err string }{
		{"/openai/deployments/{model}/{endpoint}", "/v1/chat/completions", "gpt-4o", "/openai/deployments/gpt-4o/chat/completions", ""},
		{"/{endpoint}", "/v1/embeddings", "m", "/embeddings", ""},
		{"/models/{model}:generate", "/v1/completions", "meta/llama 3?", "/models/meta%2Fllama%203%3F:generate", ""},
		{"openai/{model}", "", "", "", "must start with /"},
		{"/x/{deployment}", "", "", "", "unknown placeholder {deployment} (one of: {model}, {endpoint})"},
		{"/x/{model", "", "", "", "unbalanced { }: write {model} or {endpoint}"},
		{"/x?y=1", "", "", "", "must be a path, without query, fragment or white space (give query parameters in query)"},
	} {
		pt, err := ParsePathTemplate(tc.tmpl)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: error %v, want %q", tc.tmpl, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := string(pt.AppendPath([]byte("/base"), []byte(tc.path), tc.model)); got != "/base"+tc.want {
			t.Errorf("%q: %q, want %q", tc.tmpl, got, "/base"+tc.want)
		}
	}
	var none *PathTemplate
	if got := string(none.AppendPath([]byte("/base"), []byte("/v1/completions"), "m")); got != "/base/v1/completions" {
		t.Errorf("no template: %q", got)
	}
}
