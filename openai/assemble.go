package openai

import (
	"fmt"
	"strconv"
)

// maxChoiceIndex bounds the choice and tool-call indexes an Assembler accepts, so that a hostile stream cannot
// make it allocate without bound.
const maxChoiceIndex = 8 * MaxN

// A StreamError is an error event in an upstream stream ({"error":{...}} in a chunk), as Assembler.Add reports it.
type StreamError struct {
	Message string // the upstream's message
	Type    string // the upstream's error type, if any
}

// Error returns the upstream's message with a prefix naming the stream as its source.
func (e *StreamError) Error() string { return "openai: error in upstream stream: " + e.Message }

// An Assembler re-assembles a streamed answer into the body a non-streaming request would have got, for
// clients that did not ask to stream (the gateway always streams upstream). Choices are kept by index (n > 1),
// their text concatenated; tool calls are merged by index (id, type and function name taken once, arguments
// concatenated); logprobs arrays are concatenated; usage comes from the include_usage chunk. String fragments
// are concatenated as escaped JSON, never decoded, so the text is byte for byte what the engine streamed.
//
// The zero Assembler is ready for chat; Reset prepares it for a new stream and keeps its buffers, so a reused
// Assembler works without allocating once its buffers have grown. It is not safe for concurrent use.
type Assembler struct {
	e                                   Endpoint
	id, created, model, fingerprint, us []byte // raw JSON values from the chunks
	hasUsage                            bool
	usage                               Usage
	choices                             []asmChoice
}

type asmChoice struct {
	used                              bool
	role                              []byte // raw JSON string
	content, refusal, reasoning       []byte // escaped string contents, concatenated; content is text for completions
	hasContent, hasRefusal, hasReason bool
	reasonKey                         string // "reasoning_content" or "reasoning", as the engine named it
	finish, stop                      []byte // raw JSON values
	hasStop, hasLogprobs              bool
	logprobs                          []asmArray
	tools                             []asmTool
}

// asmArray is one array member of a logprobs object, its elements concatenated.
type asmArray struct {
	key   []byte // raw key, without quotes
	elems []byte // elements joined by commas
}

type asmTool struct {
	index         int
	id, typ, name []byte // raw JSON strings
	args          []byte // escaped string contents, concatenated
}

// Reset prepares a for a new stream of endpoint e (Chat or Completions).
func (a *Assembler) Reset(e Endpoint) {
	a.e = e
	a.id, a.created, a.model, a.fingerprint, a.us = a.id[:0], a.created[:0], a.model[:0], a.fingerprint[:0], a.us[:0]
	a.hasUsage = false
	a.usage = Usage{}
	for i := range a.choices {
		a.choices[i].used = false
	}
	a.choices = a.choices[:0]
}

// Usage returns the usage of the stream's include_usage chunk; ok is false when there was none.
func (a *Assembler) Usage() (u Usage, ok bool) { return a.usage, a.hasUsage }

// Add adds one chunk, the data of one SSE event, in a single pass that also validates it. [DONE] is ignored. A
// chunk that is not a well-formed JSON object is a *SyntaxError; a chunk with an "error" member is returned as a
// *StreamError. After an error the assembled answer is unspecified (the stream is broken anyway). Add copies
// what it keeps: data may be reused as soon as it returns.
func (a *Assembler) Add(data []byte) error {
	sc := scanner{b: data, maxDepth: chunkDepth}
	i := sc.ws(0)
	if j := i + len("[DONE]"); j <= len(data) && string(data[i:j]) == "[DONE]" && sc.ws(j) == len(data) {
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
	failed := false
	end, err := members(&sc, i, 1, func(key []byte, v int) (int, error) {
		if string(key) == "choices" && data[v] == '[' {
			return elements(&sc, v, 2, func(pos, v int) (int, error) {
				if data[v] != '{' {
					return sc.skip(v, 2)
				}
				return a.addChoice(&sc, v, pos)
			})
		}
		end, err := sc.skip(v, 1)
		if err != nil {
			return end, err
		}
		val := data[v:end]
		switch string(key) {
		case "error":
			failed = failed || data[v] != 'n'
		case "id":
			if len(a.id) == 0 {
				a.id = append(a.id, val...)
			}
		case "created":
			if len(a.created) == 0 {
				a.created = append(a.created, val...)
			}
		case "model":
			if len(a.model) == 0 {
				a.model = append(a.model, val...)
			}
		case "system_fingerprint":
			if data[v] != 'n' {
				a.fingerprint = append(a.fingerprint[:0], val...)
			}
		case "usage":
			if data[v] == '{' {
				a.us = append(a.us[:0], val...)
				a.hasUsage = true
				a.usage = Usage{}
				readUsage(&sc, v, 1, &a.usage)
			}
		}
		return end, nil
	})
	if err == nil {
		err = sc.end(end)
	}
	if err != nil {
		return err
	}
	if failed {
		msg, typ := ParseUpstreamError(data)
		return &StreamError{Message: msg, Type: typ}
	}
	return nil
}

// addChoice merges the choice object at b[v], the pos-th in its chunk, and returns the index after it.
func (a *Assembler) addChoice(sc *scanner, v, pos int) (int, error) {
	b := sc.b
	index := pos
	var delta, text, logprobs, finish, stop Span = noSpan, noSpan, noSpan, noSpan, noSpan
	choiceEnd, err := members(sc, v, 3, func(key []byte, v int) (int, error) {
		end, err := sc.skip(v, 3)
		if err != nil {
			return end, err
		}
		sp := Span{v, end}
		switch string(key) {
		case "index":
			if b[v] != 'n' {
				n, ok := parseInt(b[v:end], maxChoiceIndex)
				index = n
				if !ok {
					index = -1
				}
			}
		case "delta":
			delta = sp
		case "text":
			text = sp
		case "logprobs":
			logprobs = sp
		case "finish_reason":
			finish = sp
		case "stop_reason":
			stop = sp
		}
		return end, nil
	})
	if err != nil {
		return choiceEnd, err
	}
	if index < 0 || index > maxChoiceIndex {
		return choiceEnd, fmt.Errorf("openai: choice index out of range (0 to %d)", maxChoiceIndex)
	}
	for len(a.choices) <= index {
		if len(a.choices) < cap(a.choices) {
			a.choices = a.choices[:len(a.choices)+1]
		} else {
			a.choices = append(a.choices, asmChoice{})
		}
		c := &a.choices[len(a.choices)-1]
		if !c.used {
			c.reset()
		}
	}
	c := &a.choices[index]
	c.used = true
	if delta.Start >= 0 && b[delta.Start] == '{' {
		if err := c.addDelta(sc, delta.Start); err != nil {
			return choiceEnd, err
		}
	}
	if text.Start >= 0 && b[text.Start] == '"' {
		c.content = append(c.content, b[text.Start+1:text.End-1]...)
		c.hasContent = true
	}
	if logprobs.Start >= 0 && b[logprobs.Start] == '{' {
		c.addLogprobs(sc, logprobs.Start)
	}
	if finish.Start >= 0 && b[finish.Start] != 'n' {
		c.finish = append(c.finish[:0], b[finish.Start:finish.End]...)
	}
	if stop.Start >= 0 {
		if !c.hasStop || b[stop.Start] != 'n' {
			c.stop = append(c.stop[:0], b[stop.Start:stop.End]...)
		}
		c.hasStop = true
	}
	return choiceEnd, nil
}

func (c *asmChoice) reset() {
	*c = asmChoice{
		role:      c.role[:0],
		content:   c.content[:0],
		refusal:   c.refusal[:0],
		reasoning: c.reasoning[:0],
		finish:    c.finish[:0],
		stop:      c.stop[:0],
		logprobs:  c.logprobs[:0],
		tools:     c.tools[:0],
	}
}

func (c *asmChoice) addDelta(sc *scanner, v int) error {
	b := sc.b
	var err error
	members(sc, v, 4, func(key []byte, v int) (int, error) {
		end, _ := sc.skip(v, 4)
		if b[v] != '"' && string(key) != "tool_calls" {
			return end, nil
		}
		str := b[v+1 : max(v+1, end-1)]
		switch string(key) {
		case "role":
			if len(c.role) == 0 {
				c.role = append(c.role, b[v:end]...)
			}
		case "content":
			c.content = append(c.content, str...)
			c.hasContent = true
		case "refusal":
			c.refusal = append(c.refusal, str...)
			c.hasRefusal = true
		case "reasoning_content", "reasoning":
			c.reasoning = append(c.reasoning, str...)
			if !c.hasReason {
				c.reasonKey = "reasoning_content"
				if string(key) == "reasoning" {
					c.reasonKey = "reasoning"
				}
			}
			c.hasReason = true
		case "tool_calls":
			if b[v] == '[' {
				err = c.addToolCalls(sc, v)
			}
		}
		return end, nil
	})
	return err
}

func (c *asmChoice) addToolCalls(sc *scanner, v int) error {
	b := sc.b
	i, empty, _ := sc.open(v, 5)
	for pos := 0; !empty; pos++ {
		i = sc.ws(i)
		end, _ := sc.skip(i, 5)
		if b[i] == '{' {
			index := pos
			id, typ, fn := noSpan, noSpan, noSpan
			members(sc, i, 6, func(key []byte, v int) (int, error) {
				end, _ := sc.skip(v, 6)
				switch string(key) {
				case "index":
					n, ok := parseInt(b[v:end], maxChoiceIndex)
					if ok {
						index = n
					} else if b[v] != 'n' {
						index = -1
					}
				case "id":
					id = Span{v, end}
				case "type":
					typ = Span{v, end}
				case "function":
					fn = Span{v, end}
				}
				return end, nil
			})
			if index < 0 {
				return fmt.Errorf("openai: tool call index out of range (0 to %d)", maxChoiceIndex)
			}
			t := c.tool(index)
			if id.Start >= 0 && b[id.Start] == '"' && len(t.id) == 0 && id.End-id.Start > 2 {
				t.id = append(t.id, b[id.Start:id.End]...)
			}
			if typ.Start >= 0 && b[typ.Start] == '"' && len(t.typ) == 0 && typ.End-typ.Start > 2 {
				t.typ = append(t.typ, b[typ.Start:typ.End]...)
			}
			if fn.Start >= 0 && b[fn.Start] == '{' {
				members(sc, fn.Start, 7, func(key []byte, v int) (int, error) {
					end, _ := sc.skip(v, 7)
					if b[v] != '"' {
						return end, nil
					}
					switch string(key) {
					case "name":
						if len(t.name) == 0 && end-v > 2 {
							t.name = append(t.name, b[v:end]...)
						}
					case "arguments":
						t.args = append(t.args, b[v+1:end-1]...)
					}
					return end, nil
				})
			}
		}
		var more bool
		if i, more, _ = sc.next(end, ']'); !more {
			return nil
		}
	}
	return nil
}

// tool returns the tool call with index, adding it (in index order) when it is new.
func (c *asmChoice) tool(index int) *asmTool {
	k := 0
	for k < len(c.tools) && c.tools[k].index < index {
		k++
	}
	if k < len(c.tools) && c.tools[k].index == index {
		return &c.tools[k]
	}
	var spare asmTool
	if len(c.tools) < cap(c.tools) {
		spare = c.tools[:len(c.tools)+1][len(c.tools)] // reuse the buffers of a call from an earlier stream
	}
	c.tools = append(c.tools, asmTool{})
	copy(c.tools[k+1:], c.tools[k:])
	c.tools[k] = asmTool{index: index, id: spare.id[:0], typ: spare.typ[:0], name: spare.name[:0], args: spare.args[:0]}
	return &c.tools[k]
}

func (c *asmChoice) addLogprobs(sc *scanner, v int) {
	b := sc.b
	c.hasLogprobs = true
	members(sc, v, 4, func(key []byte, v int) (int, error) {
		end, _ := sc.skip(v, 4)
		if b[v] != '[' {
			return end, nil
		}
		var arr *asmArray
		for k := range c.logprobs {
			if string(c.logprobs[k].key) == string(key) {
				arr = &c.logprobs[k]
			}
		}
		if arr == nil {
			if len(c.logprobs) < cap(c.logprobs) {
				c.logprobs = c.logprobs[:len(c.logprobs)+1]
			} else {
				c.logprobs = append(c.logprobs, asmArray{})
			}
			arr = &c.logprobs[len(c.logprobs)-1]
			arr.key = append(arr.key[:0], key...)
			arr.elems = arr.elems[:0]
		}
		if _, empty, _ := sc.open(v, 5); !empty {
			if len(arr.elems) > 0 {
				arr.elems = append(arr.elems, ',')
			}
			inner := b[v+1 : end-1] // the elements, as sent
			arr.elems = append(arr.elems, inner...)
		}
		return end, nil
	})
}

// AppendBody appends the non-streaming response body to dst, in the member order vLLM uses:
//
//	chat:        {"id","object":"chat.completion","created","model","choices":[{"index","message":{"role",
//	             "content","refusal"?,"tool_calls"?,"reasoning_content"?},"logprobs","finish_reason",
//	             "stop_reason"?}],"system_fingerprint","usage"}
//	completions: {"id","object":"text_completion","created","model","choices":[{"index","text","logprobs",
//	             "finish_reason","stop_reason"?}],"system_fingerprint","usage"}
//
// Members the stream never carried are null (content, logprobs, finish_reason, system_fingerprint, usage) or
// left out (refusal, tool_calls, reasoning, stop_reason). Choices appear in index order.
func (a *Assembler) AppendBody(dst []byte) []byte {
	chat := a.e != Completions
	dst = append(dst, `{"id":`...)
	dst = appendRawOrNull(dst, a.id)
	if chat {
		dst = append(dst, `,"object":"chat.completion","created":`...)
	} else {
		dst = append(dst, `,"object":"text_completion","created":`...)
	}
	dst = appendRawOrNull(dst, a.created)
	dst = append(dst, `,"model":`...)
	dst = appendRawOrNull(dst, a.model)
	dst = append(dst, `,"choices":[`...)
	first := true
	for i := range a.choices {
		c := &a.choices[i]
		if !c.used {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		if chat {
			dst = append(dst, `,"message":{"role":`...)
			if len(c.role) > 0 {
				dst = append(dst, c.role...)
			} else {
				dst = append(dst, `"assistant"`...)
			}
			dst = append(dst, `,"content":`...)
			dst = appendStringOrNull(dst, c.content, c.hasContent)
			if c.hasRefusal {
				dst = append(dst, `,"refusal":`...)
				dst = appendStringOrNull(dst, c.refusal, true)
			}
			if len(c.tools) > 0 {
				dst = append(dst, `,"tool_calls":[`...)
				for k := range c.tools {
					t := &c.tools[k]
					if k > 0 {
						dst = append(dst, ',')
					}
					dst = append(dst, `{"id":`...)
					dst = appendRawOrNull(dst, t.id)
					dst = append(dst, `,"type":`...)
					if len(t.typ) > 0 {
						dst = append(dst, t.typ...)
					} else {
						dst = append(dst, `"function"`...)
					}
					dst = append(dst, `,"function":{"name":`...)
					dst = appendRawOrNull(dst, t.name)
					dst = append(dst, `,"arguments":`...)
					dst = appendStringOrNull(dst, t.args, true)
					dst = append(dst, "}}"...)
				}
				dst = append(dst, ']')
			}
			if c.hasReason {
				dst = append(dst, `,"`...)
				dst = append(dst, c.reasonKey...)
				dst = append(dst, `":`...)
				dst = appendStringOrNull(dst, c.reasoning, true)
			}
			dst = append(dst, '}')
		} else {
			dst = append(dst, `,"text":`...)
			dst = appendStringOrNull(dst, c.content, true)
		}
		dst = append(dst, `,"logprobs":`...)
		if c.hasLogprobs {
			dst = append(dst, '{')
			for k := range c.logprobs {
				if k > 0 {
					dst = append(dst, ',')
				}
				dst = append(dst, '"')
				dst = append(dst, c.logprobs[k].key...)
				dst = append(dst, `":[`...)
				dst = append(dst, c.logprobs[k].elems...)
				dst = append(dst, ']')
			}
			dst = append(dst, '}')
		} else {
			dst = append(dst, "null"...)
		}
		dst = append(dst, `,"finish_reason":`...)
		dst = appendRawOrNull(dst, c.finish)
		if c.hasStop {
			dst = append(dst, `,"stop_reason":`...)
			dst = appendRawOrNull(dst, c.stop)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"system_fingerprint":`...)
	dst = appendRawOrNull(dst, a.fingerprint)
	dst = append(dst, `,"usage":`...)
	dst = appendRawOrNull(dst, a.us)
	return append(dst, '}')
}

func appendRawOrNull(dst, raw []byte) []byte {
	if len(raw) == 0 {
		return append(dst, "null"...)
	}
	return append(dst, raw...)
}

// appendStringOrNull appends escaped string contents in quotes, or null when !ok.
func appendStringOrNull(dst, escaped []byte, ok bool) []byte {
	if !ok {
		return append(dst, "null"...)
	}
	dst = append(dst, '"')
	dst = append(dst, escaped...)
	return append(dst, '"')
}
