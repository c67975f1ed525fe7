package openai

// Generic is what the gateway reads of a JSON request body for an endpoint it passes through without a
// summary of its own (rerank, score, /v2/embed, tokenize, detokenize, and the like): the model it names and
// whether the client asked for a stream. The body is validated as JSON (strictly, as Summary.Parse does) in the
// same pass. A Generic may be reused; it is not safe for concurrent use.
type Generic struct {
	// Model is the unescaped top-level "model" string; empty when absent or null. It aliases the body when the
	// string has no escapes, else a buffer the Generic owns; valid until the next ParseGeneric.
	Model []byte
	// ModelSpan is the position of the model value in the body (Start < 0 when absent), for a rename.
	ModelSpan Span
	// Stream is the top-level "stream" (false when absent, null or not true).
	Stream bool

	modelBuf []byte
}

// ParseGeneric fills g from body, which must be one JSON object. Duplicate keys: the last one wins, as in
// Summary.Parse. The error is a *RequestError: code invalid_json for a body that is not well-formed, no code
// for a model that is not a non-empty string.
func (g *Generic) ParseGeneric(body []byte) error {
	*g = Generic{ModelSpan: noSpan, modelBuf: g.modelBuf[:0]}
	sc := scanner{b: body, strict: true, maxDepth: MaxDepth}
	i := sc.ws(0)
	if i >= len(body) {
		return &RequestError{Message: "We could not parse the JSON body of your request: empty body", Code: "invalid_json"}
	}
	if body[i] != '{' {
		end, err := sc.skip(i, 0)
		if err == nil {
			err = sc.end(end)
		}
		if err != nil {
			return &RequestError{Message: "We could not parse the JSON body of your request: " + err.Error(), Code: "invalid_json"}
		}
		return &RequestError{Message: "the request body must be a JSON object"}
	}
	var bad *RequestError
	end, err := members(&sc, i, 1, func(key []byte, v int) (int, error) {
		end, err := sc.skip(v, 1)
		if err != nil {
			return end, err
		}
		switch string(key) {
		case "model":
			g.ModelSpan, g.Model, bad = Span{v, end}, nil, nil
			switch {
			case body[v] == 'n':
				g.ModelSpan = noSpan
			case body[v] != '"':
				bad = &RequestError{Param: "model", Message: "model must be a string"}
			case end-v == 2:
				bad = &RequestError{Param: "model", Message: "model must not be empty"}
			default:
				_, flags, _ := sc.str(v)
				if flags == 0 {
					g.Model = body[v+1 : end-1]
				} else {
					g.modelBuf = appendUnescaped(g.modelBuf[:0], body[v+1:end-1], flags)
					g.Model = g.modelBuf
				}
			}
		case "stream":
			g.Stream = body[v] == 't'
		}
		return end, nil
	})
	if err == nil {
		err = sc.end(end)
	}
	if err != nil {
		return &RequestError{Message: "We could not parse the JSON body of your request: " + err.Error(), Code: "invalid_json"}
	}
	if bad != nil {
		return bad
	}
	return nil
}

// AppendReplaced appends body to dst with the bytes in sp replaced by the JSON string value (quoted and
// escaped), for a rename of a value ParseGeneric located.
func AppendReplaced(dst, body []byte, sp Span, value string) []byte {
	if sp.Start < 0 {
		return append(dst, body...)
	}
	dst = append(dst, body[:sp.Start]...)
	dst = AppendQuoted(dst, value)
	return append(dst, body[sp.End:]...)
}
