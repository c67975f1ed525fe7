package routing

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vllmText returns a vLLM-style exposition (v1 names unless old) with the given gauges, padded with the large
// histograms a real engine exports.
func vllmText(waiting, running, kv float64, blocks int, start float64, old bool) string {
	var b strings.Builder
	kvName := "vllm:kv_cache_usage_perc"
	if old {
		kvName = "vllm:gpu_cache_usage_perc"
	}
	fmt.Fprintf(&b, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n")
	fmt.Fprintf(&b, "# TYPE vllm:num_requests_running gauge\n")
	fmt.Fprintf(&b, "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} %g\n", running)
	fmt.Fprintf(&b, "# TYPE vllm:num_requests_waiting gauge\n")
	fmt.Fprintf(&b, "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %g\n", waiting)
	fmt.Fprintf(&b, "# TYPE %s gauge\n%s{engine=\"0\",model_name=\"m\"} %g\n", kvName, kvName, kv)
	fmt.Fprintf(&b, "# TYPE vllm:num_preemptions_total counter\n")
	fmt.Fprintf(&b, "vllm:num_preemptions_total{engine=\"0\",model_name=\"m\"} 3.0\n")
	fmt.Fprintf(&b, "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1000.0\n")
	fmt.Fprintf(&b, "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 600.0\n")
	for _, h := range []string{"time_to_first_token_seconds", "inter_token_latency_seconds",
		"e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
		"request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens",
		"iteration_tokens_total", "request_params_max_tokens", "request_time_per_output_token_seconds",
		"request_inference_time_seconds"} {
		fmt.Fprintf(&b, "# HELP vllm:%s A histogram.\n# TYPE vllm:%s histogram\n", h, h)
		for i := range 40 {
			fmt.Fprintf(&b, "vllm:%s_bucket{engine=\"0\",le=\"%g\",model_name=\"m\"} %d\n", h, 0.001*float64(int(1)<<(i%20)), i*7)
		}
		fmt.Fprintf(&b, "vllm:%s_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 280\n", h)
		fmt.Fprintf(&b, "vllm:%s_sum{engine=\"0\",model_name=\"m\"} 12.5\nvllm:%s_count{engine=\"0\",model_name=\"m\"} 280\n", h, h)
	}
	fmt.Fprintf(&b, "# TYPE vllm:cache_config_info gauge\n")
	fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",num_gpu_blocks=\"%d\",prefix_caching_hash_algo=\"sha256\"} 1.0\n", blocks)
	fmt.Fprintf(&b, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %g\n", start)
	return b.String()
}

func parse(t testing.TB, engine, text string) *EngineStats {
	t.Helper()
	s := &EngineStats{}
	if err := BuiltinEngine(engine).ParseMetrics(strings.NewReader(text), nil, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParseVLLM(t *testing.T) {
	for _, old := range []bool{false, true} {
		s := parse(t, EngineVLLM, vllmText(3, 17, 0.42, 8192, 1.7e9, old))
		if s.Waiting != 3 || s.Running != 17 || s.KVUsage != 0.42 {
			t.Fatalf("old=%v: waiting %v running %v kv %v", old, s.Waiting, s.Running, s.KVUsage)
		}
		if s.BlockSize != 16 || s.NumGPUBlocks != 8192 || s.StartTime != 1.7e9 || s.Preemptions != 3 {
			t.Fatalf("old=%v: block %d blocks %d start %v preemptions %v", old, s.BlockSize, s.NumGPUBlocks,
				s.StartTime, s.Preemptions)
		}
		if s.PrefixHits != 600 || s.PrefixQueries != 1000 {
			t.Fatalf("prefix counters %v/%v", s.PrefixHits, s.PrefixQueries)
		}
		want := HasWaiting | HasRunning | HasKVUsage | HasCacheConfig | HasPreemptions | HasPrefixCounters | HasStartTime
		if s.Has&want != want {
			t.Fatalf("old=%v: has %b, want %b", old, s.Has, want)
		}
	}
}

func TestParseNewKVNameWinsInEitherOrder(t *testing.T) {
	for _, text := range []string{
		"vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.3\n",
		"vllm:kv_cache_usage_perc 0.3\nvllm:gpu_cache_usage_perc 0.9\n",
	} {
		if s := parse(t, EngineVLLM, text); s.KVUsage != 0.3 {
			t.Fatalf("%q: kv %v, want 0.3", text, s.KVUsage)
		}
	}
}

func TestParseSGLang(t *testing.T) {
	s := parse(t, EngineSGLang, `# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 5
sglang:num_running_reqs{model_name="m"} 9
sglang:token_usage{model_name="m"} 0.61
sglang:max_total_num_tokens{model_name="m"} 500000
sglang:num_retracted_reqs_total{model_name="m"} 2
sglang:cached_tokens_total{model_name="m"} 70
sglang:prompt_tokens_total{model_name="m"} 100
`)
	if s.Waiting != 5 || s.Running != 9 || s.KVUsage != 0.61 || s.Preemptions != 2 {
		t.Fatalf("got %+v", s)
	}
	if s.BlockSize != 1 || s.NumGPUBlocks != 500000 || s.PrefixHits != 70 || s.PrefixQueries != 100 {
		t.Fatalf("capacity %d x %d, prefix %v/%v", s.NumGPUBlocks, s.BlockSize, s.PrefixHits, s.PrefixQueries)
	}
}

func TestParseEdgeCases(t *testing.T) {
	long := "vllm:some_info{x=\"" + strings.Repeat("y", 100_000) + "\"} 1\n"
	text := "# HELP vllm:num_requests_waiting with a \"quote\"\n" +
		// Two data-parallel ranks: counts add up, usage takes the larger.
		"vllm:num_requests_waiting{engine=\"0\",model_name=\"a\\\"}b\"} 2 1700000000000\n" +
		"vllm:num_requests_waiting{engine=\"1\"} 1\r\n" +
		"vllm:kv_cache_usage_perc{engine=\"0\"} 0.2\n" +
		"vllm:kv_cache_usage_perc{engine=\"1\"} 0.7\n" +
		long +
		"vllm:num_requests_running NaN\n" +
		"vllm:num_requests_running{broken=\"} 4\n" +
		"vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"oops\"} 1\n" +
		"process_start_time_seconds 1.5e+09\n" +
		"# EOF\n"
	s := parse(t, EngineVLLM, text)
	if s.Waiting != 3 || s.KVUsage != 0.7 || s.StartTime != 1.5e9 {
		t.Fatalf("waiting %v kv %v start %v", s.Waiting, s.KVUsage, s.StartTime)
	}
	if s.Has&(HasRunning|HasCacheConfig) != 0 {
		t.Fatalf("malformed lines were used: has %b running %v", s.Has, s.Running)
	}
}

func TestLabelInt(t *testing.T) {
	for _, tc := range []struct {
		labels, name string
		want         int
	}{
		{`block_size="16",num_gpu_blocks="2048"`, "num_gpu_blocks", 2048},
		{`a="x\"y",block_size="16"`, "block_size", 16},
		{` block_size = "16" `, "block_size", -1}, // space before the quote is not the text format
		{`block_size="16"`, "num_gpu_blocks", -1},
		{`block_size="16`, "block_size", -1},
		{``, "x", -1},
	} {
		if got := labelInt([]byte(tc.labels), tc.name); got != tc.want {
			t.Errorf("labelInt(%q, %q) = %d, want %d", tc.labels, tc.name, got, tc.want)
		}
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add(vllmText(1, 2, 0.5, 100, 1, false))
	f.Add("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"7\"} 1\n")
	f.Add("sglang:num_queue_reqs{a=\"\\\\\"} 3 4\n")
	f.Add("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"} 7\n")
	f.Fuzz(func(t *testing.T, text string) {
		for _, name := range BuiltinEngineNames() {
			s := &EngineStats{}
			if err := BuiltinEngine(name).ParseMetrics(strings.NewReader(text), nil, s); err != nil {
				t.Fatal(err)
			}
			if s.KVUsage != 0 && s.Has&HasKVUsage == 0 {
				t.Fatalf("%s: kv usage set without the flag", name)
			}
			if s.Has&HasCacheConfig != 0 && (s.BlockSize < 1 || s.NumGPUBlocks < 1) {
				t.Fatalf("%s: capacity %d x %d", name, s.NumGPUBlocks, s.BlockSize)
			}
		}
	})
}

// BenchmarkParseMetrics parses a vLLM exposition of about 500 lines, mostly histograms; compare with
// BenchmarkParseExpfmt on the same text.
func BenchmarkParseMetrics(b *testing.B) {
	text := []byte(vllmText(3, 17, 0.42, 8192, 1.7e9, false))
	br := bufio.NewReaderSize(nil, 16<<10)
	vllm := BuiltinEngine(EngineVLLM)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		var s EngineStats
		if err := vllm.ParseMetrics(bytes.NewReader(text), br, &s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseExpfmt parses the same text with prometheus/common's expfmt, which builds every family.
func BenchmarkParseExpfmt(b *testing.B) {
	text := []byte(vllmText(3, 17, 0.42, 8192, 1.7e9, false))
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		p := expfmt.NewTextParser(model.UTF8Validation)
		if _, err := p.TextToMetricFamilies(bytes.NewReader(text)); err != nil {
			b.Fatal(err)
		}
	}
}
