package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The canonical prompt of the Responses and Anthropic Messages APIs (see the format above AppendPromptReference).
// Both carry a conversation as a list of typed objects (Responses input items, Anthropic messages) whose content
// is a string or a list of typed parts (content parts, content blocks), plus a prefix that clients resend
// unchanged on every turn (tools, then instructions or system). The fast path writes the conversation as it
// reads it and puts the prefix in front of it at the end, so the members may come in any order.

// isTextPart reports whether a content part of type typ (unescaped) contributes its "text" to the prompt.
func isTextPart(e Endpoint, typ []byte) bool {
	switch string(typ) {
	case "text":
		return true
	case "input_text", "output_text":
		return e == Responses
	}
	return false
}

// isOutputItem reports whether a Responses input item whose "type" is typ (unescaped) is model output: one of
// the item types the API returns in a response's "output" besides "message" (whose role tells). Inputs such as
// function_call_output and item_reference are not.
func isOutputItem(typ []byte) bool {
	switch string(typ) {
	case "function_call", "reasoning", "custom_tool_call", "web_search_call", "file_search_call", "computer_call",
		"code_interpreter_call", "image_generation_call", "local_shell_call", "shell_call", "apply_patch_call",
		"mcp_call", "mcp_list_tools", "mcp_approval_request":
		return true
	}
	return false
}

// prefixName is the name of the text member that follows "tools" in the prompt's prefix.
func prefixName(e Endpoint) string {
	if e == Responses {
		return "instructions"
	}
	return "system"
}

// listName is the name of the member that holds the conversation.
func listName(e Endpoint) string {
	if e == Responses {
		return "input"
	}
	return "messages"
}

// appendItemsReference is AppendPromptReference for Responses and Messages, on encoding/json maps (which match
// keys exactly and let the last of repeated keys win, as the fast path does).
func appendItemsReference(dst []byte, e Endpoint, body []byte) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return dst, fmt.Errorf("prompt: %w", err)
	}
	if tools := req["tools"]; !isNull(tools) {
		dst = append(dst, "tools:"...)
		dst = append(dst, tools...)
		dst = append(dst, '\n')
	}
	if pre := req[prefixName(e)]; !isNull(pre) {
		if e == Responses && pre[0] != '"' {
			return dst, errors.New("prompt: instructions must be a string")
		}
		dst = append(dst, prefixName(e)...)
		dst = append(dst, ':')
		var err error
		if dst, err = appendTypedContentReference(dst, e, pre); err != nil {
			return dst, err
		}
		dst = append(dst, '\n')
	}
	list := req[listName(e)]
	switch {
	case isNull(list):
		return dst, nil
	case e == Responses && list[0] == '"':
		dst = append(dst, "user:"...)
		dst, err := appendTypedContentReference(dst, e, list)
		return append(dst, '\n'), err
	case list[0] != '[':
		return dst, fmt.Errorf("prompt: %s must be an array", listName(e))
	}
	var items []json.RawMessage
	if err := json.Unmarshal(list, &items); err != nil {
		return dst, fmt.Errorf("prompt: %w", err)
	}
	for _, it := range items {
		it = bytes.TrimSpace(it)
		var m map[string]json.RawMessage
		if it[0] != '{' || json.Unmarshal(it, &m) != nil || !isMessageItem(e, m["type"]) {
			dst = append(dst, it...)
			dst = append(dst, '\n')
			continue
		}
		if role := m["role"]; !isNull(role) {
			var s string
			if err := json.Unmarshal(role, &s); err != nil {
				return dst, fmt.Errorf("prompt: role: %w", err)
			}
			dst = append(dst, s...)
		}
		dst = append(dst, ':')
		var err error
		if dst, err = appendTypedContentReference(dst, e, m["content"]); err != nil {
			return dst, err
		}
		dst = append(dst, '\n')
	}
	return dst, nil
}

func isNull(v json.RawMessage) bool { return len(v) == 0 || bytes.Equal(v, []byte("null")) }

// isMessageItem reports whether an item whose "type" is typ is a message: every Anthropic message is; a
// Responses item is when its type is absent, null or "message".
func isMessageItem(e Endpoint, typ json.RawMessage) bool {
	if e == Messages || isNull(typ) {
		return true
	}
	var s string
	return json.Unmarshal(typ, &s) == nil && s == "message"
}

func appendTypedContentReference(dst []byte, e Endpoint, content json.RawMessage) ([]byte, error) {
	if isNull(content) {
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
	default:
		return dst, errors.New("prompt: content must be a string or an array")
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(content, &parts); err != nil {
		return dst, fmt.Errorf("prompt: content: %w", err)
	}
	for _, p := range parts {
		p = bytes.TrimSpace(p)
		var m map[string]json.RawMessage
		var typ, text string
		if p[0] == '{' && json.Unmarshal(p, &m) == nil &&
			json.Unmarshal(m["type"], &typ) == nil && isTextPart(e, []byte(typ)) &&
			len(m["text"]) > 0 && m["text"][0] == '"' && json.Unmarshal(m["text"], &text) == nil {
			dst = append(dst, text...)
		} else {
			dst = append(dst, p...)
		}
	}
	return dst, nil
}

// contentParam names the content at list[n] for error messages, or list itself when n < 0 (Anthropic "system").
func contentParam(list string, n int) string {
	if n < 0 {
		return list
	}
	return param(list, n) + ".content"
}

// prefixTools records the "tools" value at b[v] of a Responses or Messages request; the last one wins.
func (p *parser) prefixTools(v int) (int, error) {
	end, err := p.skip(v, 1)
	if err != nil {
		return end, err
	}
	switch p.b[v] {
	case 'n':
		p.toolsSpan = noSpan
	case '[':
		p.toolsSpan = Span{v, end}
	default:
		p.toolsSpan = Span{v, end}
		if p.s != nil {
			p.fail("tools", "tools must be an array")
		}
	}
	return end, nil
}

// prefixText records the Responses "instructions" or Anthropic "system" value at b[v]; the last one wins. Its
// text is written, and its parts checked, by writePrefix.
func (p *parser) prefixText(v int) (int, error) {
	end, err := p.skip(v, 1)
	if err != nil {
		return end, err
	}
	p.prefixSpan, p.prefixErr = Span{v, end}, nil
	switch c := p.b[v]; {
	case c == 'n':
		p.prefixSpan = noSpan
	case c == '"', c == '[' && p.e == Messages:
	case p.e == Responses:
		p.prefixSpan = noSpan
		p.prefixErr = &RequestError{Param: "instructions", Message: "instructions must be a string"}
	default:
		p.prefixSpan = noSpan
		p.prefixErr = &RequestError{Param: "system", Message: "system must be a string or an array"}
	}
	return end, nil
}

// writePrefix puts "tools:...\n" and "instructions:...\n" (or "system:...\n") in front of the conversation
// written at out[promptStart:].
func (p *parser) writePrefix() {
	mark := len(p.out)
	if sp := p.toolsSpan; sp.Start >= 0 {
		p.out = append(p.out, "tools:"...)
		p.out = append(p.out, p.b[sp.Start:sp.End]...)
		p.out = append(p.out, '\n')
	}
	if sp := p.prefixSpan; sp.Start >= 0 {
		name := prefixName(p.e)
		p.out = append(p.out, name...)
		p.out = append(p.out, ':')
		p.typedContent(sp.Start, 1, name, -1) // validated by prefixText: cannot fail but on a part
		p.out = append(p.out, '\n')
	}
	n := len(p.out) - mark
	if n == 0 || mark == p.promptStart {
		return
	}
	p.out = append(p.out, p.out[mark:]...)                   // a copy of the prefix
	copy(p.out[p.promptStart+n:], p.out[p.promptStart:mark]) // the conversation moves right
	copy(p.out[p.promptStart:], p.out[mark+n:])              // the prefix goes first
	p.out = p.out[:mark+n]
}

// items writes the prompt of the Responses "input" or the Anthropic "messages" value at b[v]. Its faults are
// kept in listErr, so that a later occurrence of the member replaces them.
func (p *parser) items(v int) (int, error) {
	saved := p.semErr
	p.semErr = nil
	end, err := p.itemList(v)
	p.listErr, p.semErr = p.semErr, saved
	return end, err
}

func (p *parser) itemList(v int) (int, error) {
	b := p.b
	name := listName(p.e)
	p.sawPrompt = true
	p.out = p.out[:p.promptStart]
	p.beginList()
	switch {
	case b[v] == '[':
	case b[v] == 'n':
		p.sawPrompt = p.s == nil // for a request, null is as good as absent
		return p.literal(v)
	case b[v] == '"' && p.e == Responses:
		end, flags, err := p.str(v)
		if err == nil {
			p.out = append(p.out, "user:"...)
			p.out = appendUnescaped(p.out, b[v+1:end-1], flags)
			p.out = append(p.out, '\n')
		}
		return end, err
	default:
		end, err := p.skip(v, 1)
		if err == nil {
			if p.e == Responses {
				p.fail(name, "input must be a string or an array")
			} else {
				p.fail(name, "messages must be an array")
			}
		}
		return end, err
	}
	i, empty, err := p.open(v, 2)
	if err != nil {
		return i, err
	}
	if empty {
		if p.s != nil && p.e == Messages {
			p.fail(name, "messages must not be empty")
		}
		return i, nil
	}
	for n := 0; ; n++ {
		if i = p.ws(i); i >= len(b) {
			return i, p.errAt(i, "")
		}
		var end int
		if b[i] == '{' {
			end, err = p.item(i, n)
		} else {
			end, err = p.skip(i, 2)
			if err == nil {
				if p.s != nil {
					p.fail(param(name, n), "each item must be an object")
				}
				p.out = append(p.out, b[i:end]...)
				p.out = append(p.out, '\n')
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

// item writes the n-th item of the list, the object at b[v]: role + ":" + text + "\n" for a message, its raw
// JSON + "\n" for any other Responses item. In the usual member order (role before content, each once) it
// writes as it reads; otherwise it writes the last role and content at the end, and checks them then.
func (p *parser) item(v, n int) (int, error) {
	b := p.b
	name := listName(p.e)
	start := len(p.out)
	saved := p.semErr
	p.semErr = nil
	role, content := noSpan, noSpan
	var roleFlags uint8
	var roleKind byte // the first byte of the last role value; 0 when absent
	message := true   // every Anthropic message; a Responses item whose type is absent, null or "message"
	output := false   // a Responses item of another type that is model output (isOutputItem)
	var seenRole, seenContent bool
	phase := 0 // written so far: 1 the role, 2 the content
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
		case "type":
			end, err = p.skip(j, 3)
			if p.e == Responses && err == nil {
				switch b[j] {
				case 'n':
					message, output = true, false
				case '"':
					_, tf, _ := p.str(j)
					typ := keyName(b[j+1:end-1], tf, &p.keyBuf)
					message, output = string(typ) == "message", isOutputItem(typ)
				default:
					message, output = false, false
				}
			}
		case "role":
			direct = direct && !seenRole
			seenRole = true
			roleKind = b[j]
			role = noSpan
			if b[j] == '"' {
				end, roleFlags, err = p.str(j)
				role = Span{j, end}
				if err == nil && direct && phase == 0 {
					p.out = appendUnescaped(p.out, b[j+1:end-1], roleFlags)
					p.out = append(p.out, ':')
					phase = 1
				} else {
					direct = false
				}
			} else {
				end, err = p.skip(j, 3)
				direct = false
			}
		case "content":
			direct = direct && !seenContent
			seenContent = true
			mark := len(p.out)
			end, err = p.typedContent(j, 3, name, n)
			content = Span{j, end}
			if direct && phase == 1 {
				phase = 2
			} else {
				p.out = p.out[:mark]
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
	if !message {
		p.out = append(p.out[:start], b[v:i]...)
		p.out = append(p.out, '\n')
		p.semErr = saved
		p.answered(start, output)
		return i, nil
	}
	if !direct || phase == 0 {
		// Write and check the last role and content, the ones that count.
		p.semErr = nil
		p.out = p.out[:start]
		if role.Start >= 0 {
			p.out = appendUnescaped(p.out, b[role.Start+1:role.End-1], roleFlags)
		}
		p.out = append(p.out, ':')
		if content.Start >= 0 {
			p.typedContent(content.Start, 3, name, n) // validated above: no syntax error
		}
	}
	switch {
	case roleKind == 0 && p.s != nil:
		p.fail(param(name, n)+".role", "each message must have a role")
	case roleKind == 'n' && p.s != nil, roleKind != 0 && roleKind != 'n' && roleKind != '"':
		p.fail(param(name, n)+".role", "role must be a string")
	}
	if saved != nil {
		p.semErr = saved
	}
	p.out = append(p.out, '\n')
	p.answered(start, p.isAssistant(role, roleFlags)) // role is the last role, the one written
	return i, nil
}

// typedContent writes the text of the content value at b[v], a member of an object at depth d: a string, or
// the text parts of an array (see isTextPart); other parts contribute their raw JSON. list and n name it in
// errors (see contentParam).
func (p *parser) typedContent(v, d int, list string, n int) (int, error) {
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
		end, err := p.skip(v, d)
		if err == nil {
			p.fail(contentParam(list, n), "content must be a string or an array")
		}
		return end, err
	}
	i, empty, err := p.open(v, d+1)
	if err != nil || empty {
		return i, err
	}
	for k := 0; ; k++ {
		if i = p.ws(i); i >= len(b) {
			return i, p.errAt(i, "")
		}
		var end int
		if b[i] == '{' {
			end, err = p.typedPart(i, d+2)
		} else {
			end, err = p.skip(i, d+1)
			if err == nil {
				if p.s != nil {
					p.fail(param(contentParam(list, n), k), "each content part must be an object")
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

// typedPart writes the part object at b[v] (its own depth d): its unescaped "text" when its "type" is a text
// type and its "text" a string (the last of each counts), else its raw JSON.
func (p *parser) typedPart(v, d int) (int, error) {
	b := p.b
	typ, text := noSpan, noSpan
	var typFlags, textFlags uint8
	i, empty, err := p.open(v, d)
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
		case "type":
			typ = noSpan
			if b[j] == '"' {
				end, typFlags, err = p.str(j)
				typ = Span{j, end}
			} else {
				end, err = p.skip(j, d)
			}
		case "text":
			text = noSpan
			if b[j] == '"' {
				end, textFlags, err = p.str(j)
				text = Span{j, end}
			} else {
				end, err = p.skip(j, d)
			}
		default:
			end, err = p.skip(j, d)
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
	if typ.Start >= 0 && text.Start >= 0 && isTextPart(p.e, keyName(b[typ.Start+1:typ.End-1], typFlags, &p.keyBuf)) {
		p.out = appendUnescaped(p.out, b[text.Start+1:text.End-1], textFlags)
	} else {
		p.out = append(p.out, b[v:i]...)
	}
	return i, nil
}
