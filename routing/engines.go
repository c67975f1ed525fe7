package routing

import (
	"maps"
	"slices"
)

// Built-in engine names: the keys of the built-in engines table (BuiltinEngines), which the policy's own
// engines table overrides and extends. docs/engines.md lists each entry's metric names and the documents they
// come from.
const (
	EngineVLLM         = "vllm"          // vLLM
	EngineSGLang       = "sglang"        // SGLang
	EngineTGI          = "tgi"           // Hugging Face Text Generation Inference
	EngineTRTLLMServe  = "trtllm-serve"  // TensorRT-LLM's own OpenAI-compatible server
	EngineTriton       = "triton"        // Triton Inference Server with the TensorRT-LLM backend
	EngineNIM          = "nim"           // NVIDIA NIM for LLMs
	EngineLlamaCpp     = "llamacpp"      // llama.cpp's llama-server (started with --metrics)
	EngineOpenAIHosted = "openai-hosted" // a hosted OpenAI-compatible API: nothing to scrape, no idle probes
	// EngineOpenAI is the older name of EngineOpenAIHosted, still accepted so that existing policy files load.
	EngineOpenAI = "openai"
)

// DefaultMetricsPath is where engines publish their Prometheus exposition unless their entry says otherwise.
const DefaultMetricsPath = "/metrics"

// Signal is one load signal the gateway reads from an engine's metrics. Each one is optional: an engine that does
// not export it leaves its EngineStats field unset (absent from Has), and the gateway's own accounting stands in
// for it (see Backend.loadAt).
type Signal uint8

// The signals, in the order the policy's engines.*.metrics lists them.
const (
	// SignalRunning is the requests in the engine's running batch (EngineStats.Running); summed over samples.
	SignalRunning Signal = iota
	// SignalWaiting is the requests queued in the engine (EngineStats.Waiting); summed over samples.
	SignalWaiting
	// SignalKVUsage is the share of the KV cache in use (EngineStats.KVUsage), a fraction 0-1 or, with
	// Series.Percent, a percentage; the largest over samples.
	SignalKVUsage
	// SignalKVBlocks is the engine's number of KV blocks (EngineStats.NumGPUBlocks), summed over samples (ranks);
	// with SignalKVBlockSize it sizes the backend's share of the prefix index.
	SignalKVBlocks
	// SignalKVBlockSize is the tokens per KV block (EngineStats.BlockSize); 1 when the engine has blocks but does
	// not say their size (a capacity given in tokens).
	SignalKVBlockSize
	// SignalPrefixHits counts prompt tokens found in the engine's prefix cache (EngineStats.PrefixHits).
	SignalPrefixHits
	// SignalPrefixQueries counts prompt tokens looked up in the prefix cache (EngineStats.PrefixQueries).
	SignalPrefixQueries
	// SignalPreemptions counts preempted (or retracted) requests since the engine started
	// (EngineStats.Preemptions): new ones shrink the share of its KV capacity the prefix index assumes.
	SignalPreemptions
	// SignalStartTime is the engine process's start in Unix seconds (EngineStats.StartTime): a change is a
	// restart, which empties the backend's share of the prefix index.
	SignalStartTime
	// SignalMaxSeqs is the most sequences the engine runs at once, its batch limit (EngineStats.MaxSeqs):
	// Triton's nv_trt_llm_request_metrics{request_type="max"}, NIM's num_request_max. With it the gateway's
	// concurrency cap knows the engine's seats from the first scrape instead of learning them from a queue.
	// Summed over samples (data-parallel ranks).
	SignalMaxSeqs
	// NumSignals is the number of signals.
	NumSignals
)

var signalNames = [NumSignals]string{"running", "waiting", "kv_usage", "kv_blocks", "kv_block_size",
	"prefix_hits", "prefix_queries", "preemptions", "start_time", "max_seqs"}

// String returns the signal's name as the policy spells it (running, kv_usage, ...).
func (s Signal) String() string {
	if s < NumSignals {
		return signalNames[s]
	}
	return "unknown"
}

// field returns the EngineStats field the signal fills.
func (s Signal) field() EngineFields {
	switch s {
	case SignalRunning:
		return HasRunning
	case SignalWaiting:
		return HasWaiting
	case SignalKVUsage:
		return HasKVUsage
	case SignalKVBlocks, SignalKVBlockSize:
		return HasCacheConfig
	case SignalPrefixHits, SignalPrefixQueries:
		return HasPrefixCounters
	case SignalPreemptions:
		return HasPreemptions
	case SignalStartTime:
		return HasStartTime
	case SignalMaxSeqs:
		return HasMaxSeqs
	}
	return 0
}

// Series selects the samples of one metric that carry a signal.
type Series struct {
	// Name is the metric's name as exposed (for a counter, with its _total suffix).
	Name string
	// Labels keeps only the samples whose labels have these values (nv_trt_llm_request_metrics{request_type=
	// "waiting"}); nil keeps every sample.
	Labels map[string]string
	// ValueLabel, when set, reads the value from this label rather than from the sample value: an info metric
	// such as vllm:cache_config_info{num_gpu_blocks="8192"}. A sample without the label, or whose label is not a
	// number, is skipped.
	ValueLabel string
	// Percent says the value is a percentage (0-100), divided by 100 into the fraction EngineStats holds. Only
	// for SignalKVUsage.
	Percent bool
}

// EngineSpec says how to read one kind of engine's load: where its Prometheus exposition is, which series carry
// each signal, and whether the gateway may send it idle probes. Build one with NewEngineSpec; it is immutable
// afterwards and safe to share.
type EngineSpec struct {
	// Name is the engine's key in the engines table (vllm, sglang, or an operator's own).
	Name string
	// MetricsPath is the path of the engine's Prometheus exposition, appended to the backend's URL; "" means the
	// engine has nothing to scrape (its RTT is probed with a TCP connect, and routing uses the gateway's own
	// accounting alone).
	MetricsPath string
	// MetricsPort, when not 0, scrapes the metrics on this port of the backend's host instead of the URL's
	// (Triton's metrics listen on a port of their own).
	MetricsPort int
	// IdleProbes allows the Monitor's one-token completions to an idle backend (DefaultIdleProbeAfter). False for
	// hosted APIs that bill per request.
	IdleProbes bool
	// Signals lists, for each signal, the series that may carry it, in order of preference: the first one present
	// in a scrape is used and the others are ignored (vllm:kv_cache_usage_perc over the older
	// vllm:gpu_cache_usage_perc). An empty list: the engine does not export the signal.
	Signals [NumSignals][]Series
	// Priority says whether and how the engine schedules by a request's "priority" field, so that the gateway
	// passes each request's class on (PriorityValue): PriorityNone, the zero value, sends nothing (an engine
	// without priority scheduling may refuse the field: vLLM rejects a non-zero priority unless started with
	// --scheduling-policy priority). Off in every built-in entry, since it depends on how the engine was started;
	// the policy turns it on (engines.*.priority).
	Priority PriorityOrder
	// Continue says that the engine continues a final assistant message as vLLM does (continue_final_message
	// with add_generation_prompt false) and a completion from a prompt that ends with its text, so that a
	// sheddable stream may yield its seat to a critical request and go on there later (docs/design.md,
	// "Yielding seats"). On in vLLM's entry (its chat endpoint has the fields since 0.6.3); the policy turns it
	// on for others (engines.*.continue).
	Continue bool
	// Info is where the engine states its own limits outside its metrics (SGLang's /get_server_info, TGI's
	// /info); the zero value reads nothing.
	Info InfoSpec

	byName map[string][]seriesRef
	has    EngineFields
}

// seriesRef is one series of a spec, found by its metric name while parsing.
type seriesRef struct {
	sig Signal
	alt int // its place in Signals[sig]: lower is preferred
	s   *Series
}

// NewEngineSpec returns the spec e with its lookup table built. e is copied; its series must not be modified
// afterwards.
func NewEngineSpec(e EngineSpec) *EngineSpec {
	out := e
	out.byName = make(map[string][]seriesRef)
	out.has = 0
	for sig := range NumSignals {
		out.Signals[sig] = slices.Clone(e.Signals[sig])
		for alt := range out.Signals[sig] {
			s := &out.Signals[sig][alt]
			s.Labels = maps.Clone(s.Labels)
			out.byName[s.Name] = append(out.byName[s.Name], seriesRef{sig: sig, alt: alt, s: s})
		}
		if len(out.Signals[sig]) > 0 && sig != SignalKVBlockSize {
			out.has |= sig.field()
		}
	}
	out.Info = InfoSpec{Paths: slices.Clone(e.Info.Paths), MaxSeqs: slices.Clone(e.Info.MaxSeqs),
		MaxInflight: slices.Clone(e.Info.MaxInflight)}
	if out.Info.Reads() {
		if len(out.Info.MaxSeqs) > 0 {
			out.has |= HasMaxSeqs
		}
		if len(out.Info.MaxInflight) > 0 {
			out.has |= HasMaxInflight
		}
	}
	return &out
}

// PriorityOrder is how an engine orders requests by their "priority" field.
type PriorityOrder uint8

// The orders. docs/engines.md cites the engines' documents.
const (
	// PriorityNone: the engine does not schedule by priority, or the gateway does not tell it; the client's
	// own field, if any, is passed through.
	PriorityNone PriorityOrder = iota
	// PriorityLowFirst: a lower value runs first (vLLM with --scheduling-policy priority; SGLang with
	// --enable-priority-scheduling --schedule-low-priority-values-first).
	PriorityLowFirst
	// PriorityHighFirst: a higher value runs first (SGLang with --enable-priority-scheduling, its default
	// order).
	PriorityHighFirst
)

// String returns the order as the policy spells it: none, low_first, high_first.
func (o PriorityOrder) String() string {
	switch o {
	case PriorityLowFirst:
		return "low_first"
	case PriorityHighFirst:
		return "high_first"
	}
	return "none"
}

// PriorityValue returns the "priority" value to send the engine for a request of rank (0 the most urgent,
// admission's Class.Index: critical 0, standard 1, sheddable 2), and whether to send one. Standard requests get
// 0, the engines' default, so that traffic that reaches the engine by other paths ranks with them; critical
// ones run before them and sheddable ones after. The client's own field is replaced: a client must not
// promote itself past the class the gateway gave it.
func (e *EngineSpec) PriorityValue(rank int) (int, bool) {
	if e == nil || e.Priority == PriorityNone {
		return 0, false
	}
	v := rank - 1
	if e.Priority == PriorityHighFirst {
		v = -v
	}
	return v, true
}

// Scrapes reports whether the engine has metrics to scrape.
func (e *EngineSpec) Scrapes() bool { return e != nil && e.MetricsPath != "" }

// Exports returns the EngineStats fields the engine's series can fill (none when it is not scraped).
func (e *EngineSpec) Exports() EngineFields {
	if !e.Scrapes() {
		return 0
	}
	return e.has
}

// one, anyOf and labelled are shorthands for the built-in table.
func one(name string) []Series { return []Series{{Name: name}} }

func anyOf(names ...string) []Series {
	s := make([]Series, len(names))
	for i, n := range names {
		s[i] = Series{Name: n}
	}
	return s
}

func labelled(name, label, value string) Series {
	return Series{Name: name, Labels: map[string]string{label: value}}
}

// builtinEngines is the built-in engines table. The metric names of each entry come from the documents cited
// beside it; docs/engines.md lists them with their meaning, and what each engine lacks.
var builtinEngines = func() map[string]*EngineSpec {
	specs := []EngineSpec{
		// vLLM: docs/engines.md#vllm (vLLM's "Production Metrics" page; v0 names kept as fallbacks).
		{Name: EngineVLLM, MetricsPath: DefaultMetricsPath, IdleProbes: true, Continue: true, Signals: [NumSignals][]Series{
			SignalRunning:       one("vllm:num_requests_running"),
			SignalWaiting:       one("vllm:num_requests_waiting"),
			SignalKVUsage:       anyOf("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
			SignalKVBlocks:      {{Name: "vllm:cache_config_info", ValueLabel: "num_gpu_blocks"}},
			SignalKVBlockSize:   {{Name: "vllm:cache_config_info", ValueLabel: "block_size"}},
			SignalPrefixHits:    anyOf("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
			SignalPrefixQueries: anyOf("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
			SignalPreemptions:   one("vllm:num_preemptions_total"),
			SignalStartTime:     one("process_start_time_seconds"),
		}},
		// SGLang: docs/engines.md#sglang (SGLang's "Production Metrics" page).
		{Name: EngineSGLang, MetricsPath: DefaultMetricsPath, IdleProbes: true, Signals: [NumSignals][]Series{
			SignalRunning: one("sglang:num_running_reqs"),
			SignalWaiting: one("sglang:num_queue_reqs"),
			SignalKVUsage: one("sglang:token_usage"),
			SignalKVBlocks: {{Name: "sglang:cache_config_info", ValueLabel: "num_pages"},
				{Name: "sglang:max_total_num_tokens"}}, // in tokens: blocks of 1
			SignalKVBlockSize:   {{Name: "sglang:cache_config_info", ValueLabel: "page_size"}},
			SignalPrefixHits:    one("sglang:cached_tokens_total"),
			SignalPrefixQueries: one("sglang:prompt_tokens_total"),
			SignalPreemptions:   one("sglang:num_retracted_reqs_total"),
			SignalStartTime:     one("process_start_time_seconds"),
		}, Info: InfoSpec{
			// SGLang states the seats it computed (or was given with --max-running-requests) per data-parallel
			// rank; the top-level server argument is null unless set.
			Paths: []string{"/get_server_info", "/server_info"},
			MaxSeqs: []JSONField{mustField("internal_states[].effective_max_running_requests_per_dp"),
				mustField("max_running_requests")},
		}},
		// TGI: docs/engines.md#tgi (TGI's "Metrics" reference page). No KV-cache, prefix-cache or process metrics.
		{Name: EngineTGI, MetricsPath: DefaultMetricsPath, IdleProbes: true, Signals: [NumSignals][]Series{
			SignalRunning: one("tgi_batch_current_size"),
			SignalWaiting: one("tgi_queue_size"),
		}, Info: InfoSpec{
			// max_batch_size is null unless TGI was started with --max-batch-size (its batch is then bounded by
			// --max-batch-total-tokens); max_concurrent_requests (default 128) is the router's limit, past which
			// it answers 429.
			Paths:       []string{"/info"},
			MaxSeqs:     []JSONField{mustField("max_batch_size")},
			MaxInflight: []JSONField{mustField("max_concurrent_requests")},
		}},
		// trtllm-serve: docs/engines.md#trtllm-serve (TensorRT-LLM's prometheus_metrics example). Only KV usage,
		// and only from the releases that export it.
		{Name: EngineTRTLLMServe, MetricsPath: "/prometheus/metrics", IdleProbes: true, Signals: [NumSignals][]Series{
			SignalKVUsage: one("trtllm_kv_cache_utilization"),
		}},
		// Triton with the TensorRT-LLM backend: docs/engines.md#triton (the tensorrtllm_backend README, "Triton
		// Metrics").
		{Name: EngineTriton, MetricsPath: DefaultMetricsPath, IdleProbes: true, Signals: [NumSignals][]Series{
			SignalRunning:     {labelled("nv_trt_llm_request_metrics", "request_type", "scheduled")},
			SignalWaiting:     {labelled("nv_trt_llm_request_metrics", "request_type", "waiting")},
			SignalKVUsage:     {labelled("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction")},
			SignalKVBlocks:    {labelled("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max")},
			SignalKVBlockSize: {labelled("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per")},
			SignalMaxSeqs:     {labelled("nv_trt_llm_request_metrics", "request_type", "max")},
		}},
		// NIM for LLMs: docs/engines.md#nim (NIM's "Observability" page: /v1/metrics, unprefixed names; NIMs
		// built on vLLM also export the vllm: names, kept as fallbacks).
		{Name: EngineNIM, MetricsPath: "/v1/metrics", IdleProbes: true, Signals: [NumSignals][]Series{
			SignalRunning:   anyOf("num_requests_running", "vllm:num_requests_running"),
			SignalWaiting:   anyOf("num_requests_waiting", "vllm:num_requests_waiting"),
			SignalKVUsage:   anyOf("gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
			SignalStartTime: one("process_start_time_seconds"),
			SignalMaxSeqs:   one("num_request_max"),
		}},
		// llama.cpp's llama-server: docs/engines.md#llamacpp (the server README, "GET /metrics"). Recent builds
		// no longer export kv_cache_usage_ratio.
		{Name: EngineLlamaCpp, MetricsPath: DefaultMetricsPath, IdleProbes: true, Signals: [NumSignals][]Series{
			SignalRunning: one("llamacpp:requests_processing"),
			SignalWaiting: one("llamacpp:requests_deferred"),
			SignalKVUsage: one("llamacpp:kv_cache_usage_ratio"),
		}},
		// A hosted API (OpenAI, Azure OpenAI, ...): nothing to scrape, and every request is billed.
		{Name: EngineOpenAIHosted},
	}
	m := make(map[string]*EngineSpec, len(specs)+1)
	for _, s := range specs {
		m[s.Name] = NewEngineSpec(s)
	}
	m[EngineOpenAI] = m[EngineOpenAIHosted]
	return m
}()

// BuiltinEngine returns the built-in engine called name (EngineOpenAI is EngineOpenAIHosted), or nil. The spec is
// shared: do not modify it.
func BuiltinEngine(name string) *EngineSpec { return builtinEngines[name] }

// BuiltinEngineNames returns the built-in engines' names, sorted, without the EngineOpenAI alias.
func BuiltinEngineNames() []string {
	var names []string
	for n := range builtinEngines {
		if n != EngineOpenAI {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// SignalsOf returns the names of the signals in f, in Signal order, as /debug/backends shows them: running,
// waiting, kv_usage, kv_capacity, prefix_cache, preemptions, start_time, max_seqs.
func SignalsOf(f EngineFields) []string {
	out := []string{}
	for _, x := range []struct {
		f    EngineFields
		name string
	}{
		{HasRunning, "running"}, {HasWaiting, "waiting"}, {HasKVUsage, "kv_usage"}, {HasCacheConfig, "kv_capacity"},
		{HasPrefixCounters, "prefix_cache"}, {HasPreemptions, "preemptions"}, {HasStartTime, "start_time"},
		{HasMaxSeqs, "max_seqs"}, {HasMaxInflight, "max_inflight"},
	} {
		if f&x.f != 0 {
			out = append(out, x.name)
		}
	}
	return out
}

// AllSignals is every EngineStats field a scrape can fill.
const AllSignals = HasWaiting | HasRunning | HasKVUsage | HasCacheConfig | HasPreemptions | HasPrefixCounters |
	HasStartTime | HasMaxSeqs | HasMaxInflight
