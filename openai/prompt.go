package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Endpoint names the OpenAI API a request body belongs to.
type Endpoint uint8

// The endpoints Switchyard understands.
const (
	Chat        Endpoint = iota + 1 // POST /v1/chat/completions
	Completions                     // POST /v1/completions
	Embeddings                      // POST /v1/embeddings
	Responses                       // POST /v1/responses (OpenAI Responses API)
	Messages                        // POST /v1/messages (Anthropic Messages API)
)

// lastEndpoint is the highest Endpoint the package understands.
const lastEndpoint = Messages

// String returns the endpoint's path.
func (e Endpoint) String() string {
	switch e {
	case Chat:
		return "/v1/chat/completions"
	case Completions:
		return "/v1/completions"
	case Embeddings:
		return "/v1/embeddings"
	case Responses:
		return "/v1/responses"
	case Messages:
		return "/v1/messages"
	}
	return fmt.Sprintf("Endpoint(%d)", uint8(e))
}

// BytesPerToken is the prompt-length estimate used everywhere a tokenizer is not configured: one token per four
// bytes of canonical prompt text, rounded up. The simulator counts tokens the same way, so the gateway's estimate
// of uncached prefill work matches what the simulated engine does.
const BytesPerToken = 4

// EstimateTokens returns ceil(n / BytesPerToken).
func EstimateTokens(n int) int { return (n + BytesPerToken - 1) / BytesPerToken }

// The canonical prompt is the byte string that stands for "what the engine prefills", built the same way by the
// gateway (to hash prefix blocks) and by the simulator (to fill its KV cache), so that block boundaries agree:
//
//   - chat: if "tools" is present, "tools:" + its raw JSON + "\n"; then for each message in order:
//     role + ":" + text + "\n", where text is the unescaped string content, or for array content the
//     concatenation of each part's unescaped "text" (parts without "text", such as images, contribute their
//     raw JSON); an assistant message's "tool_calls" contribute their raw JSON after the text.
//   - completions: the unescaped prompt string; for a list of strings the first one; for a list of token IDs
//     (or a list of such lists) the raw JSON of the (first) list.
//   - embeddings: the unescaped input string, or the first string of a list, or the raw JSON of token IDs.
//   - responses: "tools:" + the raw JSON of "tools" + "\n" when present; then "instructions:" + its unescaped
//     string + "\n" when present; then the "input": a string as "user:" + text + "\n"; a list of items, each
//     in order: a message item (an object whose "type" is "message", absent or null) as role + ":" + text + "\n",
//     where text is the unescaped string content, or for array content the concatenation of the unescaped "text"
//     of each part whose "type" is "input_text", "output_text" or "text" (any other part, such as an image, a
//     file or a refusal, contributes its raw JSON); any other item (function_call, function_call_output,
//     reasoning, item_reference, or an item that is not an object) as its raw JSON + "\n".
//   - messages (Anthropic): "tools:" + the raw JSON of "tools" + "\n" when present; then "system:" + the system
//     text + "\n" when present, the text being the unescaped string or the concatenated text blocks; then each
//     message as role + ":" + text + "\n", text as for system: the unescaped string content, or the
//     concatenation of each block's unescaped "text" for blocks whose "type" is "text" (image, document,
//     thinking, tool_use and tool_result blocks contribute their raw JSON). A message that is not an object
//     contributes its raw JSON + "\n".
//
// For responses and messages a null member counts as absent, and where a key repeats the last one counts, as in
// the rest of the package; the members may come in any order (the canonical order above is restored).
//
// Raw JSON is copied byte for byte as the client sent it (clients resend identical bytes for identical tools).

// AppendPromptReference appends the canonical prompt of body to dst. It is the reference implementation, built on
// encoding/json for clarity: slow and allocating, kept as the oracle that the fast scanner is tested against.
func AppendPromptReference(dst []byte, e Endpoint, body []byte) ([]byte, error) {
	switch e {
	case Chat:
		var req struct {
			Tools    json.RawMessage `json:"tools"`
			Messages []struct {
				Role      string          `json:"role"`
				Content   json.RawMessage `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		if len(req.Tools) > 0 && !bytes.Equal(req.Tools, []byte("null")) {
			dst = append(dst, "tools:"...)
			dst = append(dst, req.Tools...)
			dst = append(dst, '\n')
		}
		for _, m := range req.Messages {
			dst = append(dst, m.Role...)
			dst = append(dst, ':')
			var err error
			if dst, err = appendContentReference(dst, m.Content); err != nil {
				return dst, err
			}
			if len(m.ToolCalls) > 0 && !bytes.Equal(m.ToolCalls, []byte("null")) {
				dst = append(dst, m.ToolCalls...)
			}
			dst = append(dst, '\n')
		}
		return dst, nil
	case Completions, Embeddings:
		field := "prompt"
		if e == Embeddings {
			field = "input"
		}
		var req map[string]json.RawMessage
		if err := json.Unmarshal(body, &req); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		return appendPromptValueReference(dst, req[field])
	case Responses, Messages:
		return appendItemsReference(dst, e, body)
	}
	return dst, fmt.Errorf("prompt: unknown endpoint %v", e)
}

func appendContentReference(dst []byte, content json.RawMessage) ([]byte, error) {
	content = bytes.TrimSpace(content)
	if len(content) == 0 || bytes.Equal(content, []byte("null")) {
		return dst, nil
	}
	switch content[0] {
	case '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return dst, fmt.Errorf("prompt: content: %w", err)
		}
		return append(dst, s...), nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(content, &parts); err != nil {
			return dst, fmt.Errorf("prompt: content: %w", err)
		}
		for _, p := range parts {
			var part struct {
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(p, &part); err == nil && part.Text != nil {
				dst = append(dst, *part.Text...)
			} else {
				dst = append(dst, bytes.TrimSpace(p)...)
			}
		}
		return dst, nil
	}
	return dst, errors.New("prompt: content must be a string or an array")
}

func appendPromptValueReference(dst []byte, v json.RawMessage) ([]byte, error) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || bytes.Equal(v, []byte("null")) {
		return dst, nil
	}
	switch v[0] {
	case '"':
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		return append(dst, s...), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(v, &items); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		if len(items) == 0 {
			return dst, nil
		}
		first := bytes.TrimSpace(items[0])
		switch {
		case len(first) > 0 && first[0] == '"':
			return appendPromptValueReference(dst, first)
		case len(first) > 0 && first[0] == '[':
			return append(dst, first...), nil // a batch of token-ID lists: the first list
		default:
			return append(dst, v...), nil // one list of token IDs
		}
	}
	return dst, errors.New("prompt: must be a string or an array")
}

// AppendPrompt appends the canonical prompt of body to dst (see the format above) and returns the extended
// buffer; on error it returns dst unchanged. It is the single-pass scanner that Summary.Parse also uses, without
// Parse's checks of the other parameters: it accepts exactly what the reference accepts and builds the same
// bytes, with one deliberate difference: keys are matched exactly, while encoding/json also matches them
// case-insensitively ("Messages", "ROLE"); OpenAI and vLLM match exactly. (The Responses and Messages references
// decode into maps, which match exactly too.) It does not allocate beyond growing dst
// (and, for a body nested more than 192 levels deep, a bit stack for the scanner). The result never aliases body.
func AppendPrompt(dst []byte, e Endpoint, body []byte) ([]byte, error) {
	if e < Chat || e > lastEndpoint {
		return dst, fmt.Errorf("prompt: unknown endpoint %v", e)
	}
	p := parser{
		scanner: scanner{b: body, maxDepth: referenceDepth},
		e:       e,
		out:     dst,
	}
	if err := p.run(); err != nil {
		return dst, fmt.Errorf("prompt: %w", err)
	}
	return p.out, nil
}

// param returns name[i], for error messages.
func param(name string, i int) string { return name + "[" + strconv.Itoa(i) + "]" }

// beginList starts the conversation of a "messages" or "input" value, written from the end of out.
func (p *parser) beginList() {
	p.listStart, p.answer, p.inAnswer, p.answerTail = len(p.out), -1, false, 0
}

// answered records whether the message or item just written at out[start:] is model output. The answer is
// the first of the last run of them (for chat and Messages each assistant message is a run of its own) that has
// some conversation before it.
func (p *parser) answered(start int, output bool) {
	switch {
	case !output:
		p.inAnswer = false
	case !p.inAnswer || p.e != Responses:
		p.inAnswer = true
		if start > p.listStart {
			p.answer = start
		}
	}
}

// endList ends the conversation begun by beginList, read in full. Nothing is written after it: the conversation
// is the tail of out, so the answer's distance from the end holds while run puts a prefix in front of it.
func (p *parser) endList() {
	if p.answer >= 0 {
		p.answerTail = len(p.out) - p.answer
	}
}

// isAssistant reports whether the role string at b[sp.Start:sp.End], with the scanner's flags, is "assistant"
// once unescaped; false for an absent role.
func (p *parser) isAssistant(sp Span, flags uint8) bool {
	return sp.Start >= 0 && string(keyName(p.b[sp.Start+1:sp.End-1], flags, &p.keyBuf)) == "assistant"
}

// messages writes the prompt of the chat "messages" value at b[v].
func (p *parser) messages(v int) (int, error) {
	b := p.b
	p.sawMessages = true
	p.sawPrompt = true
	p.out = p.out[:p.promptStart+p.toolsLen]
	p.beginList()
	switch b[v] {
	case '[':
	case 'n':
		p.sawPrompt = p.s == nil // for a request, null is as good as absent
		return p.literal(v)
	default:
		end, err := p.skip(v, 1)
		if err == nil {
			p.fail("messages", "messages must be an array")
		}
		return end, err
	}
	i, empty, err := p.open(v, 2)
	if err != nil {
		return i, err
	}
	if empty {
		if p.s != nil {
			p.fail("messages", "messages must not be empty")
		}
		return i, nil
	}
	for n := 0; ; n++ {
		i = p.ws(i)
		if i >= len(b) {
			return i, p.errAt(i, "")
		}
		var end int
		switch b[i] {
		case '{':
			end, err = p.message(i, n)
		case 'n':
			// encoding/json decodes a null element as a zero message: an empty role and no content.
			end, err = p.literal(i)
			if p.s != nil {
				p.fail(param("messages", n), "each message must be an object")
			}
			p.out = append(p.out, ':', '\n')
		default:
			end, err = p.skip(i, 2)
			if err == nil {
				p.fail(param("messages", n), "each message must be an object")
			}
		}
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = p.next(end, ']'); err != nil || !more {
			p.endList()
			return i, err
		}
	}
}

// message writes role + ":" + text + tool_calls + "\n" for the message object at b[v], the n-th message. In the
// usual member order (role, content, tool_calls) it writes as it reads; otherwise, or when a key repeats, it
// records where the values are and writes them in canonical order at the end.
func (p *parser) message(v, n int) (int, error) {
	b := p.b
	start := len(p.out)
	role, content, calls := noSpan, noSpan, noSpan
	var roleFlags uint8
	const (
		sawRole = 1 << iota
		sawContent
		sawCalls
	)
	var seen uint8
	phase := 0 // what is written so far in canonical order: 1 role, 2 content, 3 tool_calls
	direct := true
	i, empty, err := p.open(v, 3)
	if err != nil {
		return i, err
	}
	for !empty {
		raw, flags, j, err := p.key(i)
		if err != nil {
			return j, err
		}
		if j = p.ws(j); j >= len(b) {
			return j, p.errAt(j, "")
		}
		var end int
		switch string(keyName(raw, flags, &p.keyBuf)) {
		case "role":
			if seen&sawRole != 0 {
				direct = false
			}
			seen |= sawRole
			switch b[j] {
			case '"':
				end, roleFlags, err = p.str(j)
				role = Span{j, end}
				if err == nil && direct && phase == 0 {
					p.out = appendUnescaped(p.out, b[j+1:end-1], roleFlags)
					p.out = append(p.out, ':')
					phase = 1
				} else {
					direct = false
				}
			case 'n':
				// encoding/json leaves a string field as it was when it decodes null.
				end, err = p.literal(j)
				if p.s != nil {
					p.fail(param("messages", n)+".role", "role must be a string")
				}
			default:
				end, err = p.skip(j, 3)
				if err == nil {
					p.fail(param("messages", n)+".role", "role must be a string")
				}
			}
		case "content":
			if seen&sawContent != 0 {
				direct = false
			}
			seen |= sawContent
			mark := len(p.out)
			end, err = p.content(j, n)
			content = Span{j, end}
			if direct && phase == 1 {
				phase = 2
			} else {
				p.out = p.out[:mark]
				direct = false
			}
		case "tool_calls":
			if seen&sawCalls != 0 {
				direct = false
			}
			seen |= sawCalls
			end, err = p.skip(j, 3)
			calls = Span{j, end}
			if b[j] == 'n' {
				calls = noSpan
			} else if err == nil && p.s != nil && b[j] != '[' {
				p.fail(param("messages", n)+".tool_calls", "tool_calls must be an array")
			}
			if direct && (phase == 1 || phase == 2) {
				if calls.Start >= 0 {
					p.out = append(p.out, b[j:end]...)
				}
				phase = 3
			} else {
				direct = false
			}
		default:
			end, err = p.skip(j, 3)
		}
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = p.next(end, '}'); err != nil {
			return i, err
		}
		if !more {
			break
		}
	}
	if role.Start < 0 && p.s != nil {
		p.fail(param("messages", n)+".role", "each message must have a role")
	}
	if !direct || phase == 0 {
		p.out = p.out[:start]
		if role.Start >= 0 {
			p.out = appendUnescaped(p.out, b[role.Start+1:role.End-1], roleFlags)
		}
		p.out = append(p.out, ':')
		if content.Start >= 0 {
			p.content(content.Start, n) // validated above: cannot fail
		}
		if calls.Start >= 0 {
			p.out = append(p.out, b[calls.Start:calls.End]...)
		}
	}
	p.out = append(p.out, '\n')
	p.answered(start, p.isAssistant(role, roleFlags)) // role is the last string role, the one written
	return i, nil
}

// content writes the text of the content value at b[v] of the n-th message.
func (p *parser) content(v, n int) (int, error) {
	b := p.b
	switch b[v] {
	case '"':
		end, flags, err := p.str(v)
		if err == nil {
			p.out = appendUnescaped(p.out, b[v+1:end-1], flags)
		}
		return end, err
	case 'n':
		return p.literal(v)
	case '[':
	default:
		end, err := p.skip(v, 3)
		if err == nil {
			p.fail(param("messages", n)+".content", "content must be a string or an array")
		}
		return end, err
	}
	i, empty, err := p.open(v, 4)
	if err != nil || empty {
		return i, err
	}
	for k := 0; ; k++ {
		if i = p.ws(i); i >= len(b) {
			return i, p.errAt(i, "")
		}
		var end int
		if b[i] == '{' {
			end, err = p.part(i)
		} else {
			// encoding/json fails to decode a non-object part into the part struct: the raw JSON stands in.
			end, err = p.skip(i, 4)
			if err == nil {
				if p.s != nil {
					p.fail(param(param("messages", n)+".content", k), "each content part must be an object")
				}
				p.out = append(p.out, b[i:end]...)
			}
		}
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = p.next(end, ']'); err != nil || !more {
			return i, err
		}
	}
}

// part writes a content part object at b[v]: its "text" string, or its raw JSON when it has none (images), as
// the reference does: a null "text" counts as none, and a "text" of another type makes the part raw.
func (p *parser) part(v int) (int, error) {
	b := p.b
	text := noSpan
	var textFlags uint8
	bad := false
	i, empty, err := p.open(v, 5)
	if err != nil {
		return i, err
	}
	for !empty {
		raw, flags, j, err := p.key(i)
		if err != nil {
			return j, err
		}
		if j = p.ws(j); j >= len(b) {
			return j, p.errAt(j, "")
		}
		var end int
		if string(keyName(raw, flags, &p.keyBuf)) == "text" {
			switch b[j] {
			case '"':
				end, textFlags, err = p.str(j)
				text = Span{j, end}
			case 'n':
				end, err = p.literal(j)
				text = noSpan
			default:
				end, err = p.skip(j, 5)
				bad = true
			}
		} else {
			end, err = p.skip(j, 5)
		}
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = p.next(end, '}'); err != nil {
			return i, err
		}
		if !more {
			break
		}
	}
	if text.Start >= 0 && !bad {
		p.out = appendUnescaped(p.out, b[text.Start+1:text.End-1], textFlags)
	} else {
		p.out = append(p.out, b[v:i]...)
	}
	return i, nil
}

// promptValue writes the prompt of the completions "prompt" or embeddings "input" value at b[v].
func (p *parser) promptValue(v int, name string) (int, error) {
	b := p.b
	p.out = p.out[:p.promptStart]
	p.tokenIDs = -1
	p.sawPrompt = true
	if p.s != nil {
		p.s.Prompts = 1
	}
	switch b[v] {
	case '"':
		end, flags, err := p.str(v)
		if err == nil {
			p.out = appendUnescaped(p.out, b[v+1:end-1], flags)
		}
		return end, err
	case 'n':
		p.sawPrompt = p.s == nil
		return p.literal(v)
	case '[':
	default:
		end, err := p.skip(v, 1)
		if err == nil {
			p.fail(name, "%s must be a string or an array", name)
		}
		return end, err
	}
	i, empty, err := p.open(v, 2)
	if err != nil {
		return i, err
	}
	if empty {
		if p.s != nil {
			p.fail(name, "%s must not be empty", name)
		}
		return i, nil
	}
	first := b[p.ws(i)] // the first item decides what the list is
	for k := 0; ; k++ {
		if i = p.ws(i); i >= len(b) {
			return i, p.errAt(i, "")
		}
		c := b[i]
		var end, ids int
		switch c {
		case '"':
			var flags uint8
			end, flags, err = p.str(i)
			if err == nil && k == 0 {
				p.out = appendUnescaped(p.out, b[i+1:end-1], flags)
			}
		case '[':
			end, ids, err = p.tokenList(i, name, k)
			if err == nil && k == 0 {
				p.out = append(p.out, b[i:end]...) // a batch of token-ID lists: the first list
				p.tokenIDs = ids
			}
		default:
			end, err = p.skip(i, 2)
		}
		if err != nil {
			return end, err
		}
		if p.s != nil {
			switch {
			case first == '"' || first == '[':
				if c != first {
					p.fail(name, "%s must be a string, an array of strings, an array of token IDs or an array of token-ID arrays", name)
				}
			case !isTokenID(b[i:end]):
				p.fail(param(name, k), "token IDs must be non-negative integers")
			}
		}
		var more bool
		if i, more, err = p.next(end, ']'); err != nil {
			return i, err
		}
		if !more {
			switch first {
			case '"', '[':
				if p.s != nil {
					p.s.Prompts = k + 1
				}
			default:
				p.out = append(p.out, b[v:i]...) // one list of token IDs
				p.tokenIDs = k + 1
			}
			return i, nil
		}
	}
}

// tokenList validates the token-ID list at b[v], the k-th item of name, and counts its items.
func (p *parser) tokenList(v int, name string, k int) (int, int, error) {
	if p.s == nil {
		end, err := p.skip(v, 2)
		return end, 0, err
	}
	b := p.b
	i, empty, err := p.open(v, 3)
	if err != nil || empty {
		return i, 0, err
	}
	for n := 1; ; n++ {
		j := p.ws(i)
		end, err := p.skip(j, 3)
		if err != nil {
			return end, 0, err
		}
		if !isTokenID(b[j:end]) {
			p.fail(param(name, k), "token IDs must be non-negative integers")
		}
		var more bool
		if i, more, err = p.next(end, ']'); err != nil || !more {
			return i, n, err
		}
	}
}

func isTokenID(num []byte) bool {
	_, ok := parseInt(num, 1<<31-1)
	return ok
}
