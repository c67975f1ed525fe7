package sim

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Finish reasons, as vLLM labels vllm:request_success_total.
const (
	reasonLength = "length"
	reasonStop   = "stop"
	reasonAbort  = "abort"
)

// Histogram buckets as vLLM's (v1 engine) metrics define them, in seconds.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
		10.0, 20.0, 40.0, 80.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
		120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// metrics is one simulated backend's Prometheus registry in vLLM's names, each with a model_name label. An
// engine restart replaces it whole (counters of a restarted process start from zero); the engine swaps it under
// its lock and the /metrics handler reads the current one through engine.registry.
type metrics struct {
	reg *prometheus.Registry

	running, waiting       prometheus.Gauge
	pending                prometheus.Gauge // sim_requests_pending
	kvUsage, gpuUsage      prometheus.Gauge
	prefixQueries          prometheus.Counter
	prefixHits             prometheus.Counter
	preemptions            prometheus.Counter
	promptTokens, genToken prometheus.Counter
	ttft, itl, e2e         prometheus.Histogram
	success                map[string]prometheus.Counter

	// loopLag is the simulator's own health, not vLLM's: how late the engine loop processed each step's end
	// against the step's nominal time. Tokens reach clients that much late (the schedule itself does not slip),
	// so a large lag means the machine, not the model, is adding latency.
	loopLag prometheus.Histogram
}

func newMetrics(model string, kvBlocks, blockSize int, start time.Time) *metrics {
	labels := prometheus.Labels{"model_name": model}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels,
			Buckets: buckets})
	}
	m := &metrics{
		reg:     prometheus.NewRegistry(),
		running: gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting: gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		pending: gauge("sim_requests_pending",
			"Requests received but not yet in the scheduler's queue: in their overhead or an injected stall."),
		kvUsage: gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		gpuUsage: gauge("vllm:gpu_cache_usage_perc",
			"GPU KV-cache usage. 1 means 100 percent usage (deprecated name of vllm:kv_cache_usage_perc)."),
		prefixQueries: counter("vllm:prefix_cache_queries_total",
			"Prefix cache queries, in terms of number of queried tokens."),
		prefixHits: counter("vllm:prefix_cache_hits_total",
			"Prefix cache hits, in terms of number of cached tokens."),
		preemptions:  counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		promptTokens: counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genToken:     counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		ttft:         hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:          hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e: hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
			e2eBuckets),
		success: make(map[string]prometheus.Counter),
		loopLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sim_engine_loop_lag_seconds", ConstLabels: labels,
			Help:    "How late the simulator's engine loop ended each step, against the step's nominal end time.",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2},
		}),
	}
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	for _, r := range []string{reasonStop, reasonLength, reasonAbort} {
		m.success[r] = success.WithLabelValues(r)
	}
	cacheInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"block_size": strconv.Itoa(blockSize), "num_gpu_blocks": strconv.Itoa(kvBlocks),
			"enable_prefix_caching": "True",
		},
	})
	cacheInfo.Set(1)
	startTime := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "process_start_time_seconds", Help: "Start time of the simulated engine since unix epoch in seconds.",
	})
	startTime.Set(float64(start.UnixNano()) / 1e9)
	m.reg.MustRegister(m.running, m.waiting, m.pending, m.kvUsage, m.gpuUsage, m.prefixQueries, m.prefixHits, m.preemptions,
		m.promptTokens, m.genToken, m.ttft, m.itl, m.e2e, success, cacheInfo, startTime, m.loopLag)
	return m
}

func (m *metrics) setUsage(u float64) {
	m.kvUsage.Set(u)
	m.gpuUsage.Set(u)
}
