package openai

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// responsesStream is an OpenAI Responses stream as the hosted API writes it (vLLM writes the same events).
var responsesStream = "" +
	"event: response.created\n" +
	`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"instructions":"Be terse.","max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[],"previous_response_id":null,"temperature":1.0,"tools":[],"usage":null,"metadata":{}}}` + "\n\n" +
	"event: response.in_progress\n" +
	`data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67c9","object":"response","status":"in_progress","output":[],"usage":null}}` + "\n\n" +
	"event: response.output_item.added\n" +
	`data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67c9","type":"message","status":"in_progress","role":"assistant","content":[]}}` + "\n\n" +
	"event: response.content_part.added\n" +
	`data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_67c9","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}` + "\n\n" +
	"event: response.output_text.delta\n" +
	`data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9","output_index":0,"content_index":0,"delta":"Hi","logprobs":[]}` + "\n\n" +
	"event: response.output_text.delta\n" +
	`data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_67c9","output_index":0,"content_index":0,"delta":" there\n\u00e9","logprobs":[]}` + "\n\n" +
	"event: response.output_text.done\n" +
	`data: {"type":"response.output_text.done","sequence_number":6,"item_id":"msg_67c9","output_index":0,"content_index":0,"text":"Hi there\n\u00e9","logprobs":[]}` + "\n\n" +
	"event: response.completed\n" +
	`data: {"type":"response.completed","sequence_number":7,"response":{"id":"resp_67c9","object":"response","created_at":1741290958,"status":"completed","error":null,"incomplete_details":null,"model":"gpt-4.1-2025-04-14","output":[{"id":"msg_67c9","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there\n\u00e9","annotations":[]}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":32},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":39},"metadata":{}}}` + "\n\n"

// anthropicStream is an Anthropic Messages stream: text, a ping, a tool call, then the stop.
var anthropicStream = "" +
	"event: message_start\n" +
	`data: {"type":"message_start","message":{"id":"msg_01XF","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":2048,"output_tokens":1}}}` + "\n\n" +
	"event: content_block_start\n" +
	`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
	"event: ping\n" +
	`data: {"type": "ping"}` + "\n\n" +
	"event: content_block_delta\n" +
	`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}` + "\n\n" +
	"event: content_block_stop\n" +
	`data: {"type":"content_block_stop","index":0}` + "\n\n" +
	"event: content_block_start\n" +
	`data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}` + "\n\n" +
	"event: content_block_delta\n" +
	`data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Paris\"}"}}` + "\n\n" +
	"event: content_block_stop\n" +
	`data: {"type":"content_block_stop","index":1}` + "\n\n" +
	"event: message_delta\n" +
	`data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}}` + "\n\n" +
	"event: message_stop\n" +
	`data: {"type":"message_stop"}` + "\n\n"

func TestInspectEvent(t *testing.T) {
	completed := `{"id":"r","status":"completed","usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7,"input_tokens_details":{"cached_tokens":2}}}`
	incomplete := `{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"id":"r2","usage":{"output_tokens":9}}`
	failed := `{"id":"r3","status":"failed","error":{"code":"server_error","message":"boom"},"usage":null}`
	tests := []struct {
		name string
		e    Endpoint
		data string
		want ChunkInfo
	}{
		{"chat goes to InspectChunk", Chat, `{"choices":[{"delta":{"content":"x"}}]}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses created", Responses, `{"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}`, ChunkInfo{ID: []byte("resp_1")}},
		{"responses text delta", Responses, `{"type":"response.output_text.delta","delta":"Hi"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses type last", Responses, `{"delta":"Hi","item_id":"m","type":"response.output_text.delta"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses empty delta", Responses, `{"type":"response.output_text.delta","delta":""}`, ChunkInfo{}},
		{"responses refusal", Responses, `{"type":"response.refusal.delta","delta":"no"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses reasoning", Responses, `{"type":"response.reasoning_text.delta","delta":"hm"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses reasoning summary", Responses, `{"type":"response.reasoning_summary_text.delta","delta":"hm"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses arguments", Responses, `{"type":"response.function_call_arguments.delta","delta":"{"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses audio", Responses, `{"type":"response.audio.delta","delta":"UklG"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses transcript", Responses, `{"type":"response.audio.transcript.delta","delta":"hi"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses done is not a delta", Responses, `{"type":"response.output_text.done","text":"Hi","delta":"x"}`, ChunkInfo{}},
		{"responses escaped type", Responses, `{"type":"response.output_t\u0065xt.delta","delta":"Hi"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"responses completed", Responses, `{"type":"response.completed","response":` + completed + `,"sequence_number":9}`,
			ChunkInfo{Terminal: true, ID: []byte("r"), Body: []byte(completed), FinishReason: []byte("completed"), HasUsage: true, Usage: Usage{3, 4, 7, 2, true}}},
		{"responses incomplete", Responses, `{"response":` + incomplete + `,"type":"response.incomplete"}`,
			ChunkInfo{Terminal: true, ID: []byte("r2"), Body: []byte(incomplete), FinishReason: []byte("max_output_tokens"), HasUsage: true, Usage: Usage{CompletionTokens: 9}}},
		{"responses failed", Responses, `{"type":"response.failed","response":` + failed + `}`,
			ChunkInfo{Terminal: true, Error: true, ID: []byte("r3"), Body: []byte(failed), FinishReason: []byte("failed")}},
		{"responses error", Responses, `{"type":"error","code":"ERR_SOMETHING","message":"Something went wrong","param":null,"sequence_number":1}`, ChunkInfo{Error: true}},
		{"responses repeated response: the last counts", Responses, `{"type":"response.completed","response":` + completed + `,"response":null}`, ChunkInfo{Terminal: true}},
		{"responses ignores Anthropic members", Responses, `{"type":"message_start","message":{"id":"m","usage":{"input_tokens":1}}}`, ChunkInfo{}},
		{"responses done tolerated", Responses, `[DONE]`, ChunkInfo{Done: true}},
		{"messages start", Messages, `{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"cache_read_input_tokens":100,"cache_creation_input_tokens":5,"output_tokens":1}}}`,
			ChunkInfo{ID: []byte("msg_1"), HasUsage: true, Usage: Usage{PromptTokens: 130, CompletionTokens: 1, CachedTokens: 100, HasCached: true}}},
		{"messages start, vLLM", Messages, `{"type":"message_start","message":{"id":"chatcmpl-1","content":[],"usage":{"input_tokens":12,"output_tokens":0}}}`,
			ChunkInfo{ID: []byte("chatcmpl-1"), HasUsage: true, Usage: Usage{PromptTokens: 12}}},
		{"messages text", Messages, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`, ChunkInfo{Content: true, Tokens: 1}},
		{"messages type last", Messages, `{"delta":{"text":"Hi"},"type":"content_block_delta"}`, ChunkInfo{Content: true, Tokens: 1}},
		{"messages json", Messages, `{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{"}}`, ChunkInfo{Content: true, Tokens: 1}},
		{"messages thinking", Messages, `{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"hm"}}`, ChunkInfo{Content: true, Tokens: 1}},
		{"messages signature", Messages, `{"type":"content_block_delta","delta":{"type":"signature_delta","signature":"EqQB"}}`, ChunkInfo{}},
		{"messages empty text", Messages, `{"type":"content_block_delta","delta":{"type":"text_delta","text":""}}`, ChunkInfo{}},
		{"messages repeated text: the last counts", Messages, `{"type":"content_block_delta","delta":{"text":"a","text":""}}`, ChunkInfo{}},
		{"messages block start", Messages, `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"x"}}`, ChunkInfo{}},
		{"messages delta", Messages, `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`,
			ChunkInfo{FinishReason: []byte("end_turn"), HasUsage: true, Usage: Usage{CompletionTokens: 15}}},
		{"messages delta with input", Messages, `{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":7,"output_tokens":3}}`,
			ChunkInfo{FinishReason: []byte("max_tokens"), HasUsage: true, Usage: Usage{PromptTokens: 7, CompletionTokens: 3}}},
		{"messages stop", Messages, `{"type":"message_stop"}`, ChunkInfo{Terminal: true}},
		{"messages ping", Messages, `{"type": "ping"}`, ChunkInfo{}},
		{"messages error", Messages, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, ChunkInfo{Error: true}},
		{"messages ignores Responses members", Messages, `{"type":"response.completed","response":` + completed + `}`, ChunkInfo{}},
		{"no type", Messages, `{"delta":{"text":"x"}}`, ChunkInfo{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ci ChunkInfo
			if err := InspectEvent(tc.e, []byte(tc.data), &ci); err != nil {
				t.Fatal(err)
			}
			if !equalChunkInfo(ci, tc.want) {
				t.Errorf("got  %+v\nwant %+v", ci, tc.want)
			}
		})
	}
	for _, e := range []Endpoint{Responses, Messages} {
		for _, bad := range []string{``, `{`, `{"type":"message_stop"`, `[1]`, `"x"`, `null`, `[DONE`, `{"type":"x"}x`, `{"delta":{"text":}}`} {
			var ci ChunkInfo
			err := InspectEvent(e, []byte(bad), &ci)
			if _, ok := err.(*SyntaxError); !ok {
				t.Errorf("InspectEvent(%v, %q) = %v, want a *SyntaxError", e, bad, err)
			}
		}
	}
}

// equalChunkInfo compares two ChunkInfos, a nil slice equal to an empty one.
func equalChunkInfo(a, b ChunkInfo) bool {
	if !bytes.Equal(a.ID, b.ID) || !bytes.Equal(a.Body, b.Body) || !bytes.Equal(a.FinishReason, b.FinishReason) {
		return false
	}
	a.ID, a.Body, a.FinishReason, b.ID, b.Body, b.FinishReason = nil, nil, nil, nil, nil, nil
	return reflect.DeepEqual(a, b)
}

// TestSampleEventStreams relays the sample streams as the proxy does: the first Content marks the first token,
// usages merge, the terminal event ends the stream.
func TestSampleEventStreams(t *testing.T) {
	tests := []struct {
		e                    Endpoint
		stream               string
		id, finish           string
		tokens, events       int
		usage                Usage
		bodyHasOutputMessage bool
	}{
		{Responses, responsesStream, "resp_67c9", "completed", 2, 8, Usage{37, 2, 39, 32, true}, true},
		{Messages, anthropicStream, "msg_01XF", "tool_use", 2, 10, Usage{PromptTokens: 2083, CompletionTokens: 15, CachedTokens: 2048, HasCached: true}, false},
	}
	for _, tc := range tests {
		t.Run(tc.e.String(), func(t *testing.T) {
			er := NewEventReader(strings.NewReader(tc.stream), 0)
			var u Usage
			var id, finish string
			var body []byte
			tokens, events, terminal := 0, 0, false
			for {
				ev, err := er.Next()
				if err != nil {
					break
				}
				if terminal {
					t.Fatal("event after the terminal one")
				}
				events++
				var ci ChunkInfo
				if err := InspectEvent(tc.e, ev.Data, &ci); err != nil {
					t.Fatalf("%s: %v", ev.Data, err)
				}
				if ci.ID != nil && id == "" {
					id = string(ci.ID)
				}
				if ci.HasUsage {
					u.Merge(ci.Usage)
				}
				if ci.FinishReason != nil {
					finish = string(ci.FinishReason)
				}
				if ci.Body != nil {
					body = bytes.Clone(ci.Body)
				}
				tokens += ci.Tokens
				terminal = ci.Terminal
			}
			if !terminal || id != tc.id || finish != tc.finish || tokens != tc.tokens || events != tc.events || u != tc.usage {
				t.Errorf("terminal %v, id %q, finish %q, tokens %d, events %d, usage %+v", terminal, id, finish, tokens, events, u)
			}
			if tc.bodyHasOutputMessage {
				var resp struct {
					Status string `json:"status"`
					Output []struct {
						Content []struct{ Text string } `json:"content"`
					} `json:"output"`
				}
				if err := json.Unmarshal(body, &resp); err != nil || resp.Status != "completed" || resp.Output[0].Content[0].Text != "Hi there\né" {
					t.Errorf("body %s: %+v %v", body, resp, err)
				}
			}
		})
	}
}

func TestUsageMerge(t *testing.T) {
	tests := []struct {
		name    string
		u, v, w Usage
	}{
		{"start then delta", Usage{PromptTokens: 30, CompletionTokens: 1, CachedTokens: 20, HasCached: true}, Usage{CompletionTokens: 15},
			Usage{PromptTokens: 30, CompletionTokens: 15, CachedTokens: 20, HasCached: true}},
		{"a later zero is absent", Usage{1, 2, 3, 4, true}, Usage{}, Usage{1, 2, 3, 4, true}},
		{"cached reported as zero", Usage{PromptTokens: 5, CachedTokens: 4, HasCached: true}, Usage{HasCached: true}, Usage{PromptTokens: 5, HasCached: true}},
		{"everything replaced", Usage{1, 1, 1, 1, false}, Usage{2, 3, 5, 1, true}, Usage{2, 3, 5, 1, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.u.Merge(tc.v)
			if tc.u != tc.w {
				t.Errorf("got %+v, want %+v", tc.u, tc.w)
			}
		})
	}
}

func TestParseUpstreamErrorAnthropic(t *testing.T) {
	msg, typ := ParseUpstreamError([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`))
	if msg != "Overloaded" || typ != "overloaded_error" {
		t.Errorf("got %q, %q", msg, typ)
	}
}

var (
	benchResponsesEvent = []byte(`{"type":"response.output_text.delta","sequence_number":42,"item_id":"msg_67ccd3acc8d48190a77525dc6de64b4104becb25c0ec2a53","output_index":0,"content_index":0,"delta":" token","logprobs":[]}`)
	benchMessagesEvent  = []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" token"}}`)
)

func TestInspectEventAllocs(t *testing.T) {
	for _, tc := range []struct {
		e    Endpoint
		data string
	}{
		{Responses, string(benchResponsesEvent)},
		{Responses, streamData(responsesStream)[7]},
		{Responses, `{"response":{"incomplete_details":{"r\u0065ason":"max_output_tokens"},"id":"r","usage":{"input_tokens_details":{"cached_tokens":1}}},"t\u0079pe":"response.incomplete"}`},
		{Messages, string(benchMessagesEvent)},
		{Messages, streamData(anthropicStream)[0]},
		{Messages, `{"usage":{"output_tokens":1},"delta":{"stop_reason":"end_turn"},"type":"message_d\u0065lta"}`},
	} {
		data := []byte(tc.data)
		var ci ChunkInfo
		if n := testing.AllocsPerRun(100, func() { InspectEvent(tc.e, data, &ci) }); n != 0 {
			t.Errorf("InspectEvent(%v, %.40s...): %v allocs, want 0", tc.e, data, n)
		}
	}
}

// streamData returns the data of each event of a stream with "event:" lines.
func streamData(stream string) []string {
	var out []string
	for _, ev := range strings.Split(stream, "\n\n") {
		for _, line := range strings.Split(ev, "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				out = append(out, d)
			}
		}
	}
	return out
}

func BenchmarkInspectEvent(b *testing.B) {
	for _, tc := range []struct {
		name string
		e    Endpoint
		data []byte
	}{
		{"responses-delta", Responses, benchResponsesEvent},
		{"responses-completed", Responses, []byte(streamData(responsesStream)[7])},
		{"messages-delta", Messages, benchMessagesEvent},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var ci ChunkInfo
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.data)))
			for b.Loop() {
				if err := InspectEvent(tc.e, tc.data, &ci); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// refEvent is what InspectEvent must report for a Responses or Messages event, decoded with encoding/json.
type refEvent struct {
	Error, Terminal, Content, HasUsage bool
	Tokens                             int
	Usage                              Usage
	ID, FinishReason                   string // decoded; "" when absent
	HasID, HasBody                     bool
	Body                               any // the decoded response object
}

// inspectEventReference decodes data (a JSON object) with encoding/json and applies the rules on ChunkInfo.
func inspectEventReference(e Endpoint, data []byte) (refEvent, error) {
	var m map[string]any
	if err := decodeJSON(data, &m); err != nil {
		return refEvent{}, err
	}
	var r refEvent
	str := func(v any) (string, bool) { s, ok := v.(string); return s, ok }
	obj := func(v any) map[string]any { o, _ := v.(map[string]any); return o }
	num := func(v any) int {
		n, ok := v.(json.Number)
		if !ok || len(n) > 18 || strings.Trim(string(n), "0123456789") != "" {
			return 0
		}
		i, _ := strconv.Atoi(string(n))
		return i
	}
	typ, _ := str(m["type"])
	if e == Responses {
		resp := obj(m["response"])
		if resp != nil {
			r.ID, r.HasID = str(resp["id"])
		}
		switch typ {
		case "response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta",
			"response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
			"response.audio.delta", "response.audio.transcript.delta":
			if d, _ := str(m["delta"]); d != "" {
				r.Content, r.Tokens = true, 1
			}
		case "error":
			r.Error = true
		case "response.completed", "response.incomplete", "response.failed":
			r.Terminal, r.Error = true, typ == "response.failed"
			if resp == nil {
				break
			}
			r.HasBody, r.Body = true, resp
			r.FinishReason, _ = str(resp["status"])
			if reason, ok := str(obj(resp["incomplete_details"])["reason"]); ok {
				r.FinishReason = reason
			}
			if u := obj(resp["usage"]); u != nil {
				r.HasUsage = true
				r.Usage = Usage{PromptTokens: num(u["input_tokens"]), CompletionTokens: num(u["output_tokens"]), TotalTokens: num(u["total_tokens"])}
				if c, ok := obj(u["input_tokens_details"])["cached_tokens"]; ok && c != nil {
					r.Usage.CachedTokens, r.Usage.HasCached = num(c), true
				}
			}
		}
		return r, nil
	}
	anthropicUsage := func(u map[string]any) Usage {
		v := Usage{CompletionTokens: num(u["output_tokens"]), CachedTokens: num(u["cache_read_input_tokens"])}
		v.PromptTokens = num(u["input_tokens"]) + v.CachedTokens + num(u["cache_creation_input_tokens"])
		if c, ok := u["cache_read_input_tokens"]; ok && c != nil {
			v.HasCached = true
		}
		return v
	}
	switch typ {
	case "message_start":
		msg := obj(m["message"])
		r.ID, r.HasID = str(msg["id"])
		if u := obj(msg["usage"]); u != nil {
			r.HasUsage, r.Usage = true, anthropicUsage(u)
		}
	case "content_block_delta":
		d := obj(m["delta"])
		for _, k := range []string{"text", "partial_json", "thinking"} {
			if s, _ := str(d[k]); s != "" {
				r.Content, r.Tokens = true, 1
			}
		}
	case "message_delta":
		r.FinishReason, _ = str(obj(m["delta"])["stop_reason"])
		if u := obj(m["usage"]); u != nil {
			r.HasUsage, r.Usage = true, anthropicUsage(u)
		}
	case "message_stop":
		r.Terminal = true
	case "error":
		r.Error = true
	}
	return r, nil
}

// unquoteRaw decodes the raw bytes between a JSON string's quotes.
func unquoteRaw(raw []byte) string {
	var s string
	json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s)
	return s
}

func FuzzInspectEvent(f *testing.F) {
	for _, s := range streamData(responsesStream) {
		f.Add(uint8(Responses-1), []byte(s))
	}
	for _, s := range streamData(anthropicStream) {
		f.Add(uint8(Messages-1), []byte(s))
	}
	f.Add(uint8(Responses-1), []byte(`{"response":{"incomplete_details":{"reason":"max_output_tokens"},"status":"incomplete","usage":{"input_tokens_details":null}},"type":"response.incomplete"}`))
	f.Add(uint8(Messages-1), []byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":1,"cache_read_input_tokens":null}}`))
	f.Add(uint8(Chat-1), []byte(`{"choices":[{"delta":{"content":"x"}}]}`))
	f.Fuzz(func(t *testing.T, e uint8, data []byte) {
		ep := Endpoint(e%uint8(lastEndpoint) + 1)
		var ci ChunkInfo
		err := InspectEvent(ep, data, &ci)
		if ci.Done {
			return
		}
		var m map[string]any
		jerr := decodeJSON(data, &m)
		if jerr == nil && m == nil {
			jerr = errNotObject
		}
		if (err == nil) != (jerr == nil) {
			if err == nil || !strings.Contains(err.Error(), "nesting") {
				t.Fatalf("%v %q: InspectEvent %v, encoding/json %v", ep, data, err, jerr)
			}
		}
		if err != nil {
			if _, ok := err.(*SyntaxError); !ok {
				t.Fatalf("%q: error of type %T", data, err)
			}
			return
		}
		if ep != Responses && ep != Messages {
			return // InspectChunk, which FuzzInspectChunk checks
		}
		want, _ := inspectEventReference(ep, data)
		got := refEvent{Error: ci.Error, Terminal: ci.Terminal, Content: ci.Content, HasUsage: ci.HasUsage, Tokens: ci.Tokens,
			Usage: ci.Usage, ID: unquoteRaw(ci.ID), HasID: ci.ID != nil, FinishReason: unquoteRaw(ci.FinishReason), HasBody: ci.Body != nil}
		if ci.Body != nil {
			if err := decodeJSON(ci.Body, &got.Body); err != nil {
				t.Fatalf("%q: Body %q: %v", data, ci.Body, err)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%v %q:\n got  %+v\nwant %+v", ep, data, got, want)
		}
	})
}
