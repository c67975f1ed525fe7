package openai

import "bytes"

// Usage is the token accounting of a response ("usage"), in OpenAI's terms whatever the API: PromptTokens is the
// whole prompt, CachedTokens the part of it served from the prefix cache. Responses events map input_tokens,
// output_tokens, total_tokens and input_tokens_details.cached_tokens onto it. Anthropic's input_tokens counts
// only the prompt tokens neither read from nor written to its cache, so for Messages events PromptTokens is
// input_tokens + cache_read_input_tokens + cache_creation_input_tokens, CachedTokens is cache_read_input_tokens
// (HasCached when present), CompletionTokens is output_tokens, and TotalTokens stays 0 (Anthropic has none).
type Usage struct {
	PromptTokens, CompletionTokens, TotalTokens int
	CachedTokens                                int  // prompt_tokens_details.cached_tokens
	HasCached                                   bool // the usage reported cached_tokens (engines may omit it)
}

// ChunkInfo is what the gateway needs to know about one streamed chunk (the data of one SSE event): a chat or
// completions chunk (InspectChunk), or a Responses or Anthropic Messages event (InspectEvent). Fields not
// mentioned for an API stay zero for it. Every byte slice aliases the data inspected.
type ChunkInfo struct {
	Done bool // the data is [DONE] (chat and completions streams end with it)
	// Error reports an error: for chat and completions a non-null "error" member (vLLM and OpenAI mid-stream
	// errors); for Responses an event of type "error" or "response.failed"; for Messages of type "error".
	Error bool
	// Terminal reports the event that ends a Responses or Messages stream, which have no [DONE]: Responses
	// "response.completed", "response.incomplete" or "response.failed", Messages "message_stop".
	Terminal bool
	// ID is the raw response id (Responses: "response.id" of any event that carries a "response" object, such
	// as response.created) or message id (Messages: "message.id" of message_start), the bytes between the quotes
	// (escapes are not decoded; ids have none); nil otherwise.
	ID []byte
	// Body is the raw JSON of the "response" object of a Responses terminal event: the whole response, which
	// is what a client that did not stream expects as its body. nil otherwise.
	Body []byte
	// Content reports that some choice carries generated output: a non-empty delta.content,
	// delta.reasoning_content (or vLLM's newer delta.reasoning), delta.refusal or delta.tool_calls (chat), or a
	// non-empty text (completions). For Responses: an event of type response.output_text.delta,
	// response.refusal.delta, response.reasoning_text.delta, response.reasoning_summary_text.delta,
	// response.function_call_arguments.delta, response.audio.delta or response.audio.transcript.delta with a
	// non-empty string "delta". For Messages: a content_block_delta whose delta has a non-empty string "text",
	// "partial_json" or "thinking". The first chunk with Content marks the first token.
	Content bool
	// Tokens is how many choices carry output in this chunk (with n>1 an engine may send one choice per chunk
	// or several); a chunk usually holds one token per such choice, so it counts output tokens when usage is
	// missing. It is 1 for a Responses or Messages event with Content.
	Tokens int
	// UsageOnly reports the include_usage chunk: "choices":[] and a non-null "usage" (chat and completions).
	UsageOnly bool
	// HasUsage reports that the chunk carries a usage object, which Usage holds. Chat and completions: a
	// non-null "usage". Responses: the "response.usage" object of a terminal event (the complete usage).
	// Messages: "message.usage" of message_start and "usage" of message_delta, each partial: only the counts
	// present are set, the others are zero, so the relay folds them together with Usage.Merge.
	HasUsage bool
	Usage    Usage
	// FinishReason is the raw bytes between the quotes (escapes are not decoded; finish reasons have none) of:
	// the first non-null finish_reason in a chat or completions chunk; for a Responses terminal event, the
	// response's "incomplete_details.reason" ("max_output_tokens", "content_filter") when it has one, else its
	// "status" ("completed", "incomplete", "failed"); for Messages, message_delta's "delta.stop_reason"
	// ("end_turn", "max_tokens", "stop_sequence", "tool_use").
	FinishReason []byte
}

// InspectChunk fills ci from data, the data field of one streamed chunk, in a single scan that also validates
// the chunk's JSON. It does not allocate. ci.FinishReason aliases data. The error, for data that is neither
// [DONE] nor a well-formed JSON object, is a *SyntaxError.
func InspectChunk(data []byte, ci *ChunkInfo) error {
	*ci = ChunkInfo{}
	sc := scanner{b: data, maxDepth: chunkDepth}
	i := sc.ws(0)
	if j := i + len("[DONE]"); j <= len(data) && string(data[i:j]) == "[DONE]" && sc.ws(j) == len(data) {
		ci.Done = true
		return nil
	}
	if i >= len(data) || data[i] != '{' {
		end, err := sc.skip(i, 0)
		if err == nil {
			err = sc.end(end)
		}
		if err == nil {
			err = errNotObject
		}
		return err
	}
	noChoices := false
	end, err := members(&sc, i, 1, func(key []byte, v int) (int, error) {
		switch string(key) {
		case "error":
			ci.Error = data[v] != 'n'
		case "choices":
			ci.Content, ci.Tokens, ci.FinishReason, noChoices = false, 0, nil, false
			if data[v] == '[' {
				return inspectChoices(&sc, v, ci, &noChoices)
			}
		case "usage":
			ci.HasUsage = data[v] == '{'
			ci.Usage = Usage{}
			if ci.HasUsage {
				return readUsage(&sc, v, 1, &ci.Usage)
			}
		}
		return sc.skip(v, 1)
	})
	if err == nil {
		err = sc.end(end)
	}
	ci.UsageOnly = noChoices && ci.HasUsage
	return err
}

var errNotObject = &SyntaxError{Msg: "chunk is not a JSON object"}

// members calls fn for each member of the object at b[i] (depth is the object's own depth); fn scans the value
// starting at b[v] (sc.skip(v, depth) when it has no use for it) and returns the index after it. key is decoded
// when it has escapes and is one of knownKeys; fn must not retain it. members returns the index after the object.
func members(sc *scanner, i, depth int, fn func(key []byte, v int) (int, error)) (int, error) {
	b := sc.b
	i, empty, err := sc.open(i, depth)
	if err != nil || empty {
		return i, err
	}
	for {
		raw, flags, v, err := sc.key(i)
		if err != nil {
			return v, err
		}
		if v = sc.ws(v); v >= len(b) {
			return v, sc.errAt(v, "")
		}
		end, err := fn(knownKey(raw, flags), v)
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = sc.next(end, '}'); err != nil || !more {
			return i, err
		}
	}
}

// elements calls fn for each element of the array at b[i] (depth is the array's own depth); fn scans the
// element starting at b[v] and returns the index after it. It returns the index after the array.
func elements(sc *scanner, i, depth int, fn func(k, v int) (int, error)) (int, error) {
	b := sc.b
	i, empty, err := sc.open(i, depth)
	if err != nil || empty {
		return i, err
	}
	for k := 0; ; k++ {
		v := sc.ws(i)
		if v >= len(b) {
			return v, sc.errAt(v, "")
		}
		end, err := fn(k, v)
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = sc.next(end, ']'); err != nil || !more {
			return i, err
		}
	}
}

// knownKeys are the keys members' callers match. Keys with escapes are decoded only to be compared with them,
// so that no decoded key outlives the call (a decoded key passed to a callback would escape to the heap).
var knownKeys = [][]byte{
	[]byte("arguments"), []byte("cache_creation_input_tokens"), []byte("cache_read_input_tokens"),
	[]byte("cached_tokens"), []byte("choices"), []byte("completion_tokens"), []byte("content"), []byte("created"),
	[]byte("delta"), []byte("detail"), []byte("error"), []byte("error_type"), []byte("finish_reason"),
	[]byte("function"), []byte("id"), []byte("incomplete_details"), []byte("index"), []byte("input_tokens"),
	[]byte("input_tokens_details"), []byte("logprobs"), []byte("message"), []byte("model"), []byte("name"),
	[]byte("output_tokens"), []byte("partial_json"), []byte("prompt_tokens"), []byte("prompt_tokens_details"),
	[]byte("reason"), []byte("reasoning"), []byte("reasoning_content"), []byte("refusal"), []byte("response"),
	[]byte("role"), []byte("status"), []byte("stop_reason"), []byte("system_fingerprint"), []byte("text"),
	[]byte("thinking"), []byte("tool_calls"), []byte("total_tokens"), []byte("type"), []byte("usage"),
}

// knownKey returns raw when it has no escapes, else its decoding when that is one of knownKeys, else raw.
func knownKey(raw []byte, flags uint8) []byte {
	if flags == 0 {
		return raw
	}
	var buf [maxKeyLen]byte
	k := keyName(raw, flags, &buf)
	for _, kk := range knownKeys {
		if bytes.Equal(k, kk) {
			return kk
		}
	}
	return raw
}

// inspectChoices reads the choices array at b[v], counting the choices that carry output.
func inspectChoices(sc *scanner, v int, ci *ChunkInfo, empty *bool) (int, error) {
	b := sc.b
	*empty = true
	return elements(sc, v, 2, func(_, v int) (int, error) {
		*empty = false
		if b[v] != '{' {
			return sc.skip(v, 2)
		}
		out := false
		end, err := members(sc, v, 3, func(key []byte, v int) (int, error) {
			switch string(key) {
			case "delta":
				if b[v] == '{' {
					return scanDelta(sc, v, &out)
				}
			case "text":
				end, err := sc.skip(v, 3)
				out = out || (b[v] == '"' && end-v > 2)
				return end, err
			case "finish_reason":
				end, err := sc.skip(v, 3)
				if err == nil && ci.FinishReason == nil && b[v] == '"' {
					ci.FinishReason = b[v+1 : end-1]
				}
				return end, err
			}
			return sc.skip(v, 3)
		})
		if out {
			ci.Tokens++
			ci.Content = true
		}
		return end, err
	})
}

// scanDelta reads the delta object at b[v] (a choice's, depth 4) and returns the index after it, setting *out
// when one of its members carries generated output (ChunkInfo.Content's rule).
func scanDelta(sc *scanner, v int, out *bool) (int, error) {
	b := sc.b
	return members(sc, v, 4, func(key []byte, v int) (int, error) {
		end, err := sc.skip(v, 4)
		switch string(key) {
		case "content", "reasoning_content", "reasoning", "refusal":
			*out = *out || (b[v] == '"' && end-v > 2)
		case "tool_calls":
			*out = *out || (err == nil && b[v] == '[' && b[sc.ws(v+1)] != ']')
		}
		return end, err
	})
}

// readUsage reads the usage object at b[v], a member of an object at depth.
func readUsage(sc *scanner, v, depth int, u *Usage) (int, error) {
	b := sc.b
	return members(sc, v, depth+1, func(key []byte, v int) (int, error) {
		end, err := sc.skip(v, depth+1)
		if err != nil {
			return end, err
		}
		n, _ := parseInt(b[v:end], 1<<62)
		switch string(key) {
		case "prompt_tokens":
			u.PromptTokens = n
		case "completion_tokens":
			u.CompletionTokens = n
		case "total_tokens":
			u.TotalTokens = n
		case "prompt_tokens_details":
			u.CachedTokens, u.HasCached = 0, false
			if b[v] == '{' {
				members(sc, v, depth+2, func(key []byte, v int) (int, error) {
					end, err := sc.skip(v, depth+2)
					if err == nil && string(key) == "cached_tokens" {
						u.CachedTokens, _ = parseInt(b[v:end], 1<<62)
						u.HasCached = b[v] != 'n'
					}
					return end, err
				})
			}
		}
		return end, nil
	})
}

// AppendWithoutNullUsage appends data to dst with every top-level "usage":null member removed, along with the
// comma that joined it to its neighbours. OpenAI's hosted API adds "usage":null to every chunk when
// include_usage is set; when the gateway injected include_usage, the client must get the stream byte for byte
// as it would have been without it. Data that is not a JSON object, or has no such member, is appended
// unchanged. It does not allocate when dst has room.
func AppendWithoutNullUsage(dst, data []byte) []byte {
	if !bytes.Contains(data, []byte(`"usage"`)) && !bytes.Contains(data, []byte(`\u`)) {
		return append(dst, data...)
	}
	sc := scanner{b: data, maxDepth: chunkDepth}
	if end, err := sc.skip(0, 0); err != nil || sc.end(end) != nil {
		return append(dst, data...)
	}
	i := sc.ws(0)
	if data[i] != '{' {
		return append(dst, data...)
	}
	var buf [maxKeyLen]byte
	i, empty, _ := sc.open(i, 1)
	last := 0     // data[last:] is not yet copied
	prevEnd := -1 // end of the previous kept member's value, -1 before the first member kept
	for !empty {
		keyStart := sc.ws(i)
		raw, flags, v, _ := sc.key(i)
		v = sc.ws(v)
		end, _ := sc.skip(v, 1)
		next, more, _ := sc.next(end, '}')
		if data[v] == 'n' && string(keyName(raw, flags, &buf)) == "usage" {
			switch {
			case prevEnd >= 0: // drop from the comma after the previous member through this value
				dst = append(dst, data[last:max(last, prevEnd)]...)
				last = end
			case more: // first member: drop it and the comma (and blanks) up to the next key
				dst = append(dst, data[last:keyStart]...)
				last = sc.ws(next)
			default: // the only member
				dst = append(dst, data[last:keyStart]...)
				last = end
			}
		} else {
			prevEnd = end
		}
		if !more {
			break
		}
		i = next
	}
	return append(dst, data[last:]...)
}
