// Package sim is a vLLM-compatible inference engine simulator behind the OpenAI API: continuous batching in steps,
// chunked prefill, a KV cache of 16-token blocks with prefix caching and LRU eviction, vLLM's Prometheus metrics,
// and faults injected from flags or a control endpoint. It is the testbed for every routing claim, so it talks only
// HTTP and imports no gateway internals.
package sim
