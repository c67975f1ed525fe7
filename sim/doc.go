// Package sim is a vLLM-compatible inference engine simulator behind the OpenAI API: continuous batching in steps,
// chunked prefill, a KV cache of 16-token blocks with prefix caching and LRU eviction, vLLM's Prometheus metrics,
// and faults injected from flags or a control endpoint. It is the testbed for every routing claim, so it talks only
// HTTP and imports no gateway internals.
//
// # The model
//
// Each backend runs one engine loop (not one per request). A step schedules one token for each decoding sequence
// and prefill chunks for the others within Config.MaxBatchedTokens, and lasts
//
//	prefill_tokens/PrefillTPS + (if any sequence decodes) ITL + ITLPerSeq*(decoding_sequences-1)
//
// times the slowdown fault, so prefill landing in a step stretches it for everyone decoding. A sequence gets its
// first token at the end of the step that finishes its prefill, then one per step, until max_tokens
// (finish_reason "length"). Requests reach the queue Config.Overhead after they arrive, and wait there while
// Config.MaxNumSeqs or the free KV blocks run out. Prompt tokens are openai.EstimateTokens of the canonical prompt
// (openai.AppendPrompt, the bytes the gateway hashes), so 64 prompt bytes make one block. A new request prefills
// only what follows its cached full-block prefix; running sequences hold blocks for prompt and output, and when
// one needs a block and none is free, the newest running sequence is preempted back to the queue (recompute).
// With the defaults a lone 1,000-token prompt with max_tokens 500 gets its first token after 110ms and its last
// after 10.09s. When idle, the loop blocks without a timer.
//
// # The wire
//
// POST /v1/chat/completions and /v1/completions (stream or not), GET /v1/models, /health, /metrics, and
// GET/POST /sim/control, POST /sim/predict, and the endpoints listed under "Beyond chat". Every response has X-Sim-Backend: <name>, and X-Request-Id when the request had one
// (it then also names the response: "chatcmpl-<id>"). A chat stream is, as vLLM sends it:
//
//	data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1767225600,"model":"sim-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}
//
//	data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1767225600,"model":"sim-model","choices":[{"index":0,"delta":{"content":"about"},"logprobs":null,"finish_reason":null}]}
//
//	data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1767225600,"model":"sim-model","choices":[{"index":0,"delta":{"content":" water"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}
//
//	data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1767225600,"model":"sim-model","choices":[],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}
//
//	data: [DONE]
//
// The role chunk comes with the first token; the usage chunk only with stream_options.include_usage; other
// chunks have no usage key. Completions chunks are "text_completion" objects with "text" instead of "delta".
// The text is deterministic (see AppendText): the same request gets the same words on every backend with the
// same Seed, on every run. Errors are vLLM's: {"error":{"message":..,"type":"BadRequestError","param":null,
// "code":400}} (400 bad JSON, missing messages or prompt, max_tokens < 1, past the context; 404 unknown model;
// 500 fail_rate; 503 down).
//
// # Beyond chat
//
// The other endpoints a vLLM or SGLang engine serves, each with 405 for a wrong method, 400 for a bad body, 404
// for an unknown model and 503 while down. Generating endpoints run a sequence through the engine exactly as
// chat does (same TTFT and ITL, same metrics, same deterministic words); pooling endpoints run a prefill-only
// sequence per input, which shares the batch, fills the prefix cache and counts as finished_reason="stop"
// without generating a token. Responses and Messages prompts are their canonical prompts (openai.AppendPrompt),
// the bytes the gateway hashes, so prefix-aware routing sees the blocks the simulated cache holds.
//
//   - POST /v1/embeddings: input (string, strings, token ids, lists of ids), encoding_format float|base64,
//     dimensions. Vectors of Config.EmbeddingDim (default 384): a feature-hashed bag of words, L2-normalised,
//     so texts sharing words are close (see embedding). POST /v2/embed is Cohere's form of the same vectors.
//   - POST /rerank, /v1/rerank, /v2/rerank (query, documents, top_n) and /score, /v1/score (text_1, text_2):
//     a prefill per pair, scored by the share of the query's words the document holds.
//   - POST /v1/responses (input, instructions, max_output_tokens, stream, store, previous_response_id,
//     background), GET /v1/responses/{id}, POST /v1/responses/{id}/cancel: vLLM's Responses API, its stream
//     the response.* events ending with response.completed (no [DONE]); up to 10,000 stored responses.
//   - POST /v1/messages: Anthropic's Messages API with Anthropic's events and errors; a reply ends its turn
//     (stop_reason "end_turn") after Config.DefaultMaxTokens tokens unless max_tokens comes first.
//   - POST /tokenize, /detokenize: the simulator's tokenizer, 4 bytes a token (openai.BytesPerToken), each id
//     holding its bytes (see appendTokenIDs), so the counts are the ones every endpoint reports.
//   - POST /v1/audio/transcriptions, /v1/audio/translations: multipart uploads up to 25 MB, read as 16 kHz
//     16-bit PCM: 50 prompt tokens and 2.5 words a second, words chosen by a hash of the file.
//
// A client that hangs up aborts its sequence at once, wherever it is (queued, prefilling, decoding): it leaves
// vllm:num_requests_running or _waiting, frees its blocks and counts as finished_reason="abort". POST
// /sim/control with {"slowdown":3,"fail_rate":0.2,"stall":"5s","stall_rate":0.1,"down":true,"restart":true,
// "evict_cache":true} (any subset; {} restores the baseline; unknown fields are a 400) injects faults; see Faults,
// Backend.Restart and Backend.EvictCache. sim_requests_pending counts requests in their overhead or a stall,
// which vllm:num_requests_waiting (the scheduler's queue, as in vLLM) does not.
//
// POST /sim/predict is the ground truth for an oracle router: its body is exactly what a client would send to
// /v1/chat/completions or /v1/completions (told apart by "messages" or "prompt"), and it answers 200 with, for
// a 1,000-token prompt that an idle backend with the defaults has served before,
//
//	{"backend":"sim","prompt_tokens":1000,"cached_tokens":992,"ttft_ms":10.8,"running":0,"waiting":0,"max_num_seqs":256}
//
// (10ms of overhead and the 8 uncached tokens' prefill), cached_tokens being the prefix-cache hit the request
// would get if sent now (found at its admission, as its usage would report it), and ttft_ms the engine's own
// estimate of the
// request's TTFT if it arrived now: RTT, the overhead, the wait for a seat and the queue ahead, and the prefill
// of the uncached part, under the backend's physics and faults. The estimate is a run of a copy of the engine
// on a virtual clock until the probe's first token, so it is exact for a request sent at once when nothing
// else arrives before its first token (and a stall drawn per request, stall_rate > 0, is not drawn). It changes
// nothing: no LRU touch, no metric, no request counter, no random draw. Like /sim/control it is not delayed by
// RTT; unlike it, it is refused while down (503), and a body the completion endpoints would refuse gets their
// status and error (400, 404, 405, 413).
//
// # Use from Go
//
// Start runs one backend and StartFleet several, each on its own listener (empty Listen: a free loopback port);
// URL gives the base URL and Close stops everything they started. Tests in other packages use them to put real
// simulated engines behind the gateway.
package sim
