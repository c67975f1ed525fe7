package sim

import (
	"cmp"
	"maps"
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

// metrics is one simulated backend's Prometheus registry, in the names of its Config.Dialect (dialectNames), each
// with a model_name label but TGI's, which carries none. An engine restart replaces it whole (counters of a
// restarted process start from zero); the engine swaps it under its lock and the /metrics handler reads the
// current one through engine.registry.
//
// Every field is set in every dialect, so the engine counts without asking which one it runs: a collector the
// dialect does not export (TGI's KV and prefix figures, vLLM's prompt tokens under SGLang) counts but is not
// registered.
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
	// overloaded counts requests refused past Config.MaxConcurrentRequests (TGI's
	// tgi_request_failure{err="overloaded"}).
	overloaded prometheus.Counter

	// loopLag is the simulator's own health, not vLLM's: how late the engine loop processed each step's end
	// against the step's nominal time. Tokens reach clients that much late (the schedule itself does not slip),
	// so a large lag means the machine, not the model, is adding latency.
	loopLag prometheus.Histogram
}

// metricNames are one dialect's names for the metrics struct's collectors; an empty name is not exported.
type metricNames struct {
	running, waiting, kvUsage, gpuUsage   string
	prefixQueries, prefixHits, preempts   string
	promptTokens, genTokens               string
	ttft, itl, e2e, success, overloaded   string
	cacheInfo                             string
	blockSizeLabel, blocksLabel           string            // cacheInfo's labels for the block size and count
	cacheInfoExtra                        prometheus.Labels // cacheInfo's other labels
	startTime                             bool              // process_start_time_seconds
	modelLabel                            bool              // a model_name label on the dialect's own metrics
	runningHelp, waitingHelp, kvUsageHelp string
}

// dialectNames are the names each dialect exports, as docs/engines.md lists them with their sources (the same
// names routing/engines.go's built-in engines read). vLLM's are exactly what the simulator always served.
var dialectNames = map[string]metricNames{
	DialectVLLM: {
		running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting",
		kvUsage: "vllm:kv_cache_usage_perc", gpuUsage: "vllm:gpu_cache_usage_perc",
		prefixQueries: "vllm:prefix_cache_queries_total", prefixHits: "vllm:prefix_cache_hits_total",
		preempts: "vllm:num_preemptions_total", promptTokens: "vllm:prompt_tokens_total",
		genTokens: "vllm:generation_tokens_total", ttft: "vllm:time_to_first_token_seconds",
		itl: "vllm:inter_token_latency_seconds", e2e: "vllm:e2e_request_latency_seconds",
		success: "vllm:request_success_total", cacheInfo: "vllm:cache_config_info",
		blockSizeLabel: "block_size", blocksLabel: "num_gpu_blocks",
		cacheInfoExtra: prometheus.Labels{"enable_prefix_caching": "True"},
		startTime:      true, modelLabel: true,
		runningHelp: "Number of requests in model execution batches.",
		waitingHelp: "Number of requests waiting to be processed.",
		kvUsageHelp: "KV-cache usage. 1 means 100 percent usage.",
	},
	// SGLang's prompt_tokens_total is the prefix cache's query count here (every prompt token looked up, as
	// vllm:prefix_cache_queries_total), so that cached_tokens_total / prompt_tokens_total is the hit rate, as
	// SGLang's own ratio reads.
	DialectSGLang: {
		running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs", kvUsage: "sglang:token_usage",
		prefixQueries: "sglang:prompt_tokens_total", prefixHits: "sglang:cached_tokens_total",
		preempts: "sglang:num_retracted_reqs_total", genTokens: "sglang:generation_tokens_total",
		ttft: "sglang:time_to_first_token_seconds", itl: "sglang:inter_token_latency_seconds",
		e2e: "sglang:e2e_request_latency_seconds", cacheInfo: "sglang:cache_config_info",
		blockSizeLabel: "page_size", blocksLabel: "num_pages",
		startTime: true, modelLabel: true,
		runningHelp: "The number of running requests.",
		waitingHelp: "The number of requests in the waiting queue.",
		kvUsageHelp: "The token usage of the KV cache, 0 to 1.",
	},
	// TGI's router exports no KV-cache, prefix-cache or process metrics, and no model label.
	DialectTGI: {
		running: "tgi_batch_current_size", waiting: "tgi_queue_size", overloaded: "tgi_request_failure",
		runningHelp: "Current batch size.",
		waitingHelp: "Current queue size.",
	},
}

func newMetrics(cfg Config, start time.Time) *metrics {
	names := dialectNames[cfg.dialect()]
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": cfg.Model}
	own := labels // the dialect's own metrics' labels
	if !names.modelLabel {
		own = nil
	}
	register := func(name string, c prometheus.Collector) {
		if name != "" {
			reg.MustRegister(c)
		}
	}
	// valid names a collector the dialect does not export: it counts, nobody reads it, and the client library
	// gets a well-formed name.
	valid := func(name string) string { return cmp.Or(name, "sim_unexported") }
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: valid(name), Help: help, ConstLabels: own})
		register(name, g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: valid(name), Help: help, ConstLabels: own})
		register(name, c)
		return c
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: valid(name), Help: help, ConstLabels: own,
			Buckets: buckets})
		register(name, h)
		return h
	}
	m := &metrics{
		reg:     reg,
		running: gauge(names.running, names.runningHelp),
		waiting: gauge(names.waiting, names.waitingHelp),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sim_requests_pending", ConstLabels: labels,
			Help: "Requests received but not yet in the scheduler's queue: in their overhead or an injected stall."}),
		kvUsage: gauge(names.kvUsage, names.kvUsageHelp),
		gpuUsage: gauge(names.gpuUsage,
			"GPU KV-cache usage. 1 means 100 percent usage (deprecated name of vllm:kv_cache_usage_perc)."),
		prefixQueries: counter(names.prefixQueries, "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:    counter(names.prefixHits, "Prefix cache hits, in terms of number of cached tokens."),
		preemptions:   counter(names.preempts, "Cumulative number of preemption from the engine."),
		promptTokens:  counter(names.promptTokens, "Number of prefill tokens processed."),
		genToken:      counter(names.genTokens, "Number of generation tokens processed."),
		ttft:          hist(names.ttft, "Histogram of time to first token in seconds.", ttftBuckets),
		itl:           hist(names.itl, "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:           hist(names.e2e, "Histogram of e2e request latency in seconds.", e2eBuckets),
		success:       make(map[string]prometheus.Counter),
		loopLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sim_engine_loop_lag_seconds", ConstLabels: labels,
			Help:    "How late the simulator's engine loop ended each step, against the step's nominal end time.",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2},
		}),
	}
	reg.MustRegister(m.pending, m.loopLag)
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: valid(names.success), Help: "Count of successfully processed requests.", ConstLabels: own,
	}, []string{"finished_reason"})
	register(names.success, success)
	for _, r := range []string{reasonStop, reasonLength, reasonAbort} {
		m.success[r] = success.WithLabelValues(r)
	}
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: valid(names.overloaded), Help: "Number of failed requests.", ConstLabels: own,
	}, []string{"err"})
	register(names.overloaded, failures)
	m.overloaded = failures.WithLabelValues("overloaded")
	if names.cacheInfo != "" {
		info := prometheus.Labels{
			names.blockSizeLabel: strconv.Itoa(cfg.blockSize()), names.blocksLabel: strconv.Itoa(cfg.KVBlocks),
		}
		maps.Copy(info, names.cacheInfoExtra)
		cacheInfo := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: names.cacheInfo, Help: "Information of the LLMEngine CacheConfig", ConstLabels: info,
		})
		cacheInfo.Set(1)
		reg.MustRegister(cacheInfo)
	}
	if names.startTime {
		startTime := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "process_start_time_seconds", Help: "Start time of the simulated engine since unix epoch in seconds.",
		})
		startTime.Set(float64(start.UnixNano()) / 1e9)
		reg.MustRegister(startTime)
	}
	return m
}

func (m *metrics) setUsage(u float64) {
	m.kvUsage.Set(u)
	m.gpuUsage.Set(u)
}
