// Package sim is a vLLM-compatible inference engine simulator behind the OpenAI API: continuous batching in steps,
// chunked prefill, a KV cache of 16-token blocks with prefix caching and LRU eviction, vLLM's Prometheus metrics,
// and faults injected from flags or a control endpoint; by default, for that is vLLM V1's engine, and with other
// physics (other batching laws, block sizes, eviction rules and prefill schedules, jitter, a prefill that grows
// with context) it models SGLang, TGI, vLLM V0 and llm-d-inference-sim. Its dialect, independent of the physics,
// serves SGLang's or TGI's metric names and info endpoints instead of vLLM's (see Dialects). It is the testbed for
// every routing claim, so it talks only HTTP and imports no gateway internals.
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
// (openai.AppendPrompt, the bytes the gateway hashes), so 64 prompt bytes make one 16-token block (the gateway's
// block; Config.BlockSize changes the backend's, see Physics). A new request prefills
// only what follows its cached full-block prefix; running sequences hold blocks for prompt and output, and when
// one needs a block and none is free, the newest running sequence is preempted back to the queue (recompute).
// With the defaults a lone 1,000-token prompt with max_tokens 500 gets its first token after 110ms and its last
// after 10.09s. When idle, the loop blocks without a timer.
//
// # The wire
//
// POST /v1/chat/completions and /v1/completions (stream or not), GET /v1/models, /health, /metrics, and
// GET/POST /sim/control, POST /sim/predict, the endpoints listed under "Beyond chat", and the dialect's info
// endpoint (see Dialects). Every response has X-Sim-Backend: <name>, and X-Request-Id when the request had one
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
// (10ms of overhead and the 8 uncached tokens' prefill). cached_tokens is the prefix-cache hit the prompt would
// get now (the full blocks of its prefix in the cache at this moment; a prefix still being prefilled ahead is
// not counted yet), ttft_ms the engine's own estimate of its TTFT if it arrived now: RTT, the overhead,
// the wait for a seat and the queue ahead, and the prefill of the uncached part, under the backend's physics and
// faults; running and waiting are the gauges now. The estimate is a run of a copy of the engine (its jitter
// generator too) on a virtual clock until the probe's first token, so it is exact for a request sent at once
// when nothing else arrives before its first token; a stall drawn per request (stall_rate > 0) is not drawn.
// It changes nothing: no LRU touch, no metric, no request counter, no random draw. Like /sim/control it is not
// delayed by RTT; unlike it, it is refused while down (503), and a body the completion endpoints would refuse
// gets their status and error (400, 404, 405, 413). Its cost is a copy of the KV cache's bookkeeping (about 30
// bytes a block) and the steps simulated up to the first token.
//
// # Physics
//
// Each physics knob is a Config field, a flag and a fleet key (range-checked); their zero values are the model
// above. physics: NAME (-physics) fills them from a preset; knobs named in the same entry (or on the same command
// line) win over it, before or after it.
//
//   - batching (Config.Batching): stepped, the model above; or seats: MaxNumSeqs seats, each sequence on its own
//     clock, its uncached prefill at PrefillTPS then one token per ITL, both times a factor rising linearly from
//     1 with one sequence in flight to load_factor with max_num_seqs (set when each interval starts); requests
//     beyond the seats wait; a seated sequence holds the blocks of its whole context, so it is never preempted.
//     This is llm-d-inference-sim's per-token latency model, where TTFT = prefill-overhead + (n - n_cached) *
//     prefill-time-per-token, decode = (out - 1) * inter-token-latency, and time-factor-under-load multiplies
//     them, scaling linearly from 1.0 with one request in flight to its value at max-num-seqs (its defaults:
//     max-num-seqs 5, block-size 16, kv-cache-size 1024 blocks).
//   - block_size (1..1024 tokens): the prefix cache's granularity. Prompts are hashed at it (the gateway keeps
//     hashing 64-byte blocks, unchanged): vLLM's default --block-size is 16; llm-d-inference-sim allows 8 to 128
//     (default 16); SGLang's radix cache is token-granular (--page-size default 1); TGI's prefix caching needs its
//     flashinfer attention, whose block size is 1 (16 for its paged attention, 256 for flashdecoding). kv_blocks
//     counts blocks of this size, so a preset keeps the default cache's 131,072 tokens unless kv_blocks is named.
//   - eviction: lru (vLLM's free block queue: the block released longest ago; a sequence releases its tail
//     first), radix (SGLang's radix cache, --radix-eviction-policy lru by default, and TGI's radix trie, modelled
//     on it: the least recently used leaf, so a prefix is evicted from its end and a block is never evicted while
//     a cached block continues it) or fifo (the block cached first, however often it was hit since). With
//     tail-first release lru orders blocks as radix does; fifo differs most, losing a hot prefix's head and so
//     all of it.
//   - chunked_prefill: on (vLLM V1, where chunked prefill is always on: decodes are scheduled first, then
//     prefill chunks within max_num_batched_tokens); unmixed (SGLang: chunks of at most chunked_prefill_size in
//     prefill-only steps, since mixing prefill and decode in a batch needs --enable-mixed-chunk, off by
//     default); off (vLLM V0's scheduler without chunked prefill, where a step is either prefill or decode and
//     prefills come first; TGI's router, which pauses the running batch to prefill waiting requests): whole
//     prompts in prefill-only steps, at least one however long, more while max_batched_tokens allows. In both,
//     prefill goes first here and decoding sequences wait while there is prefill to do; TGI's further delay of a
//     prefill (max-waiting-tokens, 20 decode steps, and waiting-served-ratio) is not modelled.
//   - jitter (0..1): each step's (or seat interval's) time times exp(jitter*Z - jitter^2/2), Z standard normal
//     from a generator seeded by seed and the backend's name: mean 1, log spread jitter, the same on every run.
//   - prefill_knee (tokens, 0 = linear): a prompt token at context c costs (1 + c/knee)/prefill_tps, standing
//     for attention's cost growing with context. n tokens computed after c cost
//     (n + ((c+n)^2 - c^2)/(2*knee))/prefill_tps: the same in one chunk or many, and dearer after a long
//     cached prefix than at the start of a prompt.
//
// The presets, and the facts they rest on:
//
//	preset     batching  block_size  eviction  chunked_prefill  max_batched_tokens
//	vllm-v1    stepped   16          lru       on               4096 (the defaults)
//	vllm-v0    stepped   16          lru       off              4096
//	sglang     stepped   1           radix     unmixed          8192 (chunked_prefill_size on H100/A100 GPUs;
//	                                                                  2048 under 35 GB, 16384 on B200 and MI300)
//	tgi        stepped   1           radix     off              4096 (TGI's max-batch-prefill-tokens defaults
//	                                                                  to max-input-tokens + 50; off runs a
//	                                                                  longer prompt whole anyway)
//	llm-d-sim  seats     16          lru       on               4096 (not used by seats)
//
// Presets set no jitter, no prefill knee and no load factor (1): those describe a deployment, not an engine, and
// a fleet names them. Nor do they change max_num_seqs or the hardware rates (prefill_tps, itl, itl_per_seq),
// which stay the fleet's. Under seats, itl_per_seq and max_batched_tokens are not used.
//
// # Dialects
//
// dialect (Config.Dialect, -dialect) is the real engine whose surface a backend serves; the physics stay what
// their knobs say, so any physics speaks any dialect. The metric names are the ones docs/engines.md lists with
// their sources (SGLang's and TGI's metrics pages), which routing/engines.go's built-in engines read; every
// dialect keeps sim_requests_pending and sim_engine_loop_lag_seconds.
//
//   - vllm (the default): vLLM's metric names, exactly as always, and no info endpoint: /get_server_info,
//     /server_info and /info are 404, as vLLM states no batch limit.
//   - sglang: gauges sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage (KV usage, 0-1) and
//     sglang:cache_config_info{page_size, num_pages} (value 1); counters sglang:prompt_tokens_total (every prompt
//     token looked up in the prefix cache, counted when scheduled, as vllm:prefix_cache_queries_total: so
//     cached_tokens_total / prompt_tokens_total is the hit rate), sglang:cached_tokens_total (the hits),
//     sglang:generation_tokens_total and sglang:num_retracted_reqs_total (preemptions); histograms
//     sglang:time_to_first_token_seconds, sglang:inter_token_latency_seconds and
//     sglang:e2e_request_latency_seconds (vLLM's buckets); process_start_time_seconds; all with model_name.
//     GET /get_server_info and /server_info (newer SGLang's name) answer SGLang's shape: the server arguments at
//     the top level (model_path, served_model_name, max_running_requests, schedule_policy,
//     enable_priority_scheduling and schedule_low_priority_values_first (both true under the priority policy,
//     which runs lower values first), page_size, chunked_prefill_size (-1 with chunked_prefill off),
//     enable_mixed_chunk, context_length, dp_size 1), then internal_states with one element (one data-parallel
//     rank): effective_max_running_requests_per_dp (max_num_seqs), last_gen_throughput (tokens generated in the
//     last second, per second) and memory_usage.token_capacity (kv_blocks * block_size); and version "sim-"
//     and the build's commit ("sim-devel" without one).
//   - tgi: gauges tgi_batch_current_size (running) and tgi_queue_size (waiting), and the counter
//     tgi_request_failure{err="overloaded"}, none with a model label; no KV, prefix-cache, latency or process
//     metrics, as TGI's router exports none of the first and the simulator does not fake its histograms.
//     GET /info answers TGI's Info: model_id, model_sha (null), model_dtype "torch.float16",
//     model_device_type "cuda", model_pipeline_tag "text-generation", max_concurrent_requests, max_best_of 2,
//     max_stop_sequences 4 (TGI's defaults), max_input_tokens (the context less one), max_total_tokens (the
//     context), max_batch_total_tokens (kv_blocks * block_size), max_waiting_tokens 20 (TGI's default, not
//     modelled), max_batch_size, validation_workers 2, router "text-generation-router" and version.
//
// The info endpoints answer GET and HEAD (405 otherwise) and 503 while down, as /v1/models. states_seats
// (default true; -states-seats) says whether max_num_seqs is stated as a server argument: false makes TGI's
// max_batch_size and SGLang's top-level max_running_requests null, as those engines report a flag they were not
// given; SGLang's internal_states still carries the effective figure, since SGLang always computes one, so false
// matters for TGI and for SGLang's top-level field only, and not at all under vllm.
//
// max_concurrent_requests (default 0, off; -max-concurrent-requests) is TGI's router limit on the requests held
// at once (pending, waiting and running; each input of a pooling request counts): under tgi, a request arriving
// while that many are held is refused at once with 429 {"error":"Model is overloaded","error_type":"overloaded"}
// (after its body is checked: a bad one still gets its 400) and counted in tgi_request_failure{err="overloaded"};
// /info reports it, or TGI's default 128 when it is 0, which enforces nothing. Only TGI has this limit: another
// dialect with a value other than 0 is refused by Validate. POST /sim/predict ignores it: it predicts the first
// token of a request let in.
//
// # Use from Go
//
// Start runs one backend and StartFleet several, each on its own listener (empty Listen: a free loopback port);
// URL gives the base URL and Close stops everything they started. Tests in other packages use them to put real
// simulated engines behind the gateway.
package sim
