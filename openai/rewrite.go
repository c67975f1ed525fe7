package openai

import "strconv"

// AppendUpstreamBody appends body to dst with the "model" value replaced by model (unless model is nil) and, when
// streamUsage is true, "stream" set to true and, for chat and completions, "stream_options" set so that
// include_usage is true (its other members kept). For Responses and Messages streamUsage sets "stream" alone:
// their streams always report usage (in response.completed, in message_start and message_delta), and neither
// has include_usage (a Responses stream_options is left as sent). Everything else is copied byte for byte, so
// the upstream sees the client's request as sent.
//
// s must be the result of a successful s.Parse of this very body. Parse refuses a body that repeats "model",
// "stream" or "stream_options" or spells one in another case, so the one occurrence rewritten is the one every
// JSON decoder we forward to (Python's, Go's) reads (docs/security.md). An absent "stream" or
// "stream_options" is inserted right after the body's opening brace (or after "stream"). The result aliases
// nothing: it is dst, grown as needed; it does not allocate when dst has room.
func AppendUpstreamBody(dst, body []byte, s *Summary, model []byte, streamUsage bool) []byte {
	type edit struct {
		at, end int // replace body[at:end] (at == end: insert at at)
		kind    uint8
	}
	const (
		editModel              = iota // the model string
		editTrue                      // the literal true
		editOptions                   // {"include_usage":true}
		editStreamAndOptions          // "stream":true,"stream_options":{"include_usage":true},
		editOptionsAfterStream        // ,"stream_options":{"include_usage":true}
		editStreamFirst               // "stream":true,
		editUsageFirst                // "include_usage":true, (or without the comma in an empty object)
	)
	var eds [3]edit
	n := 0
	if model != nil && s.ModelSpan.Start >= 0 {
		eds[n] = edit{s.ModelSpan.Start, s.ModelSpan.End, editModel}
		n++
	}
	if streamUsage {
		open := 0
		for open < len(body) && body[open] != '{' {
			open++
		}
		switch st, so := s.StreamSpan, s.StreamOptionsSpan; {
		case s.Endpoint >= Responses && st.Start < 0:
			eds[n] = edit{open + 1, open + 1, editStreamFirst}
			n++
		case s.Endpoint >= Responses:
			eds[n] = edit{st.Start, st.End, editTrue}
			n++
		case st.Start < 0 && so.Start < 0:
			eds[n] = edit{open + 1, open + 1, editStreamAndOptions}
			n++
		case so.Start < 0:
			eds[n] = edit{st.Start, st.End, editTrue}
			eds[n+1] = edit{st.End, st.End, editOptionsAfterStream}
			n += 2
		default:
			if st.Start < 0 {
				eds[n] = edit{open + 1, open + 1, editStreamFirst}
			} else {
				eds[n] = edit{st.Start, st.End, editTrue}
			}
			n++
			switch {
			case body[so.Start] == 'n':
				eds[n] = edit{so.Start, so.End, editOptions}
			case s.IncludeUsageSpan.Start >= 0:
				eds[n] = edit{s.IncludeUsageSpan.Start, s.IncludeUsageSpan.End, editTrue}
			default:
				eds[n] = edit{so.Start + 1, so.Start + 1, editUsageFirst}
			}
			n++
		}
	}
	// At most four edits at distinct places (insertions at the same place do not occur): sort by position.
	for i := 1; i < n; i++ {
		for j := i; j > 0 && eds[j].at < eds[j-1].at; j-- {
			eds[j], eds[j-1] = eds[j-1], eds[j]
		}
	}
	last := 0
	for _, e := range eds[:n] {
		dst = append(dst, body[last:e.at]...)
		last = e.end
		switch e.kind {
		case editModel:
			dst = AppendQuoted(dst, model)
		case editTrue:
			dst = append(dst, "true"...)
		case editOptions:
			dst = append(dst, `{"include_usage":true}`...)
		case editStreamAndOptions:
			dst = append(dst, `"stream":true,"stream_options":{"include_usage":true},`...)
		case editOptionsAfterStream:
			dst = append(dst, `,"stream_options":{"include_usage":true}`...)
		case editStreamFirst:
			dst = append(dst, `"stream":true,`...)
		case editUsageFirst:
			dst = append(dst, `"include_usage":true`...)
			if !emptyObject(body[e.at-1 : s.StreamOptionsSpan.End]) {
				dst = append(dst, ',')
			}
		}
	}
	return append(dst, body[last:]...)
}

// emptyObject reports whether obj, a valid JSON object, has no members.
func emptyObject(obj []byte) bool {
	for _, c := range obj[1:] {
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return c == '}'
		}
	}
	return false
}

// AppendPriority appends body, a JSON object, to dst with its top-level "priority" member set to priority:
// the value replaced where the member exists (its last occurrence, the one the engines' decoders read;
// Summary.Parse refuses a repeated one), else the member inserted first. It is the engine scheduling field of
// vLLM and SGLang (routing.EngineSpec.PriorityValue), set from the request's class so that a waiting critical
// request runs first. A body that is not a JSON object is appended unchanged. The result aliases nothing; it
// does not allocate when dst has room.
func AppendPriority(dst, body []byte, priority int) []byte {
	sc := scanner{b: body, maxDepth: MaxDepth}
	open := sc.ws(0)
	if open >= len(body) || body[open] != '{' {
		return append(dst, body...)
	}
	at := noSpan
	i, empty, err := sc.open(open, 1)
	var keyBuf [maxKeyLen]byte
	for more := !empty; err == nil && more; {
		raw, flags, v, kerr := sc.key(i)
		if kerr != nil {
			return append(dst, body...)
		}
		v = sc.ws(v)
		end, verr := sc.skip(v, 1)
		if verr != nil {
			return append(dst, body...)
		}
		if string(keyName(raw, flags, &keyBuf)) == "priority" {
			at = Span{v, end}
		}
		i, more, err = sc.next(end, '}')
	}
	if err != nil {
		return append(dst, body...)
	}
	if at.Start >= 0 {
		dst = append(dst, body[:at.Start]...)
		dst = strconv.AppendInt(dst, int64(priority), 10)
		return append(dst, body[at.End:]...)
	}
	dst = append(dst, body[:open+1]...)
	dst = append(dst, `"priority":`...)
	dst = strconv.AppendInt(dst, int64(priority), 10)
	if !empty {
		dst = append(dst, ',')
	}
	return append(dst, body[open+1:]...)
}
