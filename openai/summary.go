package openai

import (
	"fmt"
	"strconv"
)

// MaxN is the largest "n" (choices per request) Summary.Parse accepts, OpenAI's own limit.
const MaxN = 128

// maxTokensLimit bounds max_tokens and max_completion_tokens: no model has a context this long, and the bound
// keeps token arithmetic far from overflow.
const maxTokensLimit = 1<<31 - 1

// A Span is the byte range [Start, End) of a JSON value in a request body; Start < 0 when the value is absent.
type Span struct{ Start, End int }

// noSpan is the Span of an absent value.
var noSpan = Span{-1, -1}

// A RequestError reports a request body that must be refused with 400 invalid_request_error. Summary.Parse
// returns only this error type.
type RequestError struct {
	// Param names the offending parameter as a path ("model", "messages[2].content"), or is empty when the body
	// as a whole is at fault (param null in the OpenAI error).
	Param string
	// Message is a human-readable explanation for the client.
	Message string
	// Code is the OpenAI error code: "invalid_json" for a body that is not well-formed JSON (bad syntax,
	// truncation, nesting deeper than MaxDepth, invalid UTF-8 or an unpaired surrogate escape), empty (code null)
	// for a well-formed body with a bad parameter.
	Code string
}

// Error returns "param: message", or the message alone when Param is empty.
func (e *RequestError) Error() string {
	if e.Param == "" {
		return e.Message
	}
	return e.Param + ": " + e.Message
}

// A Summary is what the gateway needs from a request body to admit, route and forward it, extracted in one pass
// without unmarshalling the body. A Summary may be reused: Parse keeps its buffers, so a Summary reused across
// requests (for example one per connection, or from a sync.Pool) parses without allocating. It is not safe for
// concurrent use.
type Summary struct {
	// Endpoint is the endpoint the body was parsed for.
	Endpoint Endpoint
	// Model is the unescaped "model" string. It aliases the body when the string has no escapes, else a buffer
	// the Summary owns; either way it is valid until the next Parse and until the body is reused.
	Model []byte
	// Stream is "stream" (false when absent or null).
	Stream bool
	// IncludeUsage is "stream_options.include_usage" (false when absent or null). Always false for Responses
	// (whose stream_options has other members and whose streams always end with usage) and Messages.
	IncludeUsage bool
	// MaxTokens is the most output tokens the engine may generate per sequence, as the client bounds them: for
	// chat, completions and embeddings the larger of "max_tokens" and "max_completion_tokens" (vLLM's chat
	// endpoint lets max_completion_tokens win, its completions endpoint reads max_tokens alone, other engines
	// read max_tokens alone: the larger is what any of them generates at most; docs/security.md); for Responses
	// "max_output_tokens"; for Messages "max_tokens" (which Anthropic requires: Parse refuses its absence). 0
	// when absent or null: the engine's own default applies.
	MaxTokens int
	// N is "n", the number of choices; 1 when absent or null, and always 1 for Responses and Messages, which have
	// no "n".
	N int
	// BestOf is "best_of" of a completions request, the number of completions generated per prompt of which
	// the best N are returned (OpenAI's legacy completions and vLLM's V0 engine honour it; V1 refuses it above
	// 1); 0 when absent or null, and for the other endpoints.
	BestOf int
	// Temperature is "temperature"; HasTemperature says whether it was present (and not null).
	Temperature    float64
	HasTemperature bool
	// Prompt is the canonical prompt (see AppendPrompt), in a buffer the Summary owns and reuses across Parse
	// calls: copy it to keep it past the next Parse.
	Prompt []byte
	// PromptTokens is EstimateTokens(len(Prompt)), or the number of token IDs when the prompt is token IDs.
	PromptTokens int
	// Prompts is how many prompts a completions or embeddings request carries (a list of strings or of token-ID
	// lists is a batch; Prompt and PromptTokens describe the first one); 1 for the other endpoints.
	Prompts int
	// PrevTurn is the length of Prompt before the conversation's last answer, the model output the client sends
	// back as history: the last message whose role is "assistant" (chat and Messages), or for Responses the first
	// of the last run of consecutive model-output items (messages whose role is "assistant", and items of the
	// types the API outputs: function_call, custom_tool_call, reasoning, the built-in tools' calls such as
	// web_search_call or mcp_call). A trailing answer counts too (a prefill cannot be told from one). When the
	// client resent its history unchanged, Prompt[:PrevTurn] is the canonical prompt of the request that produced
	// that answer: routing uses it to recognise the previous turn of a conversation. 0 when no answer has a
	// message or item before it (none at all, or only one that opens the conversation, whatever tools or system
	// prefix precedes it), for a string "input", and for completions and embeddings.
	PrevTurn int
	// PreviousResponseID is the unescaped "previous_response_id" of a Responses request, the response whose
	// conversation this one continues (nil when absent or null, and for the other endpoints). Like Model it
	// aliases the body when the string has no escapes, else a buffer the Summary owns; either way it is valid
	// until the next Parse and until the body is reused.
	PreviousResponseID []byte
	// Background is "background" of a Responses request (false when absent or null): the upstream answers at
	// once with a queued response and generates it asynchronously.
	Background bool
	// ModelSpan, StreamSpan and StreamOptionsSpan are the positions in the body of the values of "model",
	// "stream" and "stream_options" (the last occurrence of each, which is the one that counts), for
	// AppendUpstreamBody. IncludeUsageSpan is the value of "include_usage" inside stream_options (never set for
	// Responses, whose stream_options is recorded but not read, nor for Messages, which has no stream_options).
	ModelSpan, StreamSpan, StreamOptionsSpan, IncludeUsageSpan Span
	// PrioritySpan is the position of the top-level "priority" value (noSpan when absent): the engine
	// scheduling field AppendPriority replaces.
	PrioritySpan Span

	modelBuf, prevIDBuf []byte
}

// Parse fills s from body, a request for endpoint e. The whole body's JSON syntax is validated in the same pass,
// so a body that Parse accepts is well formed (and valid UTF-8) everywhere, not just in the members it reads.
//
// Keys are matched exactly (case-sensitively), after decoding their escapes. The members the gateway acts on
// (model, stream, stream_options and its include_usage, max_tokens, max_completion_tokens, max_output_tokens, n,
// best_of, user, priority, previous_response_id, background) must be unambiguous, for every endpoint: a second
// occurrence of one at the top level (in stream_options for include_usage), or a key equal to one under the
// Unicode case folding encoding/json matches names with ("MODEL", "Model", "M\u004fDEL", "ſtream"), is refused
// with a *RequestError naming it. The decoders upstream disagree on such a body (Python's json reads keys exactly
// and keeps the last; Go's encoding/json, and Ollama with it, matches names case-insensitively), so the value the
// gateway checked need not be the one the engine serves (docs/security.md). Every decoder reads a body Parse
// accepts alike. Other repeated keys keep those decoders' rule: the last one wins.
//
// Required: "model" everywhere; "messages" for chat and Messages, "prompt" for completions, "input" for
// embeddings and Responses; "max_tokens" for Messages. Members of another endpoint's API are not read.
//
// On error s holds no meaningful values and the error is a *RequestError. Parse keeps s's buffers: call it again
// with the same s on the next request and it does not allocate in steady state. s.Model may alias body.
func (s *Summary) Parse(e Endpoint, body []byte) error {
	*s = Summary{
		Endpoint:          e,
		N:                 1,
		Prompts:           1,
		Prompt:            s.Prompt[:0],
		modelBuf:          s.modelBuf[:0],
		prevIDBuf:         s.prevIDBuf[:0],
		ModelSpan:         noSpan,
		StreamSpan:        noSpan,
		StreamOptionsSpan: noSpan,
		IncludeUsageSpan:  noSpan,
		PrioritySpan:      noSpan,
	}
	if e < Chat || e > lastEndpoint {
		return &RequestError{Message: fmt.Sprintf("unsupported endpoint %v", e)}
	}
	p := parser{
		scanner: scanner{b: body, strict: true, maxDepth: MaxDepth},
		e:       e,
		s:       s,
		out:     s.Prompt[:0],
	}
	err := p.run()
	s.Prompt = p.out
	if err != nil {
		if se, ok := err.(*SyntaxError); ok {
			return &RequestError{Message: "We could not parse the JSON body of your request: " + se.Error(), Code: "invalid_json"}
		}
		return err
	}
	if p.answerTail > 0 {
		s.PrevTurn = len(s.Prompt) - p.answerTail
	}
	if p.tokenIDs >= 0 {
		s.PromptTokens = p.tokenIDs
	} else {
		s.PromptTokens = EstimateTokens(len(s.Prompt))
	}
	return nil
}

// Sequences returns how many sequences the engine generates for the request, each of up to MaxTokens tokens:
// for chat N; for completions N, or BestOf when larger, for each prompt of the batch (Prompts); 1 for the other
// endpoints (Responses and Messages have one output; embeddings generate none, and keep the reservation of one)
// and for a Summary the gateway filled itself for a pass-through route (Endpoint 0).
func (s *Summary) Sequences() int {
	switch s.Endpoint {
	case Chat:
		return s.N
	case Completions:
		return max(s.N, s.BestOf) * s.Prompts
	}
	return 1
}

// parser walks a request body once, building the canonical prompt in out and, when s is set (strict mode, for
// Summary.Parse), validating and recording the parameters the gateway needs. Without s (AppendPrompt) it
// mirrors AppendPromptReference: it accepts whatever encoding/json would decode, and reads only the prompt.
type parser struct {
	scanner
	e   Endpoint
	s   *Summary // nil when only the prompt is wanted
	out []byte

	promptStart int   // where the prompt begins in out
	toolsLen    int   // length of the "tools:...\n" prefix at out[promptStart:]
	toolsSpan   Span  // the last "tools" value
	prefixSpan  Span  // Responses "instructions", Messages "system": the last non-null value
	listErr     error // the fault of the last Responses "input" or Messages "messages", if any
	prefixErr   error // the fault of the last "instructions" or "system", if any
	sawMessages bool  // a "messages" member was read
	sawPrompt   bool  // the endpoint's prompt member was read ("messages", "prompt" or "input")
	listStart   int   // where the conversation of the last "messages" or "input" list begins in out
	answer      int   // where its last answer so far begins in out (see Summary.PrevTurn); -1 for none
	inAnswer    bool  // the last item written is model output: a run of them is open (Responses)
	answerTail  int   // len(out) - answer at the end of the list, kept as a prefix goes in front; 0 for none
	tokenIDs    int   // number of token IDs in a token-ID prompt, -1 otherwise
	semErr      error

	maxTokens, maxCompletionTokens int
	hasMaxTokens                   bool
	fields                         fieldSet // the fields met at the top level
	keyBuf                         [maxKeyLen]byte
}

// fail records the first error about a well-formed body's meaning; scanning goes on, so that a syntax error
// anywhere in the body is reported in preference (and the body is validated in full either way).
func (p *parser) fail(param, format string, args ...any) {
	if p.semErr == nil {
		p.semErr = &RequestError{Param: param, Message: fmt.Sprintf(format, args...)}
	}
}

func (p *parser) run() error {
	p.promptStart = len(p.out)
	p.toolsSpan = noSpan
	p.prefixSpan = noSpan
	p.tokenIDs = -1
	b := p.b
	i := p.ws(0)
	if i >= len(b) {
		return &SyntaxError{Offset: 0, Msg: "empty body"}
	}
	if b[i] != '{' {
		end, err := p.skip(i, 0)
		if err == nil {
			err = p.end(end)
		}
		if err != nil {
			return err
		}
		if p.s == nil && b[i] == 'n' {
			return nil // encoding/json decodes null into a struct or map as nothing at all
		}
		return &RequestError{Message: "the request body must be a JSON object"}
	}
	i, err := p.object(i)
	if err != nil {
		return err
	}
	if err := p.end(i); err != nil {
		return err
	}
	if p.e >= Responses {
		p.writePrefix()
	} else if p.toolsSpan.Start >= 0 && p.toolsLen == 0 {
		// "tools" came after "messages": the prefix goes in front of what is there.
		p.out = insert(p.out, p.promptStart, "tools:", b[p.toolsSpan.Start:p.toolsSpan.End], "\n")
	}
	// Faults of repeated members are known only now that the last occurrence, the one that counts, is read.
	for _, err := range [2]error{p.listErr, p.prefixErr} {
		if p.semErr == nil {
			p.semErr = err
		}
	}
	if p.s != nil {
		p.checkRequired()
		switch p.e {
		case Responses:
			p.s.MaxTokens = p.maxCompletionTokens // max_output_tokens
		case Messages:
			p.s.MaxTokens = p.maxTokens
		default:
			p.s.MaxTokens = max(p.maxTokens, p.maxCompletionTokens)
		}
	}
	return p.semErr
}

func (p *parser) checkRequired() {
	s := p.s
	if s.ModelSpan.Start < 0 {
		p.fail("model", "you must provide a model parameter")
	}
	if !p.sawPrompt {
		switch p.e {
		case Chat:
			p.fail("messages", "you must provide a messages parameter")
		case Completions:
			p.fail("prompt", "you must provide a prompt parameter")
		case Embeddings, Responses:
			p.fail("input", "you must provide an input parameter")
		case Messages:
			p.fail("messages", "you must provide a messages parameter")
		}
	}
	if p.e == Messages && !p.hasMaxTokens {
		p.fail("max_tokens", "you must provide a max_tokens parameter")
	}
}

// insert inserts a+b+c into dst at i.
func insert(dst []byte, i int, a string, b []byte, c string) []byte {
	n := len(a) + len(b) + len(c)
	old := len(dst)
	dst = append(dst, make([]byte, n)...) // the compiler turns append(make) into a grow without allocating
	copy(dst[i+n:], dst[i:old])
	k := i + copy(dst[i:], a)
	k += copy(dst[k:], b)
	copy(dst[k:], c)
	return dst
}

// object walks the top-level object at b[i].
func (p *parser) object(i int) (int, error) {
	b := p.b
	i, empty, err := p.open(i, 1)
	if err != nil || empty {
		return i, err
	}
	for {
		raw, flags, v, err := p.key(i)
		if err != nil {
			return v, err
		}
		v = p.ws(v)
		if v >= len(b) {
			return v, p.errAt(v, "")
		}
		key := keyName(raw, flags, &p.keyBuf)
		if p.s != nil {
			if f, msg := p.fields.add(key, false); msg != "" {
				p.fail(fieldNames[f], "%s", msg)
			}
		}
		var end int
		switch {
		case p.e == Chat && string(key) == "messages":
			end, err = p.messages(v)
		case p.e == Chat && string(key) == "tools":
			end, err = p.tools(v)
		case p.e == Completions && string(key) == "prompt":
			end, err = p.promptValue(v, "prompt")
		case p.e == Embeddings && string(key) == "input":
			end, err = p.promptValue(v, "input")
		case p.e >= Responses && string(key) == listName(p.e):
			end, err = p.items(v)
		case p.e >= Responses && string(key) == prefixName(p.e):
			end, err = p.prefixText(v)
		case p.e >= Responses && string(key) == "tools":
			end, err = p.prefixTools(v)
		case p.s != nil:
			end, err = p.param(key, v)
		default:
			end, err = p.skip(v, 1)
		}
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = p.next(end, '}'); err != nil || !more {
			return i, err
		}
	}
}

// param reads a top-level member that Summary reports (strict mode only) and skips any other.
func (p *parser) param(key []byte, v int) (int, error) {
	b, s := p.b, p.s
	end, err := p.skip(v, 1)
	if err != nil {
		return end, err
	}
	val := b[v:end]
	null := b[v] == 'n'
	switch string(key) {
	case "model":
		s.ModelSpan = Span{v, end}
		switch {
		case null:
			s.ModelSpan = noSpan
		case b[v] != '"':
			p.fail("model", "model must be a string")
		case end-v == 2:
			p.fail("model", "model must not be empty")
		default:
			_, flags, _ := p.str(v)
			if flags == 0 {
				s.Model = val[1 : len(val)-1]
			} else {
				s.modelBuf = appendUnescaped(s.modelBuf[:0], val[1:len(val)-1], flags)
				s.Model = s.modelBuf
			}
		}
	case "stream":
		s.StreamSpan = Span{v, end}
		s.Stream = b[v] == 't'
		if b[v] != 't' && b[v] != 'f' && !null {
			p.fail("stream", "stream must be a boolean")
		}
	case "stream_options":
		// Only chat, completions and embeddings read include_usage; every endpoint refuses an ambiguous one, which
		// a Go engine and a Python engine would read differently (Parse).
		if p.e == Messages {
			if b[v] == '{' {
				p.streamOptions(v, false)
			}
			break
		}
		s.StreamOptionsSpan = Span{v, end}
		s.IncludeUsage = false
		s.IncludeUsageSpan = noSpan
		switch {
		case b[v] == '{':
			p.streamOptions(v, p.e != Responses)
		case !null:
			p.fail("stream_options", "stream_options must be an object")
		}
	case "max_tokens", "max_completion_tokens", "max_output_tokens":
		// Each endpoint reads its own names: max_tokens and max_completion_tokens (run takes the larger) for chat,
		// completions and embeddings; max_tokens for Messages; max_output_tokens for Responses.
		var name string
		switch {
		case string(key) == "max_tokens":
			name = "max_tokens"
			if p.e == Responses {
				return end, nil
			}
		case string(key) == "max_completion_tokens":
			name = "max_completion_tokens"
			if p.e >= Responses {
				return end, nil
			}
		default:
			name = "max_output_tokens"
			if p.e != Responses {
				return end, nil
			}
		}
		n, ok := parseInt(val, maxTokensLimit)
		if !ok && !null {
			p.fail(name, "%s must be a non-negative integer no larger than %d", name, maxTokensLimit)
		}
		if name == "max_tokens" {
			p.maxTokens, p.hasMaxTokens = n, !null
		} else {
			p.maxCompletionTokens = n
		}
	case "previous_response_id":
		if p.e != Responses {
			break
		}
		s.PreviousResponseID = nil
		switch {
		case null:
		case b[v] != '"':
			p.fail("previous_response_id", "previous_response_id must be a string")
		default:
			_, flags, _ := p.str(v)
			if flags == 0 {
				s.PreviousResponseID = val[1 : len(val)-1]
			} else {
				s.prevIDBuf = appendUnescaped(s.prevIDBuf[:0], val[1:len(val)-1], flags)
				s.PreviousResponseID = s.prevIDBuf
			}
		}
	case "priority":
		s.PrioritySpan = Span{v, end}
	case "background":
		if p.e != Responses {
			break
		}
		s.Background = b[v] == 't'
		if b[v] != 't' && b[v] != 'f' && !null {
			p.fail("background", "background must be a boolean")
		}
	case "n":
		if p.e >= Responses {
			break
		}
		if null {
			s.N = 1
			break
		}
		n, ok := parseInt(val, MaxN)
		if !ok || n < 1 {
			p.fail("n", "n must be an integer from 1 to %d", MaxN)
		}
		s.N = n
	case "best_of":
		if p.e != Completions || null {
			break
		}
		n, ok := parseInt(val, MaxN)
		if !ok || n < 1 {
			p.fail("best_of", "best_of must be an integer from 1 to %d", MaxN)
		}
		s.BestOf = n
	case "temperature":
		s.HasTemperature = !null
		s.Temperature = 0
		if null {
			break
		}
		if b[v] != '-' && (b[v] < '0' || b[v] > '9') {
			p.fail("temperature", "temperature must be a number")
			break
		}
		t, err := strconv.ParseFloat(string(val), 64)
		if err != nil {
			p.fail("temperature", "temperature is out of range")
		}
		s.Temperature = t
	}
	return end, nil
}

// streamOptions checks the stream_options object at b[v], already validated, for an ambiguous include_usage, and
// with read reads it.
func (p *parser) streamOptions(v int, read bool) {
	b, s := p.b, p.s
	sc := scanner{b: b, maxDepth: MaxDepth}
	i, empty, _ := sc.open(v, 2)
	if empty {
		return
	}
	var fields fieldSet
	for {
		raw, flags, j, _ := sc.key(i)
		j = sc.ws(j)
		end, _ := sc.skip(j, 2)
		key := keyName(raw, flags, &p.keyBuf)
		if _, msg := fields.add(key, true); msg != "" {
			p.fail("stream_options.include_usage", "%s", msg)
		}
		if read && string(key) == "include_usage" {
			s.IncludeUsageSpan = Span{j, end}
			s.IncludeUsage = b[j] == 't'
			if b[j] != 't' && b[j] != 'f' && b[j] != 'n' {
				p.fail("stream_options.include_usage", "stream_options.include_usage must be a boolean")
			}
		}
		var more bool
		if i, more, _ = sc.next(end, '}'); !more {
			return
		}
	}
}

// tools records the "tools" value at b[v]; the last one wins.
func (p *parser) tools(v int) (int, error) {
	end, err := p.skip(v, 1)
	if err != nil {
		return end, err
	}
	b := p.b
	if p.s != nil && b[v] != '[' && b[v] != 'n' {
		p.fail("tools", "tools must be an array")
	}
	if b[v] == 'n' {
		p.toolsSpan = noSpan
	} else {
		p.toolsSpan = Span{v, end}
	}
	// Drop the prefix written for an earlier "tools"; write this one now if no message follows it yet.
	if !p.sawMessages {
		p.out = p.out[:p.promptStart]
		p.toolsLen = 0
		if p.toolsSpan.Start >= 0 {
			p.out = append(p.out, "tools:"...)
			p.out = append(p.out, b[v:end]...)
			p.out = append(p.out, '\n')
			p.toolsLen = len(p.out) - p.promptStart
		}
		return end, nil
	}
	// Messages are already in out: remove the old prefix; run inserts the final one in front of them.
	if p.toolsLen > 0 {
		n := copy(p.out[p.promptStart:], p.out[p.promptStart+p.toolsLen:])
		p.out = p.out[:p.promptStart+n]
		p.toolsLen = 0
	}
	return end, nil
}
