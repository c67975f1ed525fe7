package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/openai"
)

// ResponseCache is a model's exact response cache (docs/design.md, "Response cache"): a complete answer to a
// deterministic request is kept for TTL under the hash of its partition, the public model name and the request's
// canonical body, and the same request in the same partition gets it again without reaching a backend, as a JSON body
// or replayed as an SSE stream, whichever it asks for. Only chat and completions requests are cached, and only
// deterministic ones: temperature 0, or a client that opts in with "X-Switchyard-Cache: on" (honoured for an API
// key with CacheOptIn, and for every client of a gateway without keys; ignored otherwise, as if absent);
// "X-Switchyard-Cache: off" never uses the cache. Responses say "X-Switchyard-Cache: hit" or "miss" when the
// cache was consulted. Answers with tool calls are not kept.
//
// Partitions (docs/config.md, models[].response_cache.scope): each API key is a partition of its own, told
// apart by the key's hash (admission.Key.Hash), so a key is never answered from, and cannot learn of, an answer
// kept for another: another key's entry is a plain miss, with the same headers and the same backend trip as
// any miss. With Shared every key of the model is in one partition; so is every request of a gateway without
// API keys. The store only ever sees the hex SHA-256 of the whole (responseKey): no key, key hash or key name
// reaches Redis.
//
// A lookup is on the request path for at most Timeout (a Redis store; a memory store answers at once); a
// failed or late lookup is a miss, reported through OnError. Storing happens after the answer, off its path.
type ResponseCache struct {
	// Store keeps the answers: cache.MemoryStore (this replica's) or cache.RedisStore (shared).
	Store cache.Store
	// TTL is how long an answer is kept.
	TTL time.Duration
	// MaxEntryBytes is the largest answer kept (its JSON body).
	MaxEntryBytes int
	// Shared puts every API key of the model in one partition (scope: model): a key may be answered with what
	// another key was answered, and so learns what was asked. False (scope: key) keeps each key's answers to
	// itself. Without API keys there is one partition either way.
	Shared bool
	// Timeout bounds a lookup; default 5ms.
	Timeout time.Duration
	// OnError is told of failed lookups and stores ("response_cache"); nil ignores them. It must not block.
	OnError func(op string, err error)
}

// headerCache is the request header that opts in ("on") or out ("off") and the response header that says
// "hit" or "miss".
const headerCache = "X-Switchyard-Cache"

// errCacheHit ends admission early: the answer is in the response cache (ex.rc.hit).
var errCacheHit = errors.New("proxy: answered from the response cache")

// respCacheState is an exchange's use of its model's response cache.
type respCacheState struct {
	key   string // the request's cache key; "" when the request is not cached
	store bool   // the answer is to be stored when it completes
	hit   []byte // the cached answer (JSON body), on a hit
}

// lookupCache decides whether the request may use its model's response cache and looks its answer up. It
// returns true on a hit (ex.rc.hit holds the answer).
func (ex *exchange) lookupCache(h *fasthttp.RequestHeader) bool {
	rc := ex.asked.Cache
	if rc == nil || (ex.endpoint != openai.Chat && ex.endpoint != openai.Completions) {
		return false
	}
	opt := h.Peek(headerCache)
	if bytes.EqualFold(opt, []byte("off")) {
		return false
	}
	// "on" from a key without CacheOptIn is ignored, as if absent: such a key may not cache sampled answers.
	optIn := bytes.EqualFold(opt, []byte("on")) && (ex.key == nil || ex.key.CacheOptIn)
	if !optIn && !(ex.sum.HasTemperature && ex.sum.Temperature == 0) {
		return false // sampled: another answer each time
	}
	canon, err := canonicalBody(ex.body)
	if err != nil {
		return false
	}
	var part *admission.Key // the partition: the key's own, or nil for the one shared partition
	if !rc.Shared {
		part = ex.key
	}
	ex.rc.key = responseKey(part, ex.asked.Name, canon)
	timeout := rc.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	val, ok, err := rc.Store.Get(ctx, ex.rc.key)
	cancel()
	if err != nil && rc.OnError != nil {
		rc.OnError("response_cache", err)
	}
	if ok && len(val) > 0 {
		ex.rc.hit = val
		return true
	}
	ex.rc.store = true
	return false
}

// responseKeyDomain starts every hashed cache key; a new layout of the hash changes it, so that replicas of
// another version never read an entry as theirs.
const responseKeyDomain = "switchyard/response-cache/v2\x00"

// responseKey is the store key of a request in partition part (nil: the shared partition): the hex SHA-256 of
// responseKeyDomain, the partition (a tag byte, then for a key its 32-byte hash), the public model name
// (length-prefixed) and the canonical body. Fixed lengths and the length prefix keep the fields apart, so no
// request of one partition has the key of a request of another. Only the hash leaves the process: the store
// (Redis) learns neither the key nor its name.
func responseKey(part *admission.Key, model string, canon []byte) string {
	h := sha256.New()
	h.Write([]byte(responseKeyDomain))
	if part == nil {
		h.Write([]byte{0})
	} else {
		kh := part.Hash()
		h.Write([]byte{1})
		h.Write(kh[:])
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(model)))
	h.Write(n[:])
	h.Write([]byte(model))
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil))
}

// canonicalBody is the request as far as its answer depends on it: the JSON re-encoded with sorted keys and
// without stream, stream_options and user (a streamed and a whole answer are the same answer; the end user's
// id does not change it) and without model (the key carries the public model name).
func canonicalBody(body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	for _, k := range []string{"stream", "stream_options", "user", "model"} {
		delete(m, k)
	}
	return json.Marshal(m)
}

// storeCache keeps a complete answer (a JSON body with the public model name) in the model's response cache,
// off the request path.
func (ex *exchange) storeCache(body []byte) {
	rc := ex.asked.Cache
	if !ex.rc.store || rc == nil || len(body) == 0 || len(body) > rc.MaxEntryBytes ||
		bytes.Contains(body, []byte(`"tool_calls"`)) {
		return
	}
	ex.rc.store = false
	val, key := bytes.Clone(body), ex.rc.key
	go func() { // bounded by the timeout
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := rc.Store.Set(ctx, key, val, rc.TTL); err != nil && rc.OnError != nil {
			rc.OnError("response_cache", err)
		}
	}()
}

// storeStreamed keeps the answer a streaming client got, assembled as it was relayed.
func (ex *exchange) storeStreamed() {
	if !ex.rc.store || ex.cur == nil {
		return
	}
	body := ex.asm.AppendBody(nil)
	if up, pub := ex.cur.target.Model, ex.model.Name; up != "" && up != pub {
		body = rewriteModel(nil, body, up, pub)
	}
	ex.storeCache(body)
}

// serveCached answers the request from the response cache: the JSON body as kept, or for a streaming client
// the same answer as SSE chunks and [DONE]. It ends and releases the exchange.
func (s *Server) serveCached(ctx *fasthttp.RequestCtx, ex *exchange) {
	body := ex.rc.hit
	ctx.Response.Header.Set(headerBackend, "cache")
	ctx.Response.Header.Set(headerCache, "hit")
	ctx.SetStatusCode(fasthttp.StatusOK)
	var u struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &u) == nil && u.Usage != nil { // the key's token budget is charged what the answer cost
		ex.usage = openai.Usage{PromptTokens: u.Usage.PromptTokens, CompletionTokens: u.Usage.CompletionTokens,
			TotalTokens: u.Usage.TotalTokens}
		ex.hasUsage = true
	}
	if ex.sum.Stream {
		stream, err := appendCachedStream(nil, body, ex.endpoint, ex.sum.IncludeUsage)
		if err == nil {
			ctx.SetContentType("text/event-stream")
			ctx.Response.Header.Set(fasthttp.HeaderCacheControl, "no-cache")
			ctx.SetBody(stream)
		} else { // a kept answer we cannot replay as a stream: the whole body is still an answer
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		}
	} else {
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	}
	if ex.wd != nil {
		ex.wd.stop()
	}
	ex.done = true
	ex.record(fasthttp.StatusOK, "cache")
}

// cachedAnswer is what replaying needs of a kept chat or completions body.
type cachedAnswer struct {
	ID                string          `json:"id"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint json.RawMessage `json:"system_fingerprint,omitempty"`
	Choices           []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
			Refusal *string `json:"refusal,omitempty"`
		} `json:"message"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
}

// appendCachedStream appends the SSE stream of a kept answer: per choice, a chunk with its role and whole
// content (chat) or text (completions), then one with its finish reason (chat); the usage chunk when the
// client asked for it (stream_options.include_usage); and [DONE].
func appendCachedStream(dst, body []byte, e openai.Endpoint, includeUsage bool) ([]byte, error) {
	var a cachedAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return dst, err
	}
	object := "chat.completion.chunk"
	if e == openai.Completions {
		object = "text_completion"
	}
	type chunk struct {
		ID                string          `json:"id"`
		Object            string          `json:"object"`
		Created           int64           `json:"created"`
		Model             string          `json:"model"`
		SystemFingerprint json.RawMessage `json:"system_fingerprint,omitempty"`
		Choices           []any           `json:"choices"`
		Usage             json.RawMessage `json:"usage,omitempty"`
	}
	emit := func(c chunk) error {
		c.ID, c.Object, c.Created, c.Model, c.SystemFingerprint = a.ID, object, a.Created, a.Model, a.SystemFingerprint
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		dst = append(append(append(dst, "data: "...), b...), "\n\n"...)
		return nil
	}
	for _, ch := range a.Choices {
		if e == openai.Completions {
			text := ""
			if ch.Text != nil {
				text = *ch.Text
			}
			if err := emit(chunk{Choices: []any{map[string]any{"index": ch.Index, "text": text, "logprobs": nil,
				"finish_reason": ch.FinishReason}}}); err != nil {
				return dst, err
			}
			continue
		}
		delta := map[string]any{"role": "assistant", "content": ""}
		if m := ch.Message; m != nil {
			if m.Role != "" {
				delta["role"] = m.Role
			}
			if m.Content != nil {
				delta["content"] = *m.Content
			}
			if m.Refusal != nil {
				delta["refusal"] = *m.Refusal
			}
		}
		if err := emit(chunk{Choices: []any{map[string]any{"index": ch.Index, "delta": delta, "logprobs": nil,
			"finish_reason": nil}}}); err != nil {
			return dst, err
		}
		if err := emit(chunk{Choices: []any{map[string]any{"index": ch.Index, "delta": map[string]any{},
			"logprobs": nil, "finish_reason": ch.FinishReason}}}); err != nil {
			return dst, err
		}
	}
	if includeUsage && len(a.Usage) > 0 && !bytes.Equal(a.Usage, []byte("null")) {
		if err := emit(chunk{Choices: []any{}, Usage: a.Usage}); err != nil {
			return dst, err
		}
	}
	return openai.AppendDone(dst), nil
}
