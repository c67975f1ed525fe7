package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime/debug"
	"sync"
)

// The dialects (Config.Dialect): which real engine's API surface a backend serves. docs/engines.md lists each
// engine's metric names and info endpoints with their sources; the package doc, "Dialects", what each serves.
const (
	// DialectVLLM is vLLM's surface: its metric names and no info endpoint (vLLM states no batch limit).
	DialectVLLM = "vllm"
	// DialectSGLang is SGLang's: its metric names and GET /get_server_info (also /server_info, newer SGLang's
	// name), which states the engine's max_running_requests.
	DialectSGLang = "sglang"
	// DialectTGI is Hugging Face Text Generation Inference's: its router's metric names, GET /info (its
	// max_batch_size and max_concurrent_requests) and its 429 past max_concurrent_requests.
	DialectTGI = "tgi"
)

// dialect is Dialect, "" meaning DialectVLLM.
func (c *Config) dialect() string {
	if c.Dialect == "" {
		return DialectVLLM
	}
	return c.Dialect
}

// forPredict is the configuration of predict's copy of the engine: without the concurrency limit, so that a
// prediction is the first token a request would get once let in; whether it is let in is the 429 a client sees.
func (c Config) forPredict() Config {
	c.MaxConcurrentRequests = 0
	return c
}

// tgiDefaultConcurrent is TGI's default --max-concurrent-requests, which /info reports when the limit is off.
const tgiDefaultConcurrent = 128

// TGI launcher defaults /info reports for settings the simulator does not model (its --max-best-of,
// --max-stop-sequences, --max-waiting-tokens and --validation-workers).
const (
	tgiMaxBestOf         = 2
	tgiMaxStopSequences  = 4
	tgiMaxWaitingTokens  = 20
	tgiValidationWorkers = 2
)

// simVersion is the "version" the info endpoints state: "sim-" and the commit the binary was built from, or
// "sim-devel" when the build recorded none (go test, go run).
var simVersion = sync.OnceValue(func() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "sim-" + s.Value[:12]
			}
		}
	}
	return "sim-devel"
})

// sglangServerInfo is the part of SGLang's GET /get_server_info the simulator states: the server arguments at
// the top level, as SGLang returns them (its ServerArgs, flattened), then internal_states, one element per
// data-parallel rank, and the version.
type sglangServerInfo struct {
	ModelPath       string `json:"model_path"`
	ServedModelName string `json:"served_model_name"`
	// MaxRunningRequests is --max-running-requests: null unless stated (SGLang computes the limit from its
	// memory when it is not given; internal_states says what it computed).
	MaxRunningRequests *int   `json:"max_running_requests"`
	SchedulePolicy     string `json:"schedule_policy"`
	// EnablePriorityScheduling and ScheduleLowPriorityValuesFirst say how SGLang would have to be started to
	// order its queue as the simulator's priority policy does: lower values first.
	EnablePriorityScheduling       bool `json:"enable_priority_scheduling"`
	ScheduleLowPriorityValuesFirst bool `json:"schedule_low_priority_values_first"`
	PageSize                       int  `json:"page_size"`
	// ChunkedPrefillSize is the largest prefill chunk, -1 when chunked prefill is off (SGLang's value for it).
	ChunkedPrefillSize int `json:"chunked_prefill_size"`
	// EnableMixedChunk is whether prefill chunks share a batch with decodes (chunked_prefill "on").
	EnableMixedChunk bool          `json:"enable_mixed_chunk"`
	ContextLength    int           `json:"context_length"`
	DPSize           int           `json:"dp_size"`
	InternalStates   []sglangState `json:"internal_states"`
	Version          string        `json:"version"`
}

// sglangState is one element of SGLang's internal_states: one data-parallel rank's scheduler state.
type sglangState struct {
	// EffectiveMaxRunningRequestsPerDP is the most requests the rank runs at once: the limit it runs with,
	// whether it was stated or computed.
	EffectiveMaxRunningRequestsPerDP int `json:"effective_max_running_requests_per_dp"`
	// LastGenThroughput is the generation rate of the last window, in tokens per second (engine.genThroughput).
	LastGenThroughput float64 `json:"last_gen_throughput"`
	MemoryUsage       struct {
		// TokenCapacity is the KV cache's size in tokens.
		TokenCapacity int `json:"token_capacity"`
	} `json:"memory_usage"`
}

// tgiInfo is TGI's GET /info (its router's Info) as the simulator states it.
type tgiInfo struct {
	ModelID          string  `json:"model_id"`
	ModelSHA         *string `json:"model_sha"`
	ModelDtype       string  `json:"model_dtype"`
	ModelDeviceType  string  `json:"model_device_type"`
	ModelPipelineTag string  `json:"model_pipeline_tag"`
	// MaxConcurrentRequests is --max-concurrent-requests: Config.MaxConcurrentRequests, or TGI's default 128 when
	// the simulator enforces no limit.
	MaxConcurrentRequests int `json:"max_concurrent_requests"`
	MaxBestOf             int `json:"max_best_of"`
	MaxStopSequences      int `json:"max_stop_sequences"`
	MaxInputTokens        int `json:"max_input_tokens"`
	MaxTotalTokens        int `json:"max_total_tokens"`
	// MaxBatchTotalTokens is the tokens the batch may hold, TGI's KV budget: the simulated cache's size.
	MaxBatchTotalTokens int `json:"max_batch_total_tokens"`
	MaxWaitingTokens    int `json:"max_waiting_tokens"`
	// MaxBatchSize is --max-batch-size: null unless stated (TGI then bounds the batch by its token budget only).
	MaxBatchSize      *int   `json:"max_batch_size"`
	ValidationWorkers int    `json:"validation_workers"`
	Router            string `json:"router"`
	Version           string `json:"version"`
}

// infoHandler returns the handler of path under b's dialect, or nil when the dialect serves no such endpoint
// (then the path is a 404, as on the real engine).
func (b *Backend) infoHandler(path string) func(http.ResponseWriter) {
	switch b.cfg.dialect() {
	case DialectSGLang:
		if path == "/get_server_info" || path == "/server_info" {
			return b.serveSGLangInfo
		}
	case DialectTGI:
		if path == "/info" {
			return b.serveTGIInfo
		}
	}
	return nil
}

func (b *Backend) serveSGLangInfo(w http.ResponseWriter) {
	c := &b.cfg
	in := sglangServerInfo{
		ModelPath: c.Model, ServedModelName: c.Model,
		SchedulePolicy:                 PolicyFCFS,
		EnablePriorityScheduling:       c.SchedulingPolicy == PolicyPriority,
		ScheduleLowPriorityValuesFirst: c.SchedulingPolicy == PolicyPriority,
		PageSize:                       c.blockSize(),
		ChunkedPrefillSize:             c.MaxBatchedTokens,
		EnableMixedChunk:               c.ChunkedPrefill == "" || c.ChunkedPrefill == PrefillMixed,
		ContextLength:                  c.maxContextTokens(),
		DPSize:                         1,
		InternalStates:                 make([]sglangState, 1),
		Version:                        simVersion(),
	}
	if c.ChunkedPrefill == PrefillOff {
		in.ChunkedPrefillSize = -1
	}
	if c.StatesSeats {
		in.MaxRunningRequests = &c.MaxNumSeqs
	}
	st := &in.InternalStates[0]
	st.EffectiveMaxRunningRequestsPerDP = c.MaxNumSeqs
	st.LastGenThroughput = b.eng.throughput()
	st.MemoryUsage.TokenCapacity = c.maxContextTokens()
	writeJSON(w, &in)
}

func (b *Backend) serveTGIInfo(w http.ResponseWriter) {
	c := &b.cfg
	in := tgiInfo{
		ModelID: c.Model, ModelDtype: "torch.float16", ModelDeviceType: "cuda", ModelPipelineTag: "text-generation",
		MaxConcurrentRequests: c.MaxConcurrentRequests,
		MaxBestOf:             tgiMaxBestOf, MaxStopSequences: tgiMaxStopSequences,
		MaxInputTokens: c.maxContextTokens() - 1, MaxTotalTokens: c.maxContextTokens(),
		MaxBatchTotalTokens: c.maxContextTokens(), MaxWaitingTokens: tgiMaxWaitingTokens,
		ValidationWorkers: tgiValidationWorkers, Router: "text-generation-router", Version: simVersion(),
	}
	if in.MaxConcurrentRequests == 0 {
		in.MaxConcurrentRequests = tgiDefaultConcurrent
	}
	if c.StatesSeats {
		in.MaxBatchSize = &c.MaxNumSeqs
	}
	writeJSON(w, &in)
}

func writeJSON(w http.ResponseWriter, v any) {
	body, _ := json.Marshal(v) // the info structs always marshal
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n'))
}

// tgiOverloaded is TGI's answer past --max-concurrent-requests (its router's ErrorResponse for
// InferError::Overloaded).
const tgiOverloaded = `{"error":"Model is overloaded","error_type":"overloaded"}` + "\n"

// writeSubmitError answers a request the engine refused: TGI's 429 when it is overloaded, else fail's 503 (the
// endpoint's own error shape) while it is down.
func writeSubmitError(w http.ResponseWriter, err error, fail errWriter) {
	if errors.Is(err, errOverloaded) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, tgiOverloaded)
		return
	}
	fail(w, http.StatusServiceUnavailable, "The engine is down.")
}
