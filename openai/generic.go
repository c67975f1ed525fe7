package openai

import "cmp"

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

// ParseGeneric fills g from body, which must be one JSON object. The members it reads, "model" and "stream",
// follow Summary.Parse's rule for the members the gateway acts on (docs/security.md): a second occurrence of one
// at the top level, or a key equal to one under case folding ("MODEL", "Stream"), is refused, so that the engine
// reads the model the gateway checked and renamed. Other repeated keys are left to the engine. The error is a
// *RequestError: code invalid_json for a body that is not well-formed, no code for an ambiguous member or a
// model that is not a non-empty string. It does not allocate on a body it accepts.
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
	bad, err := g.members(&sc, i)
	if err != nil {
		return &RequestError{Message: "We could not parse the JSON body of your request: " + err.Error(), Code: "invalid_json"}
	}
	if bad != nil {
		return bad
	}
	return nil
}

// members reads the top-level object at body[i] and what follows it. It returns the first fault of a member
// (the body is still validated to its end, so that a syntax error anywhere wins) or a syntax error.
func (g *Generic) members(sc *scanner, i int) (*RequestError, error) {
	body := sc.b
	var bad *RequestError
	var fields fieldSet
	var keyBuf [maxKeyLen]byte
	i, empty, err := sc.open(i, 1)
	for more := !empty; err == nil && more; {
		raw, flags, v, kerr := sc.key(i)
		if kerr != nil {
			return nil, kerr
		}
		if v = sc.ws(v); v >= len(body) {
			return nil, sc.errAt(v, "")
		}
		end, verr := sc.skip(v, 1)
		if verr != nil {
			return nil, verr
		}
		key := keyName(raw, flags, &keyBuf)
		if f, msg := fields.add(key, false); msg != "" && (f == fieldModel || f == fieldStream) && bad == nil {
			bad = &RequestError{Param: fieldNames[f], Message: msg}
		}
		switch string(key) {
		case "model":
			g.ModelSpan, g.Model = Span{v, end}, nil
			switch {
			case body[v] == 'n':
				g.ModelSpan = noSpan
			case body[v] != '"':
				bad = cmp.Or(bad, &RequestError{Param: "model", Message: "model must be a string"})
			case end-v == 2:
				bad = cmp.Or(bad, &RequestError{Param: "model", Message: "model must not be empty"})
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
		i, more, err = sc.next(end, '}')
	}
	if err == nil {
		err = sc.end(i)
	}
	return bad, err
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
