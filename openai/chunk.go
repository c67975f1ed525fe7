package openai

import "bytes"

// Usage is the token accounting of a response ("usage").
type Usage struct {
	PromptTokens, CompletionTokens, TotalTokens int
	CachedTokens                                int // prompt_tokens_details.cached_tokens
}

// ChunkInfo is what the gateway needs to know about one streamed chunk (the data of one SSE event).
type ChunkInfo struct {
	Done  bool // the data is [DONE]
	Error bool // the object has a non-null "error" member (vLLM and OpenAI mid-stream errors)
	// Content reports that some choice carries generated output: a non-empty delta.content,
	// delta.reasoning_content (or vLLM's newer delta.reasoning), delta.refusal or delta.tool_calls (chat), or a
	// non-empty text (completions). The first chunk with Content marks the first token.
	Content bool
	// Tokens is how many choices carry output in this chunk (with n>1 an engine may send one choice per chunk
	// or several); a chunk usually holds one token per such choice, so it counts output tokens when usage is
	// missing.
	Tokens int
	// UsageOnly reports the include_usage chunk: "choices":[] and a non-null "usage".
	UsageOnly bool
	HasUsage  bool // "usage" is present and not null; Usage holds it
	Usage     Usage
	// FinishReason is the first non-null finish_reason in the chunk, the raw bytes between the quotes (escapes
	// are not decoded; finish reasons have none). It aliases the data passed to InspectChunk.
	FinishReason []byte
}

// InspectChunk fills ci from data, the data field of one streamed chunk, in a single scan that validates the
// chunk's JSON. It does not allocate. ci.FinishReason aliases data. The error, for data that is neither [DONE]
// nor a JSON object, is a *SyntaxError (or a plain error for a well-formed non-object).
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
	choices := noSpan
	end, err := members(&sc, i, 1, func(key []byte, v, end int) error {
		switch string(key) {
		case "error":
			ci.Error = data[v] != 'n'
		case "choices":
			choices = Span{v, end}
		case "usage":
			ci.HasUsage = data[v] == '{'
			ci.Usage = Usage{}
			if ci.HasUsage {
				readUsage(&sc, v, &ci.Usage)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := sc.end(end); err != nil {
		return err
	}
	if choices.Start >= 0 && data[choices.Start] == '[' {
		i, empty, _ := sc.open(choices.Start, 2)
		ci.UsageOnly = empty && ci.HasUsage
		for !empty {
			i = sc.ws(i)
			e, _ := sc.skip(i, 2)
			if data[i] == '{' {
				if inspectChoice(&sc, i, ci) {
					ci.Tokens++
					ci.Content = true
				}
			}
			var more bool
			if i, more, _ = sc.next(e, ']'); !more {
				break
			}
		}
	}
	return nil
}

var errNotObject = &SyntaxError{Msg: "chunk is not a JSON object"}

// members calls fn for each member of the object at b[i] (depth is the object's own depth), after validating
// the member's value; key is decoded when it has escapes. It returns the index after the object. fn must not
// retain key.
func members(sc *scanner, i, depth int, fn func(key []byte, v, end int) error) (int, error) {
	i, empty, err := sc.open(i, depth)
	if err != nil || empty {
		return i, err
	}
	for {
		raw, flags, v, err := sc.key(i)
		if err != nil {
			return v, err
		}
		v = sc.ws(v)
		end, err := sc.skip(v, depth)
		if err != nil {
			return end, err
		}
		if err := fn(knownKey(raw, flags), v, end); err != nil {
			return end, err
		}
		var more bool
		if i, more, err = sc.next(end, '}'); err != nil || !more {
			return i, err
		}
	}
}

// knownKeys are the keys members' callers match. Keys with escapes are decoded only to be compared with them,
// so that no decoded key outlives the call (a decoded key passed to a callback would escape to the heap).
var knownKeys = [][]byte{
	[]byte("arguments"), []byte("cached_tokens"), []byte("choices"), []byte("completion_tokens"),
	[]byte("content"), []byte("created"), []byte("delta"), []byte("detail"), []byte("error"),
	[]byte("error_type"), []byte("finish_reason"), []byte("function"), []byte("id"), []byte("index"),
	[]byte("logprobs"), []byte("message"), []byte("model"), []byte("name"), []byte("prompt_tokens"),
	[]byte("prompt_tokens_details"), []byte("reasoning"), []byte("reasoning_content"), []byte("refusal"),
	[]byte("role"), []byte("stop_reason"), []byte("system_fingerprint"), []byte("text"), []byte("tool_calls"),
	[]byte("total_tokens"), []byte("type"), []byte("usage"),
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

// inspectChoice reads one (validated) choice object at b[i]; it reports whether the choice carries output.
func inspectChoice(sc *scanner, i int, ci *ChunkInfo) bool {
	b := sc.b
	out := false
	members(sc, i, 3, func(key []byte, v, end int) error {
		switch string(key) {
		case "delta":
			if b[v] == '{' {
				members(sc, v, 4, func(key []byte, v, end int) error {
					switch string(key) {
					case "content", "reasoning_content", "reasoning", "refusal":
						out = out || (b[v] == '"' && end-v > 2)
					case "tool_calls":
						if b[v] == '[' {
							_, empty, _ := sc.open(v, 5)
							out = out || !empty
						}
					}
					return nil
				})
			}
		case "text":
			out = out || (b[v] == '"' && end-v > 2)
		case "finish_reason":
			if ci.FinishReason == nil && b[v] == '"' {
				ci.FinishReason = b[v+1 : end-1]
			}
		}
		return nil
	})
	return out
}

// readUsage reads a (validated) usage object at b[v].
func readUsage(sc *scanner, v int, u *Usage) {
	b := sc.b
	members(sc, v, 2, func(key []byte, v, end int) error {
		n, _ := parseInt(b[v:end], 1<<62)
		switch string(key) {
		case "prompt_tokens":
			u.PromptTokens = n
		case "completion_tokens":
			u.CompletionTokens = n
		case "total_tokens":
			u.TotalTokens = n
		case "prompt_tokens_details":
			u.CachedTokens = 0
			if b[v] == '{' {
				members(sc, v, 3, func(key []byte, v, end int) error {
					if string(key) == "cached_tokens" {
						u.CachedTokens, _ = parseInt(b[v:end], 1<<62)
					}
					return nil
				})
			}
		}
		return nil
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
