package openai

import (
	"errors"
	"strconv"
)

// A stream that yields its engine seat (docs/design.md, "Yielding seats") goes on elsewhere as a continuation:
// the request again, with the answer so far as the final assistant message that the engine continues (vLLM's
// and SGLang's continue_final_message), or appended to the prompt (completions). The client sees one stream: the
// continuation's chunks carry the first answer's id, and its usage counts the answer as one.

// ErrNotContinuable is AppendContinuation's error for a request whose answer cannot be continued elsewhere.
var ErrNotContinuable = errors.New("openai: the request cannot be continued from a partial answer")

// Partial returns what a stream assembled so far can be continued from: the response id (its raw JSON value) and
// the text so far (escaped JSON string contents: a chat message's content, or a completion's text). ok is false
// when it cannot be continued: not exactly one choice, of index 0; a choice that carries tool calls, a refusal
// or reasoning, none of which a final assistant message can hold as text; or one that has finished already.
func (a *Assembler) Partial() (id, text []byte, ok bool) {
	var c *asmChoice
	for i := range a.choices {
		if !a.choices[i].used {
			continue
		}
		if i != 0 || c != nil {
			return nil, nil, false
		}
		c = &a.choices[i]
	}
	if c == nil || len(c.tools) > 0 || c.hasRefusal || c.hasReason || len(c.finish) > 0 && string(c.finish) != "null" {
		return nil, nil, false
	}
	return a.id, c.content, true
}

// objectMember is one top-level member of a JSON object: its key, decoded, and its value's span.
type objectMember struct {
	raw        []byte // the key between its quotes, aliasing the object
	flags      uint8  // the key's escapes (scanner.str)
	start, end int    // the key's opening quote, and the index after the value
	v          int    // the value's first byte
}

// objectMembers appends the top-level members of the JSON object body to ms, in order, and returns them with
// the index of its closing brace; maxDepth bounds its nesting. A caller with a small array on its stack for ms
// allocates nothing for an object of that many members (a resumed stream's every chunk: AppendResumed).
func objectMembers(ms []objectMember, body []byte, maxDepth int) ([]objectMember, int, error) {
	sc := scanner{b: body, maxDepth: maxDepth}
	i := sc.ws(0)
	if i >= len(body) || body[i] != '{' {
		return nil, 0, errNotObject
	}
	ms = ms[:0]
	i, empty, err := sc.open(i, 1)
	if err != nil {
		return nil, 0, err
	}
	for !empty {
		start := sc.ws(i)
		raw, flags, v, err := sc.key(i)
		if err != nil {
			return nil, 0, err
		}
		v = sc.ws(v)
		end, err := sc.skip(v, 1)
		if err != nil {
			return nil, 0, err
		}
		ms = append(ms, objectMember{raw: raw, flags: flags, start: start, v: v, end: end})
		var more bool
		if i, more, err = sc.next(end, '}'); err != nil {
			return nil, 0, err
		}
		if !more {
			break
		}
	}
	if empty {
		return nil, i - 1, nil
	}
	return ms, i - 1, nil // i-1: the closing brace
}

// AppendContinuation appends to dst the body of a request that continues an answer to body (a chat or
// completions request, well formed: Summary.Parse accepted it) from its first generated tokens, text (escaped
// JSON string contents, as Partial returns it):
//
//	chat         the last "messages" array ends with {"role":"assistant","content":text}, and
//	             "continue_final_message" is true and "add_generation_prompt" false (vLLM refuses both true)
//	completions  text is appended to the "prompt" string
//	both         "max_tokens" and "max_completion_tokens" are lowered by generated (to at least 1), vLLM's
//	             "min_tokens" too (to at least 0), so that the answer as a whole is bounded as the client asked
//
// Other members are copied as they are. It returns ErrNotContinuable for a request whose answer a continuation
// cannot carry on: more than one choice ("n", "best_of"), chat whose final message is already being continued,
// completions whose prompt is not one string, or that echoes it or has a suffix.
func AppendContinuation(dst, body []byte, e Endpoint, text []byte, generated int) ([]byte, error) {
	if e != Chat && e != Completions {
		return dst, ErrNotContinuable
	}
	ms, closing, err := objectMembers(nil, body, referenceDepth) // a body Parse accepted
	if err != nil {
		return dst, err
	}
	target := "messages"
	if e == Completions {
		target = "prompt"
	}
	last := -1
	for i, m := range ms {
		val := body[m.v:m.end]
		switch m.name() {
		case target:
			last = i
		case "n", "best_of":
			if n, ok := parseInt(val, 1<<30); ok && n > 1 {
				return dst, ErrNotContinuable
			}
		case "continue_final_message", "echo":
			if string(val) == "true" {
				return dst, ErrNotContinuable
			}
		case "suffix":
			if e == Completions && string(val) != "null" {
				return dst, ErrNotContinuable
			}
		}
	}
	if last < 0 {
		return dst, ErrNotContinuable
	}
	tv := body[ms[last].v:ms[last].end]
	if e == Chat && tv[0] != '[' || e == Completions && tv[0] != '"' {
		return dst, ErrNotContinuable
	}
	n0 := len(dst)
	from := 0 // body[from:] is not copied yet
	for i, m := range ms {
		val := body[m.v:m.end]
		switch {
		case i == last && e == Chat:
			dst = append(dst, body[from:m.end-1]...) // up to the array's closing bracket
			if sc := (scanner{b: val}); val[sc.ws(1)] != ']' {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"role":"assistant","content":"`...)
			dst = append(dst, text...)
			dst = append(dst, `"}]`...)
		case i == last:
			dst = append(dst, body[from:m.end-1]...) // up to the string's closing quote
			dst = append(dst, text...)
			dst = append(dst, '"')
		case m.is("max_tokens") || m.is("max_completion_tokens") || m.is("min_tokens"):
			n, ok := parseInt(val, 1<<62)
			if !ok {
				continue
			}
			floor := 1
			if m.is("min_tokens") {
				floor = 0
			}
			dst = append(dst, body[from:m.v]...)
			dst = strconv.AppendInt(dst, int64(max(n-generated, floor)), 10)
		case e == Chat && (m.is("continue_final_message") || m.is("add_generation_prompt")):
			dst = append(dst, body[from:m.v]...)
			dst = strconv.AppendBool(dst, m.is("continue_final_message"))
		default:
			continue
		}
		from = m.end
	}
	dst = append(dst, body[from:closing]...)
	if e == Chat {
		for _, k := range [...]string{"continue_final_message", "add_generation_prompt"} {
			if !hasMember(ms, k) {
				dst = append(dst, `,"`...)
				dst = append(dst, k...)
				dst = append(dst, `":`...)
				dst = strconv.AppendBool(dst, k == "continue_final_message")
			}
		}
	}
	dst = append(dst, body[closing:]...)
	if len(dst) == n0 {
		return dst, ErrNotContinuable
	}
	return dst, nil
}

// is reports whether the member's key, decoded, is name.
func (m *objectMember) is(name string) bool {
	if m.flags == 0 {
		return string(m.raw) == name
	}
	var buf [maxKeyLen]byte
	return string(keyName(m.raw, m.flags, &buf)) == name
}

// name returns the member's key, decoded (allocating only for a key with escapes).
func (m *objectMember) name() string {
	var buf [maxKeyLen]byte
	return string(keyName(m.raw, m.flags, &buf))
}

func hasMember(ms []objectMember, key string) bool {
	for _, m := range ms {
		if m.is(key) {
			return true
		}
	}
	return false
}

// AppendResumed appends raw, one SSE event of a continuation whose data is the subslice data, to dst as part of
// the answer it continues: its top-level "id" becomes id (a raw JSON value), and a "usage" object counts the
// generated tokens of the answer before the continuation as output rather than prompt ("prompt_tokens" lowered
// and "completion_tokens" raised by generated; "total_tokens" stays, and a "cached_tokens" of
// "prompt_tokens_details" is cut to the prompt). The engine counted the continuation's prompt, in which those
// tokens were tokenized again, so the prompt it gives back may differ from the first answer's by a few tokens.
// An event that is not a JSON object, or has neither member, is appended unchanged.
func AppendResumed(dst, raw, data, id []byte, generated int) []byte {
	off, ok := subslice(raw, data)
	if !ok {
		return append(dst, raw...)
	}
	var arr [8]objectMember
	ms, _, err := objectMembers(arr[:0], data, chunkDepth) // an engine's chunk
	if err != nil {
		return append(dst, raw...)
	}
	dst = append(dst, raw[:off]...)
	from := 0
	for _, m := range ms {
		switch {
		case m.is("id") && len(id) > 0:
			dst = append(dst, data[from:m.v]...)
			dst = append(dst, id...)
			from = m.end
		case m.is("usage") && data[m.v] == '{':
			dst = append(dst, data[from:m.v]...)
			dst = appendUsageResumed(dst, data[m.v:m.end], generated)
			from = m.end
		}
	}
	dst = append(dst, data[from:]...)
	return append(dst, raw[off+len(data):]...)
}

// appendUsageResumed appends the usage object u with generated tokens moved from its prompt to its output.
func appendUsageResumed(dst, u []byte, generated int) []byte {
	var arr [8]objectMember
	ms, _, err := objectMembers(arr[:0], u, chunkDepth)
	if err != nil {
		return append(dst, u...)
	}
	prompt := -1
	for _, m := range ms {
		if m.is("prompt_tokens") {
			if n, ok := parseInt(u[m.v:m.end], 1<<62); ok {
				prompt = max(n-generated, 0)
			}
		}
	}
	from := 0
	for _, m := range ms {
		n, ok := parseInt(u[m.v:m.end], 1<<62)
		switch {
		case m.is("prompt_tokens") && ok:
			n = prompt
		case m.is("completion_tokens") && ok:
			n += generated
		case m.is("prompt_tokens_details") && prompt >= 0 && u[m.v] == '{':
			dst = append(dst, u[from:m.v]...)
			dst = appendCachedCut(dst, u[m.v:m.end], prompt)
			from = m.end
			continue
		default:
			continue
		}
		dst = append(dst, u[from:m.v]...)
		dst = strconv.AppendInt(dst, int64(n), 10)
		from = m.end
	}
	return append(dst, u[from:]...)
}

// appendCachedCut appends the prompt_tokens_details object d with its cached_tokens at most prompt.
func appendCachedCut(dst, d []byte, prompt int) []byte {
	var arr [8]objectMember
	ms, _, err := objectMembers(arr[:0], d, chunkDepth)
	if err != nil {
		return append(dst, d...)
	}
	from := 0
	for _, m := range ms {
		if n, ok := parseInt(d[m.v:m.end], 1<<62); ok && m.is("cached_tokens") && n > prompt {
			dst = append(dst, d[from:m.v]...)
			dst = strconv.AppendInt(dst, int64(prompt), 10)
			from = m.end
		}
	}
	return append(dst, d[from:]...)
}
