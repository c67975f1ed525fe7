package openai

// Streamed events of the Responses and Anthropic Messages APIs. Unlike chat chunks, each event names itself in a
// "type" member, which may come anywhere in the object (OpenAI writes it first, but nothing promises it), and
// the members an event carries mean different things per type ("delta" is a string in Responses text events, an
// object in Anthropic ones; Anthropic's "usage" sits in message_start's "message" and at the top of
// message_delta). So the scanner reads what every type might need into an eventFields while it validates the
// event, and decides what counts once the type is known. Neither stream ends with [DONE]: the terminal event
// (response.completed and its siblings, message_stop) does.

// InspectEvent fills ci from data, the data field of one streamed event of an endpoint e request: chat and
// completions chunks go to InspectChunk; Responses and Messages events are read by the rules documented on
// ChunkInfo's fields, in one scan that also validates the event's JSON. Like InspectChunk it does not allocate,
// its byte slices alias data, and the error, for data that is neither [DONE] (tolerated from any upstream, and
// reported as Done) nor a well-formed JSON object, is a *SyntaxError.
func InspectEvent(e Endpoint, data []byte, ci *ChunkInfo) error {
	if e != Responses && e != Messages {
		return InspectChunk(data, ci)
	}
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
	f := eventFields{typ: noSpan, response: noSpan}
	end, err := members(&sc, i, 1, func(key []byte, v int) (int, error) {
		return f.member(&sc, e, key, v)
	})
	if err == nil {
		err = sc.end(end)
	}
	if err != nil {
		return err
	}
	// The longest type, response.reasoning_summary_text.delta, is 222 bytes written all in \u escapes; a string
	// with invalid UTF-8 cannot be one of ours.
	var buf [256]byte
	typ := ""
	if sp := f.typ; sp.Start >= 0 && f.typFlags&strInvalid == 0 && sp.End-sp.Start-2 <= len(buf) {
		typ = string(appendUnescaped(buf[:0], data[sp.Start+1:sp.End-1], f.typFlags)) // compared, never kept
	}
	if e == Responses {
		f.responses(typ, data, ci)
	} else {
		f.messages(typ, ci)
	}
	return nil
}

// eventFields is what InspectEvent reads from an event before it knows the event's type. Where a key repeats,
// the last occurrence counts: every field read from a member is reset when the member is met again.
type eventFields struct {
	typ      Span // the "type" string
	typFlags uint8

	// Responses
	deltaText bool // "delta" is a non-empty string
	response  Span // the "response" object
	respID    []byte
	status    []byte // response.status
	reason    []byte // response.incomplete_details.reason
	respUsage bool   // response.usage is an object
	usage     Usage  // response.usage

	// Messages
	deltaOut    [3]bool // delta.text, delta.partial_json, delta.thinking is a non-empty string
	stopReason  []byte  // delta.stop_reason
	msgID       []byte  // message.id
	msgUsage    bool    // message.usage is an object
	msgUsageVal Usage
	topUsage    bool // the top-level "usage" is an object
	topUsageVal Usage
}

// member reads one top-level member of an event.
func (f *eventFields) member(sc *scanner, e Endpoint, key []byte, v int) (int, error) {
	b := sc.b
	switch string(key) {
	case "type":
		f.typ = noSpan
		if b[v] == '"' {
			end, flags, err := sc.str(v)
			f.typ, f.typFlags = Span{v, end}, flags
			return end, err
		}
	case "delta":
		f.deltaText, f.deltaOut, f.stopReason = false, [3]bool{}, nil
		switch {
		case b[v] == '"':
			end, _, err := sc.str(v)
			f.deltaText = end-v > 2
			return end, err
		case b[v] == '{' && e == Messages:
			return members(sc, v, 2, func(key []byte, v int) (int, error) {
				end, err := sc.skip(v, 2)
				if err != nil {
					return end, err
				}
				out := b[v] == '"' && end-v > 2
				switch string(key) {
				case "text":
					f.deltaOut[0] = out
				case "partial_json":
					f.deltaOut[1] = out
				case "thinking":
					f.deltaOut[2] = out
				case "stop_reason":
					f.stopReason = nil
					if b[v] == '"' {
						f.stopReason = b[v+1 : end-1]
					}
				}
				return end, nil
			})
		}
	case "response":
		f.response, f.respID, f.status, f.reason, f.respUsage, f.usage = noSpan, nil, nil, nil, false, Usage{}
		if b[v] == '{' && e == Responses {
			end, err := f.responseObject(sc, v)
			f.response = Span{v, end}
			return end, err
		}
	case "message":
		f.msgID, f.msgUsage, f.msgUsageVal = nil, false, Usage{}
		if b[v] == '{' && e == Messages {
			return members(sc, v, 2, func(key []byte, v int) (int, error) {
				switch string(key) {
				case "id":
					end, err := sc.skip(v, 2)
					f.msgID = nil
					if err == nil && b[v] == '"' {
						f.msgID = b[v+1 : end-1]
					}
					return end, err
				case "usage":
					f.msgUsageVal = Usage{}
					if f.msgUsage = b[v] == '{'; f.msgUsage {
						return readEventUsage(sc, v, 2, true, &f.msgUsageVal)
					}
				}
				return sc.skip(v, 2)
			})
		}
	case "usage":
		f.topUsage, f.topUsageVal = false, Usage{}
		if b[v] == '{' && e == Messages {
			f.topUsage = true
			return readEventUsage(sc, v, 1, true, &f.topUsageVal)
		}
	}
	return sc.skip(v, 1)
}

// responseObject reads the Responses "response" object at b[v]: id, status, incomplete_details.reason, usage.
func (f *eventFields) responseObject(sc *scanner, v int) (int, error) {
	b := sc.b
	return members(sc, v, 2, func(key []byte, v int) (int, error) {
		switch string(key) {
		case "id", "status":
			end, err := sc.skip(v, 2)
			var s []byte
			if err == nil && b[v] == '"' {
				s = b[v+1 : end-1]
			}
			if string(key) == "id" {
				f.respID = s
			} else {
				f.status = s
			}
			return end, err
		case "incomplete_details":
			f.reason = nil
			if b[v] == '{' {
				return members(sc, v, 3, func(key []byte, v int) (int, error) {
					end, err := sc.skip(v, 3)
					if err == nil && string(key) == "reason" {
						f.reason = nil
						if b[v] == '"' {
							f.reason = b[v+1 : end-1]
						}
					}
					return end, err
				})
			}
		case "usage":
			f.usage = Usage{}
			if f.respUsage = b[v] == '{'; f.respUsage {
				return readEventUsage(sc, v, 2, false, &f.usage)
			}
		}
		return sc.skip(v, 2)
	})
}

// readEventUsage reads a Responses usage object (anthropic false) or an Anthropic one at b[v], a member of an
// object at depth. Responses: input_tokens (which includes the cached tokens), output_tokens, total_tokens and
// input_tokens_details.cached_tokens. Anthropic's input_tokens counts only the prompt tokens that were neither
// read from nor written to its cache, so PromptTokens is the sum of input_tokens, cache_read_input_tokens and
// cache_creation_input_tokens, and CachedTokens is cache_read_input_tokens (vLLM reports the whole prompt as
// input_tokens and no cache counts, which the sum leaves as it is).
func readEventUsage(sc *scanner, v, depth int, anthropic bool, u *Usage) (int, error) {
	b := sc.b
	var input, cacheRead, cacheWrite int
	end, err := members(sc, v, depth+1, func(key []byte, v int) (int, error) {
		end, err := sc.skip(v, depth+1)
		if err != nil {
			return end, err
		}
		n, _ := parseInt(b[v:end], 1<<62)
		switch string(key) {
		case "input_tokens":
			input = n
		case "output_tokens":
			u.CompletionTokens = n
		case "total_tokens":
			if !anthropic {
				u.TotalTokens = n
			}
		case "cache_read_input_tokens":
			if anthropic {
				cacheRead = n
				u.HasCached = b[v] != 'n'
			}
		case "cache_creation_input_tokens":
			if anthropic {
				cacheWrite = n
			}
		case "input_tokens_details":
			if anthropic {
				break
			}
			cacheRead, u.HasCached = 0, false
			if b[v] == '{' {
				members(sc, v, depth+2, func(key []byte, v int) (int, error) {
					end, err := sc.skip(v, depth+2)
					if err == nil && string(key) == "cached_tokens" {
						cacheRead, _ = parseInt(b[v:end], 1<<62)
						u.HasCached = b[v] != 'n'
					}
					return end, err
				})
			}
		}
		return end, nil
	})
	u.PromptTokens, u.CachedTokens = input, cacheRead
	if anthropic {
		u.PromptTokens += cacheRead + cacheWrite
	}
	return end, err
}

// responses commits the fields of a Responses event of type typ.
func (f *eventFields) responses(typ string, data []byte, ci *ChunkInfo) {
	if f.response.Start >= 0 {
		ci.ID = f.respID
	}
	switch typ {
	case "response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta",
		"response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
		"response.audio.delta", "response.audio.transcript.delta":
		if f.deltaText {
			ci.Content, ci.Tokens = true, 1
		}
	case "error":
		ci.Error = true
	case "response.failed", "response.completed", "response.incomplete":
		ci.Terminal = true
		ci.Error = typ == "response.failed"
		if f.response.Start < 0 {
			break
		}
		ci.Body = data[f.response.Start:f.response.End]
		ci.FinishReason = f.status
		if f.reason != nil {
			ci.FinishReason = f.reason
		}
		if f.respUsage {
			ci.HasUsage, ci.Usage = true, f.usage
		}
	}
}

// messages commits the fields of an Anthropic Messages event of type typ.
func (f *eventFields) messages(typ string, ci *ChunkInfo) {
	switch typ {
	case "message_start":
		ci.ID = f.msgID
		if f.msgUsage {
			ci.HasUsage, ci.Usage = true, f.msgUsageVal
		}
	case "content_block_delta":
		if f.deltaOut != [3]bool{} {
			ci.Content, ci.Tokens = true, 1
		}
	case "message_delta":
		ci.FinishReason = f.stopReason
		if f.topUsage {
			ci.HasUsage, ci.Usage = true, f.topUsageVal
		}
	case "message_stop":
		ci.Terminal = true
	case "error":
		ci.Error = true
	}
}

// Merge folds v, a partial usage reported later in the same stream, into u: each of v's PromptTokens,
// CompletionTokens and TotalTokens that is non-zero replaces u's, and v's CachedTokens replaces u's when
// v.HasCached (which then sets u.HasCached). A zero count in v counts as absent: the counts of a stream only grow,
// so a later zero never corrects an earlier report. The Anthropic relay merges message_start's usage (the
// prompt) with message_delta's (the output); TotalTokens stays 0 there, as Anthropic reports no total.
func (u *Usage) Merge(v Usage) {
	if v.PromptTokens != 0 {
		u.PromptTokens = v.PromptTokens
	}
	if v.CompletionTokens != 0 {
		u.CompletionTokens = v.CompletionTokens
	}
	if v.TotalTokens != 0 {
		u.TotalTokens = v.TotalTokens
	}
	if v.HasCached {
		u.CachedTokens, u.HasCached = v.CachedTokens, true
	}
}
