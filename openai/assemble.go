package openai

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// maxChoiceIndex bounds the choice and tool-call indexes an Assembler accepts, so that a hostile stream cannot
// make it allocate without bound.
const maxChoiceIndex = 8 * MaxN

// maxMembers bounds the distinct members an Assembler keeps in one object. Members are found by a linear search
// (objects in an answer have a dozen members), so the bound also caps the cost of a chunk at maxMembers key
// comparisons per member.
const maxMembers = 1024

// ErrTooLarge is returned by Assembler.Add when the answer being assembled outgrows Assembler.Limit, or when one
// of its objects outgrows maxMembers distinct members. The stream must be abandoned: the gateway answers 502.
var ErrTooLarge = errors.New("openai: assembled answer too large")

// A StreamError is an error event in an upstream stream ({"error":{...}} in a chunk), as Assembler.Add reports it.
type StreamError struct {
	Message string // the upstream's message
	Type    string // the upstream's error type, if any
}

// Error returns the upstream's message with a prefix naming the stream as its source.
func (e *StreamError) Error() string { return "openai: error in upstream stream: " + e.Message }

// An Assembler re-assembles a streamed answer into the body a non-streaming request would have got, for
// clients that did not ask to stream (the gateway always streams upstream). It keeps every member the engine
// sent, at every level, so that fields the gateway does not know (service_tier, message.annotations,
// message.audio, vLLM's kv_transfer_params, prompt_logprobs, token_ids, x_ extensions) reach the client.
//
// The members the gateway knows keep their own rules. Choices are kept by index (n > 1); delta.content (text
// for completions), delta.refusal and delta.reasoning_content (or vLLM's newer delta.reasoning) are concatenated
// as escaped JSON, never decoded, so the text is byte for byte what the engine streamed; delta.role is taken
// once; tool calls are merged by index (id, type and function name taken once, arguments concatenated; their
// other members, and their function's, merge as a delta's do).
//
// Every other member merges by where it sits, because the two kinds of place carry different things:
//
//   - At the top level of the chunk, in a choice and in usage (whose members are all kept this way), the last
//     non-null value wins, copied raw. Engines repeat these members in every chunk (id, model,
//     system_fingerprint, service_tier) or send them once, complete, at the end (usage, kv_transfer_params,
//     prompt_logprobs), so the last value is the final one. A member only ever sent as null is kept as null.
//   - Inside a delta, which becomes the message, a member carries a piece of the answer: strings concatenate,
//     arrays append their elements, objects merge member by member with these same rules, and other scalars
//     take the last non-null value. So a streamed message.audio {id, data, transcript, expires_at} assembles as
//     OpenAI's non-streaming message.audio. A string or array that came as the same raw bytes every time is
//     kept once: an engine that repeats an id in every delta means one id. (A completion has no message, so
//     there they are dropped, as is a "message" member of a chunk's choice, which the body's own would double.)
//   - Logprobs merge like a delta, except that arrays always append: two tokens may have byte-equal entries.
//
// A value that came once is copied byte for byte. Members appear in the order they were first seen, after the
// members the gateway writes itself (see AppendBody); a key is matched by its decoded value, and written with
// the bytes it had when first seen.
//
// The zero Assembler is ready for chat; Reset prepares it for a new stream and keeps its buffers, so a reused
// Assembler works without allocating once its buffers have grown (members it does not know are copied into
// those buffers, never into a map). It is not safe for concurrent use.
type Assembler struct {
	// Limit bounds the bytes of data the Assembler keeps (text, raw values and keys; its bookkeeping is not
	// counted). Add returns ErrTooLarge for the chunk that takes it past the bound, so it is exceeded by at most
	// one chunk. 0 means unlimited. Reset keeps it.
	Limit int

	e                               Endpoint
	id, created, model, fingerprint []byte // raw JSON values from the chunks, the last non-null
	hasUsage                        bool
	usage                           nref // the usage object, its members merged
	top                             nref // the top-level members the gateway does not know
	choices                         []asmChoice
	nodes                           []asmNode // the arena of kept members; nref n is nodes[n-1]
	size                            int       // bytes kept, checked against Limit
	us                              []byte    // the usage object, as Usage reads it
	kb1, kb2                        []byte    // decoded keys, as sameKey compares them
	spans                           []asmSpan // the unknown members of the choice being added

	ci        *ChunkInfo // AddInspect's: filled while the chunk is merged; nil in Add
	noChoices bool       // AddInspect: the last "choices" was an empty array (ChunkInfo.UsageOnly)
}

type asmChoice struct {
	used                              bool
	role                              []byte // raw JSON string
	content, refusal, reasoning       []byte // escaped string contents, concatenated; content is text for completions
	hasContent, hasRefusal, hasReason bool
	reasonKey                         string // "reasoning_content" or "reasoning", as the engine named it
	finish, stop                      []byte // raw JSON values
	hasStop                           bool
	logprobs                          nref // the logprobs object, 0 until one came
	ext                               nref // the choice's members the gateway does not know
	msg                               nref // the delta's members the gateway does not know
	tools                             []asmTool
}

type asmTool struct {
	index         int
	id, typ, name []byte // raw JSON strings
	args          []byte // escaped string contents, concatenated
	ext, fn       nref   // the members the gateway does not know of the call and of its function
}

// asmSpan is a member of the chunk being added: its raw key (aliasing the chunk) and where its value starts.
type asmSpan struct {
	key    []byte
	v, end int
}

// nref refers to an asmNode: n is Assembler.nodes[n-1], 0 is none. Indexes rather than pointers, because the
// arena grows while members are merged.
type nref int32

// An asmNode is one kept value: a member of an object (key set) or the root of a set of members.
type asmNode struct {
	key  []byte // raw key as first seen, between the quotes
	esc  bool   // key has escapes or invalid UTF-8, so it is compared decoded
	kind uint8
	// reps counts, for strings and arrays, the values that came with the same bytes; while it is positive val
	// holds that raw value, quotes or brackets included. At 0 val holds the contents (strings) or the elements
	// joined by commas (arrays) of every value, concatenated.
	reps              int
	val               []byte // the raw value (kindRaw), or as reps says
	members           int    // kindObj: how many members
	first, last, next nref   // kindObj: the members in order; next: the following member of the parent
}

const (
	kindNone uint8 = iota // a member whose value has not been read (an error interrupted it)
	kindRaw               // val is the raw value
	kindStr
	kindArr
	kindObj
)

// How a member that appears in several chunks merges (see the Assembler doc comment).
const (
	mergeLast   = iota // the last non-null value wins, copied raw
	mergeDelta         // strings concatenate, arrays append, objects merge; same bytes every time: kept once
	mergeAppend        // as mergeDelta, but strings and arrays always append (logprobs)
)

// Reset prepares a for a new stream of endpoint e (Chat or Completions).
func (a *Assembler) Reset(e Endpoint) {
	a.e = e
	a.id, a.created, a.model, a.fingerprint = a.id[:0], a.created[:0], a.model[:0], a.fingerprint[:0]
	a.hasUsage, a.usage, a.top = false, 0, 0
	for i := range a.choices {
		a.choices[i].used = false
	}
	a.choices = a.choices[:0]
	a.nodes = a.nodes[:0]
	a.size = 0
}

// Usage returns the usage of the stream (its usage objects merged member by member, the last non-null value of
// each winning); ok is false when there was none.
func (a *Assembler) Usage() (u Usage, ok bool) {
	if !a.hasUsage {
		return Usage{}, false
	}
	a.us = a.appendValue(a.us[:0], a.usage)
	sc := scanner{b: a.us, maxDepth: chunkDepth}
	readUsage(&sc, 0, 0, &u)
	return u, true
}

// Add adds one chunk, the data of one SSE event, in a single pass that also validates it. [DONE] is ignored. A
// chunk that is not a well-formed JSON object is a *SyntaxError; a chunk with an "error" member is returned as a
// *StreamError; an answer that outgrows Limit is ErrTooLarge. After an error the assembled answer is unspecified
// (the stream is broken anyway). Add copies what it keeps: data may be reused as soon as it returns.
func (a *Assembler) Add(data []byte) error {
	sc := scanner{b: data, maxDepth: chunkDepth}
	i := sc.ws(0)
	if j := i + len("[DONE]"); j <= len(data) && string(data[i:j]) == "[DONE]" && sc.ws(j) == len(data) {
		if a.ci != nil {
			a.ci.Done = true
		}
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
	end, err := a.addTop(&sc, i, &failed)
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
	if a.Limit > 0 && a.size > a.Limit {
		return ErrTooLarge
	}
	return nil
}

// AddInspect is Add that also fills ci as InspectChunk(data, ci) would, in the same scan: a client that does not
// stream needs both the chunk's facts (first token, usage, errors) and the merged answer, and scanning is the
// largest share of the gateway's own CPU per such request (bench/results/2026-12-02-overhead-cpu.md). Only the
// usage object and each choice's delta, a few dozen bytes, are scanned a second time. ci's byte slices alias data,
// as InspectChunk's. On an error ci holds what the scan read before it; a chunk InspectChunk rejects, AddInspect
// rejects too.
func (a *Assembler) AddInspect(data []byte, ci *ChunkInfo) error {
	*ci = ChunkInfo{}
	a.ci, a.noChoices = ci, false
	err := a.Add(data)
	a.ci = nil
	ci.UsageOnly = a.noChoices && ci.HasUsage
	return err
}

// addTop merges the members of the chunk object at b[i] and returns the index after it.
func (a *Assembler) addTop(sc *scanner, i int, failed *bool) (int, error) {
	b := sc.b
	i, empty, err := sc.open(i, 1)
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
		var buf [maxKeyLen]byte
		var end int
		ci := a.ci
		switch string(keyName(raw, flags, &buf)) {
		case "choices":
			if ci != nil { // as InspectChunk: the last "choices" member is the chunk's
				ci.Content, ci.Tokens, ci.FinishReason, a.noChoices = false, 0, nil, false
			}
			if b[v] != '[' {
				end, err = sc.skip(v, 1)
				break
			}
			a.noChoices = ci != nil
			end, err = elements(sc, v, 2, func(pos, v int) (int, error) {
				a.noChoices = false
				if b[v] != '{' {
					return sc.skip(v, 2)
				}
				return a.addChoice(sc, v, pos)
			})
		case "usage":
			if ci != nil {
				ci.HasUsage, ci.Usage = b[v] == '{', Usage{}
			}
			if b[v] != '{' {
				end, err = sc.skip(v, 1)
				break
			}
			a.hasUsage = true
			if ci != nil {
				if _, err = readUsage(sc, v, 1, &ci.Usage); err != nil {
					return v, err
				}
			}
			end, err = a.mergeMembers(sc, a.root(&a.usage), v, 2, mergeLast)
		case "id", "created", "model", "system_fingerprint", "object", "error":
			if end, err = sc.skip(v, 1); err != nil {
				return end, err
			}
			val := b[v:end]
			switch string(keyName(raw, flags, &buf)) {
			case "error":
				*failed = *failed || b[v] != 'n'
				if ci != nil {
					ci.Error = b[v] != 'n' // as InspectChunk: the last "error" member is the chunk's
				}
			case "object": // written by AppendBody
			default:
				if b[v] != 'n' {
					a.set(a.knownTop(keyName(raw, flags, &buf)), val)
				}
			}
		default:
			var m nref
			if m, err = a.member(a.root(&a.top), raw, flags); err == nil {
				end, err = a.merge(sc, m, v, 1, mergeLast)
			}
		}
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = sc.next(end, '}'); err != nil || !more {
			return i, err
		}
	}
}

// knownTop returns the buffer of a top-level member AppendBody writes itself.
func (a *Assembler) knownTop(key []byte) *[]byte {
	switch string(key) {
	case "id":
		return &a.id
	case "created":
		return &a.created
	case "model":
		return &a.model
	default:
		return &a.fingerprint
	}
}

// addChoice merges the choice object at b[v], the pos-th in its chunk, and returns the index after it.
func (a *Assembler) addChoice(sc *scanner, v, pos int) (int, error) {
	b := sc.b
	index := pos
	var delta, text, logprobs, finish, stop Span = noSpan, noSpan, noSpan, noSpan, noSpan
	a.spans = a.spans[:0]
	ci, out := a.ci, false
	choiceEnd, err := a.scanChoice(sc, v, func(key string, sp Span) {
		if ci != nil { // as inspectChoices, member by member
			switch key {
			case "delta":
				out = out || deltaOutput(sc, sp.Start)
			case "text":
				out = out || (b[sp.Start] == '"' && sp.End-sp.Start > 2)
			case "finish_reason":
				if ci.FinishReason == nil && b[sp.Start] == '"' {
					ci.FinishReason = b[sp.Start+1 : sp.End-1]
				}
			}
		}
		switch key {
		case "index":
			if b[sp.Start] != 'n' {
				n, ok := parseInt(b[sp.Start:sp.End], maxChoiceIndex)
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
	})
	if err != nil {
		return choiceEnd, err
	}
	if out {
		ci.Tokens++
		ci.Content = true
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
	for k := range a.spans {
		sp := &a.spans[k]
		m, err := a.member(a.root(&c.ext), sp.key, escapes(sp.key))
		if err != nil {
			return choiceEnd, err
		}
		mode := mergeLast
		if string(sp.key) == "token_ids" {
			// vLLM's return_token_ids: each chunk carries its own tokens' ids, and the non-streaming answer has
			// them all, in order.
			mode = mergeAppend
		}
		a.mergeValue(m, b[sp.v:sp.end], mode)
	}
	if delta.Start >= 0 && b[delta.Start] == '{' {
		if err := a.addDelta(sc, c, delta.Start); err != nil {
			return choiceEnd, err
		}
	}
	if text.Start >= 0 && b[text.Start] == '"' {
		a.cat(&c.content, b[text.Start+1:text.End-1])
		c.hasContent = true
	}
	if logprobs.Start >= 0 && b[logprobs.Start] == '{' {
		if _, err := a.mergeMembers(sc, a.root(&c.logprobs), logprobs.Start, 4, mergeAppend); err != nil {
			return choiceEnd, err
		}
	}
	if finish.Start >= 0 && b[finish.Start] != 'n' {
		a.set(&c.finish, b[finish.Start:finish.End])
	}
	if stop.Start >= 0 {
		if !c.hasStop || b[stop.Start] != 'n' {
			a.set(&c.stop, b[stop.Start:stop.End])
		}
		c.hasStop = true
	}
	return choiceEnd, nil
}

// deltaOutput reports whether the value at b[v], a choice's delta that scanChoice validated, carries generated
// output by InspectChunk's rule (scanDelta).
func deltaOutput(sc *scanner, v int) bool {
	out := false
	if sc.b[v] == '{' {
		scanDelta(sc, v, &out)
	}
	return out
}

// scanChoice validates the choice object at b[v] and returns the index after it. It calls known with the key
// and the value of each member the gateway knows, and records the others in a.spans.
func (a *Assembler) scanChoice(sc *scanner, v int, known func(key string, sp Span)) (int, error) {
	b := sc.b
	i, empty, err := sc.open(v, 3)
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
		end, err := sc.skip(v, 3)
		if err != nil {
			return end, err
		}
		var buf [maxKeyLen]byte
		switch key := keyName(raw, flags, &buf); string(key) {
		case "index", "delta", "text", "logprobs", "finish_reason", "stop_reason":
			known(choiceKey(key), Span{v, end})
		case "message": // AppendBody writes the message of a chat choice; a chunk has none
		default:
			a.spans = append(a.spans, asmSpan{raw, v, end})
		}
		var more bool
		if i, more, err = sc.next(end, '}'); err != nil || !more {
			return i, err
		}
	}
}

// choiceKey returns a decoded key of a choice as a constant string, so that the stack buffer holding it does
// not escape into the callback.
func choiceKey(key []byte) string {
	for _, k := range [...]string{"index", "delta", "text", "logprobs", "finish_reason", "stop_reason"} {
		if string(key) == k {
			return k
		}
	}
	return ""
}

// escapes returns the scanner flags of a raw key that the scanner accepted: whether it must be compared decoded.
func escapes(raw []byte) uint8 {
	if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		return strEscaped | strInvalid
	}
	return 0
}

func (c *asmChoice) reset() {
	*c = asmChoice{
		role:      c.role[:0],
		content:   c.content[:0],
		refusal:   c.refusal[:0],
		reasoning: c.reasoning[:0],
		finish:    c.finish[:0],
		stop:      c.stop[:0],
		tools:     c.tools[:0],
	}
}

// addDelta merges the delta object at b[v] (validated) into c.
func (a *Assembler) addDelta(sc *scanner, c *asmChoice, v int) error {
	b := sc.b
	i, empty, _ := sc.open(v, 4)
	for !empty {
		raw, flags, v, _ := sc.key(i)
		v = sc.ws(v)
		end, _ := sc.skip(v, 4)
		str := b[v+1 : max(v+1, end-1)]
		var buf [maxKeyLen]byte
		switch key := keyName(raw, flags, &buf); string(key) {
		case "role":
			if len(c.role) == 0 && b[v] == '"' {
				a.cat(&c.role, b[v:end])
			}
		case "content":
			if b[v] == '"' {
				a.cat(&c.content, str)
				c.hasContent = true
			}
		case "refusal":
			if b[v] == '"' {
				a.cat(&c.refusal, str)
				c.hasRefusal = true
			}
		case "reasoning_content", "reasoning":
			if b[v] != '"' {
				break
			}
			a.cat(&c.reasoning, str)
			if !c.hasReason {
				c.reasonKey = "reasoning_content"
				if string(key) == "reasoning" {
					c.reasonKey = "reasoning"
				}
			}
			c.hasReason = true
		case "tool_calls":
			if b[v] == '[' {
				if err := a.addToolCalls(sc, c, v); err != nil {
					return err
				}
			}
		default:
			if a.e == Completions {
				break // a completion has no message to keep them in
			}
			m, err := a.member(a.root(&c.msg), raw, flags)
			if err != nil {
				return err
			}
			if _, err := a.merge(sc, m, v, 4, mergeDelta); err != nil {
				return err
			}
		}
		i, empty, _ = sc.next(end, '}')
		empty = !empty
	}
	return nil
}

func (a *Assembler) addToolCalls(sc *scanner, c *asmChoice, v int) error {
	b := sc.b
	i, empty, _ := sc.open(v, 5)
	for pos := 0; !empty; pos++ {
		i = sc.ws(i)
		end, _ := sc.skip(i, 5)
		if b[i] == '{' {
			index := pos
			id, typ, fn := noSpan, noSpan, noSpan
			a.spans = a.spans[:0]
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
				default:
					a.spans = append(a.spans, asmSpan{key, v, end})
				}
				return end, nil
			})
			if index < 0 {
				return fmt.Errorf("openai: tool call index out of range (0 to %d)", maxChoiceIndex)
			}
			t := c.tool(index)
			if id.Start >= 0 && b[id.Start] == '"' && len(t.id) == 0 && id.End-id.Start > 2 {
				a.cat(&t.id, b[id.Start:id.End])
			}
			if typ.Start >= 0 && b[typ.Start] == '"' && len(t.typ) == 0 && typ.End-typ.Start > 2 {
				a.cat(&t.typ, b[typ.Start:typ.End])
			}
			if fn.Start >= 0 && b[fn.Start] == '{' {
				_, err := members(sc, fn.Start, 7, func(key []byte, v int) (int, error) {
					switch string(key) {
					case "name", "arguments":
						end, _ := sc.skip(v, 7)
						switch {
						case b[v] != '"':
						case string(key) == "arguments":
							a.cat(&t.args, b[v+1:end-1])
						case len(t.name) == 0 && end-v > 2:
							a.cat(&t.name, b[v:end])
						}
						return end, nil
					}
					m, err := a.member(a.root(&t.fn), key, escapes(key))
					if err != nil {
						return v, err
					}
					return a.merge(sc, m, v, 7, mergeDelta)
				})
				if err != nil {
					return err
				}
			}
			for k := range a.spans {
				sp := &a.spans[k]
				m, err := a.member(a.root(&t.ext), sp.key, escapes(sp.key))
				if err == nil {
					_, err = a.merge(sc, m, sp.v, 6, mergeDelta)
				}
				if err != nil {
					return err
				}
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

// cat appends v to *dst, counting it against Limit.
func (a *Assembler) cat(dst *[]byte, v []byte) {
	*dst = append(*dst, v...)
	a.size += len(v)
}

// set replaces *dst with v, counting the difference against Limit.
func (a *Assembler) set(dst *[]byte, v []byte) {
	a.size += len(v) - len(*dst)
	*dst = append((*dst)[:0], v...)
}

// node returns the node r refers to. The pointer is valid until the next node is added.
func (a *Assembler) node(r nref) *asmNode { return &a.nodes[r-1] }

// newNode adds a node to the arena, reusing the buffers of a node from an earlier stream.
func (a *Assembler) newNode() nref {
	if len(a.nodes) < cap(a.nodes) {
		a.nodes = a.nodes[:len(a.nodes)+1]
		n := &a.nodes[len(a.nodes)-1]
		*n = asmNode{key: n.key[:0], val: n.val[:0]}
	} else {
		a.nodes = append(a.nodes, asmNode{})
	}
	return nref(len(a.nodes))
}

// root returns the object node *r, creating it on first use.
func (a *Assembler) root(r *nref) nref {
	if *r == 0 {
		*r = a.newNode()
		a.node(*r).kind = kindObj
	}
	return *r
}

// member returns the member of object obj whose key is raw (flags as the scanner reported them), adding it
// when it is new.
func (a *Assembler) member(obj nref, raw []byte, flags uint8) (nref, error) {
	esc := flags != 0
	for m := a.node(obj).first; m != 0; {
		n := a.node(m)
		if string(n.key) == string(raw) || ((esc || n.esc) && a.sameKey(n.key, raw)) {
			return m, nil
		}
		m = n.next
	}
	if a.node(obj).members >= maxMembers {
		return 0, ErrTooLarge
	}
	m := a.newNode()
	n := a.node(m)
	n.key = append(n.key, raw...)
	n.esc = esc
	a.size += len(raw)
	o := a.node(obj)
	if o.last == 0 {
		o.first = m
	} else {
		a.node(o.last).next = m
	}
	o.last = m
	o.members++
	return m, nil
}

// sameKey reports whether two raw keys decode to the same string, as encoding/json compares them.
func (a *Assembler) sameKey(k1, k2 []byte) bool {
	a.kb1 = appendUnescaped(a.kb1[:0], k1, strEscaped|strInvalid)
	a.kb2 = appendUnescaped(a.kb2[:0], k2, strEscaped|strInvalid)
	return bytes.Equal(a.kb1, a.kb2)
}

// merge merges the value at b[v] into node m by mode and returns the index after the value. depth is the depth
// of the object holding the value.
func (a *Assembler) merge(sc *scanner, m nref, v, depth, mode int) (int, error) {
	if sc.b[v] == '{' && mode != mergeLast {
		if n := a.node(m); n.kind != kindObj {
			a.size -= len(n.val)
			*n = asmNode{key: n.key, esc: n.esc, next: n.next, val: n.val[:0], kind: kindObj}
		}
		return a.mergeMembers(sc, m, v, depth+1, mode)
	}
	end, err := sc.skip(v, depth)
	if err != nil {
		return end, err
	}
	a.mergeValue(m, sc.b[v:end], mode)
	return end, nil
}

// mergeMembers merges the members of the object at b[v], at depth, into the object node obj and returns the
// index after the object.
func (a *Assembler) mergeMembers(sc *scanner, obj nref, v, depth, mode int) (int, error) {
	b := sc.b
	i, empty, err := sc.open(v, depth)
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
		m, err := a.member(obj, raw, flags)
		if err != nil {
			return v, err
		}
		end, err := a.merge(sc, m, v, depth, mode)
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = sc.next(end, '}'); err != nil || !more {
			return i, err
		}
	}
}

// mergeValue merges the raw value val (validated; an object only in mergeLast mode) into node m.
func (a *Assembler) mergeValue(m nref, val []byte, mode int) {
	n := a.node(m)
	c := val[0]
	if c == 'n' {
		if n.kind == kindNone {
			n.kind = kindRaw
			a.set(&n.val, val)
		}
		return
	}
	kind := kindRaw
	if mode != mergeLast {
		switch c {
		case '"':
			kind = kindStr
		case '[':
			kind = kindArr
		}
	}
	if kind == kindRaw || n.kind != kind {
		n.kind, n.reps, n.first, n.last, n.members = kind, 1, 0, 0, 0
		a.set(&n.val, val)
		return
	}
	if n.reps > 0 {
		if mode == mergeDelta && string(n.val) == string(val) {
			n.reps++
			return
		}
		a.unfold(n)
	}
	if kind == kindStr {
		a.cat(&n.val, val[1:len(val)-1])
		return
	}
	if elems := bytes.TrimLeft(bytes.TrimRight(val[1:len(val)-1], " \t\r\n"), " \t\r\n"); len(elems) > 0 {
		if len(n.val) > 0 {
			a.cat(&n.val, comma)
		}
		a.cat(&n.val, elems)
	}
}

var comma = []byte{','}

// unfold turns the raw value a string or array node holds, repeated n.reps times, into its contents or
// elements, concatenated.
func (a *Assembler) unfold(n *asmNode) {
	before := len(n.val)
	inner := n.val[1 : len(n.val)-1]
	if n.kind == kindArr {
		inner = bytes.TrimLeft(bytes.TrimRight(inner, " \t\r\n"), " \t\r\n")
	}
	k := copy(n.val, inner)
	n.val = n.val[:k]
	for r := 1; r < n.reps && k > 0; r++ {
		if n.kind == kindArr {
			n.val = append(n.val, ',')
		}
		n.val = append(n.val, n.val[:k]...)
	}
	n.reps = 0
	a.size += len(n.val) - before
}

// appendValue appends the value of node m.
func (a *Assembler) appendValue(dst []byte, m nref) []byte {
	n := a.node(m)
	switch {
	case n.kind == kindObj:
		dst = append(dst, '{')
		dst = a.appendMembers(dst, m, false)
		return append(dst, '}')
	case n.kind == kindNone:
		return append(dst, "null"...)
	case n.kind == kindRaw || n.reps > 0:
		return append(dst, n.val...)
	case n.kind == kindStr:
		return appendStringOrNull(dst, n.val, true)
	default:
		dst = append(dst, '[')
		dst = append(dst, n.val...)
		return append(dst, ']')
	}
}

// appendMembers appends the members of object obj (none when obj is 0), separated by commas, with a comma
// before the first when lead.
func (a *Assembler) appendMembers(dst []byte, obj nref, lead bool) []byte {
	if obj == 0 {
		return dst
	}
	for m := a.node(obj).first; m != 0; m = a.node(m).next {
		if lead {
			dst = append(dst, ',')
		}
		lead = true
		dst = append(dst, '"')
		dst = append(dst, a.node(m).key...)
		dst = append(dst, `":`...)
		dst = a.appendValue(dst, m)
	}
	return dst
}

// AppendBody appends the non-streaming response body to dst. The members the gateway knows come first, in the
// order vLLM uses; the members it does not know follow those of their object, in the order first seen:
//
//	chat:        {"id","object":"chat.completion","created","model","choices":[{"index","message":{"role",
//	             "content","refusal"?,"tool_calls"?,"reasoning_content"?,...},"logprobs","finish_reason",
//	             "stop_reason"?,...}],"system_fingerprint","usage",...}
//	completions: {"id","object":"text_completion","created","model","choices":[{"index","text","logprobs",
//	             "finish_reason","stop_reason"?,...}],"system_fingerprint","usage",...}
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
					dst = a.appendMembers(dst, t.fn, true)
					dst = append(dst, '}')
					dst = a.appendMembers(dst, t.ext, true)
					dst = append(dst, '}')
				}
				dst = append(dst, ']')
			}
			if c.hasReason {
				dst = append(dst, `,"`...)
				dst = append(dst, c.reasonKey...)
				dst = append(dst, `":`...)
				dst = appendStringOrNull(dst, c.reasoning, true)
			}
			dst = a.appendMembers(dst, c.msg, true)
			dst = append(dst, '}')
		} else {
			dst = append(dst, `,"text":`...)
			dst = appendStringOrNull(dst, c.content, true)
		}
		dst = append(dst, `,"logprobs":`...)
		if c.logprobs != 0 {
			dst = a.appendValue(dst, c.logprobs)
		} else {
			dst = append(dst, "null"...)
		}
		dst = append(dst, `,"finish_reason":`...)
		dst = appendRawOrNull(dst, c.finish)
		if c.hasStop {
			dst = append(dst, `,"stop_reason":`...)
			dst = appendRawOrNull(dst, c.stop)
		}
		dst = a.appendMembers(dst, c.ext, true)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"system_fingerprint":`...)
	dst = appendRawOrNull(dst, a.fingerprint)
	dst = append(dst, `,"usage":`...)
	if a.hasUsage {
		dst = a.appendValue(dst, a.usage)
	} else {
		dst = append(dst, "null"...)
	}
	dst = a.appendMembers(dst, a.top, true)
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
