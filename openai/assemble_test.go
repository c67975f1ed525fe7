package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

func assemble(t *testing.T, a *Assembler, e Endpoint, chunks ...string) string {
	t.Helper()
	a.Reset(e)
	for _, c := range chunks {
		if err := a.Add([]byte(c)); err != nil {
			t.Fatalf("Add(%s): %v", c, err)
		}
	}
	body := a.AppendBody(nil)
	if !json.Valid(body) {
		t.Fatalf("invalid JSON: %s", body)
	}
	return string(body)
}

func TestAssemblerChat(t *testing.T) {
	var a Assembler
	got := assemble(t, &a, Chat,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":{"content":[{"token":"Hel","logprob":-0.1,"bytes":[72,101,108],"top_logprobs":[]}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"lo \"w\"\n\ud83d"},"logprobs":{"content":[{"token":"lo","logprob":-0.2,"bytes":null,"top_logprobs":[]}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"\ude00"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":9,"completion_tokens":4}}`,
		`[DONE]`,
	)
	want := `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"Hello \"w\"\n\ud83d\ude00"},` +
		`"logprobs":{"content":[{"token":"Hel","logprob":-0.1,"bytes":[72,101,108],"top_logprobs":[]},{"token":"lo","logprob":-0.2,"bytes":null,"top_logprobs":[]}]},` +
		`"finish_reason":"stop","stop_reason":null}],"system_fingerprint":null,"usage":{"prompt_tokens":5,"total_tokens":9,"completion_tokens":4}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if u, ok := a.Usage(); !ok || u != (Usage{PromptTokens: 5, CompletionTokens: 4, TotalTokens: 9}) {
		t.Errorf("Usage() = %+v, %v", u, ok)
	}
	var resp struct {
		Choices []struct{ Message struct{ Content string } }
	}
	json.Unmarshal([]byte(got), &resp)
	if resp.Choices[0].Message.Content != "Hello \"w\"\n\U0001F600" {
		t.Errorf("decoded content %q", resp.Choices[0].Message.Content)
	}
}

func TestAssemblerChoicesAndTools(t *testing.T) {
	var a Assembler
	got := assemble(t, &a, Chat,
		`{"id":"c","created":1,"model":"m","system_fingerprint":"fp","choices":[{"index":1,"delta":{"role":"assistant","content":"B"}},{"index":0,"delta":{"role":"assistant","content":"A"}}]}`,
		`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"think"}}]}`,
		`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"g","arguments":""}}]}}]}`,
		`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]}}]}`,
		`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}},{"index":1,"function":{"arguments":"{}"}}]}}]}`,
		`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"},{"index":1,"delta":{"refusal":"no"},"finish_reason":"stop"}]}`,
	)
	want := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[` +
		`{"index":0,"message":{"role":"assistant","content":"A","tool_calls":[` +
		`{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},` +
		`{"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}],"reasoning_content":"think"},"logprobs":null,"finish_reason":"tool_calls"},` +
		`{"index":1,"message":{"role":"assistant","content":"B","refusal":"no"},"logprobs":null,"finish_reason":"stop"}],` +
		`"system_fingerprint":"fp","usage":null}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if _, ok := a.Usage(); ok {
		t.Error("Usage reported without a usage chunk")
	}
	// Reset forgets everything.
	got = assemble(t, &a, Chat, `{"id":"d","choices":[{"index":0,"delta":{"reasoning":"r"}}]}`)
	want = `{"id":"d","object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning":"r"},"logprobs":null,"finish_reason":null}],"system_fingerprint":null,"usage":null}`
	if got != want {
		t.Errorf("after Reset:\n got  %s\nwant %s", got, want)
	}
}

func TestAssemblerCompletions(t *testing.T) {
	var a Assembler
	got := assemble(t, &a, Completions,
		`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[{"index":0,"text":"Once","logprobs":{"text_offset":[0],"token_logprobs":[-1.5],"tokens":["Once"],"top_logprobs":[{"Once":-1.5}]},"finish_reason":null}]}`,
		`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[{"index":0,"text":" upon","logprobs":{"text_offset":[4],"token_logprobs":[-0.5],"tokens":[" upon"],"top_logprobs":[{" upon":-0.5}]},"finish_reason":"length","stop_reason":null}]}`,
		`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":1,"total_tokens":3,"completion_tokens":2}}`,
	)
	want := `{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[{"index":0,"text":"Once upon",` +
		`"logprobs":{"text_offset":[0,4],"token_logprobs":[-1.5,-0.5],"tokens":["Once"," upon"],"top_logprobs":[{"Once":-1.5},{" upon":-0.5}]},` +
		`"finish_reason":"length","stop_reason":null}],"system_fingerprint":null,"usage":{"prompt_tokens":1,"total_tokens":3,"completion_tokens":2}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestAssemblerErrors(t *testing.T) {
	var a Assembler
	a.Reset(Chat)
	err := a.Add([]byte(`{"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}`))
	var se *StreamError
	if !errors.As(err, &se) || se.Message != "engine died" || se.Type != "InternalServerError" {
		t.Errorf("error chunk: %v", err)
	}
	for _, bad := range []string{`{`, `[1]`, `{"choices":[{"index":100000,"delta":{}}]}`, `{"choices":[{"index":-1}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":99999}]}}]}`} {
		if err := a.Add([]byte(bad)); err == nil {
			t.Errorf("Add(%s) accepted", bad)
		}
	}
}

func TestAssemblerAllocs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
	}{
		{"known members", []string{
			`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
			`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token "}}]}`,
			`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]}}]}`,
			`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
		}},
		{"unknown members", []string{
			`{"id":"c","model":"m","service_tier":"default","x\u005fext":[1],"choices":[{"index":0,"delta":{"role":"assistant","audio":{"id":"a","transcript":"He"}},"token_ids":[1]}]}`,
			`{"id":"c","model":"m","service_tier":"default","choices":[{"index":0,"delta":{"content":"x","audio":{"id":"a","transcript":"llo","data":"AA"}},"logprobs":{"content":[{"token":"x"}],"refusal":null},"token_ids":[2]}]}`,
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"annotations":[{"type":"url_citation"}],"tool_calls":[{"index":0,"id":"t","x_call":[1],"function":{"name":"f","arguments":"{}","x_fn":true}}]},"finish_reason":"stop","stop_reason":null}],"kv_transfer_params":{"a":1}}`,
			`{"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunks := make([][]byte, len(tc.chunks))
			for i, c := range tc.chunks {
				chunks[i] = []byte(c)
			}
			var a Assembler
			dst := make([]byte, 0, 4096)
			run := func() {
				a.Reset(Chat)
				for _, c := range chunks {
					if err := a.Add(c); err != nil {
						t.Fatal(err)
					}
				}
				a.AppendBody(dst)
				a.Usage()
			}
			run()
			if n := testing.AllocsPerRun(50, run); n != 0 {
				t.Errorf("a reused Assembler: %v allocs per stream, want 0", n)
			}
		})
	}
}

func FuzzAssembler(f *testing.F) {
	f.Add(uint8(Chat-1), []byte(`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"logprobs":{"content":[{"token":"a"}]}}]}`),
		[]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","function":{"name":"f","arguments":"{"}}]},"finish_reason":"stop"}],"usage":{"total_tokens":1}}`))
	f.Add(uint8(Completions-1), []byte(`{"choices":[{"index":1,"text":"a\u00e9"}]}`), []byte(`{"choices":[{"index":0,"text":"b","logprobs":{"tokens":["b"]}}]}`))
	f.Fuzz(func(t *testing.T, e uint8, c1, c2 []byte) {
		var a Assembler
		a.Reset(Endpoint(e%2 + 1))
		for _, c := range [][]byte{c1, c2, c1} {
			a.Add(c)
		}
		body := a.AppendBody(nil)
		if !json.Valid(body) {
			t.Fatalf("invalid JSON %s from %q, %q", body, c1, c2)
		}
	})
}

// rawAt returns the raw value at path in body (object keys, or array indexes in decimal), as encoding/json
// reads it.
func rawAt(t *testing.T, body []byte, path ...string) []byte {
	t.Helper()
	raw := json.RawMessage(body)
	for k, p := range path {
		var next json.RawMessage
		if n, err := strconv.Atoi(p); err == nil {
			var arr []json.RawMessage
			if err := json.Unmarshal(raw, &arr); err != nil || n >= len(arr) {
				t.Fatalf("%s: no element %d in %s", strings.Join(path[:k], "."), n, raw)
			}
			next = arr[n]
		} else {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil {
				t.Fatalf("%s: not an object: %s", strings.Join(path[:k], "."), raw)
			}
			var ok bool
			if next, ok = obj[p]; !ok {
				t.Fatalf("%s: no member %q in %s", strings.Join(path[:k], "."), p, raw)
			}
		}
		raw = next
	}
	return raw
}

// Values of members the gateway does not know, each as an engine sent it (spacing, escapes and number forms
// included), for TestAssemblerKeepsUnknownMembers.
const (
	vServiceTier = `"default"`
	vXTop        = `{ "a" : [1, 2.50, "\u00e9", {"b":null}] }`
	vKVTransfer  = `{"do_remote_decode":false,"remote_engine_id":"e-1","remote_block_ids":[[3,4],[5]]}`
	vPromptLP    = `[null,{"15043":{"logprob":-1.2e-3,"rank":1,"decoded_token":"Hello"}}]`
	vPromptIDs   = `[1, 15043,29892]`
	vTokenIDs0   = `[3186,  29991]`
	vTokenIDs1   = `[13]`
	vXChoice     = `"c\"1"`
	vXMsg        = `{"k":"v\u00e9","n":1.50,"deep":{"arr":[ 1,2 ],"t":true}}`
	vAnnotations = `[{"type":"url_citation","url_citation":{"start_index":0,"end_index":4,"url":"https://example.com","title":"T\"q"}}]`
	vXLogprobs   = `{"v":-0.0,"s":"\ud83d\ude00"}`
	vPTDetails   = `{"cached_tokens":0,"audio_tokens":null}`
	vCTDetails   = `{"reasoning_tokens":7,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}`
	vXUsage      = `1E+2`
)

func TestAssemblerKeepsUnknownMembers(t *testing.T) {
	type want struct {
		path []string
		raw  string
	}
	for _, tc := range []struct {
		name   string
		e      Endpoint
		chunks []string
		want   []want
	}{
		{
			name: "chat n=2",
			e:    Chat,
			chunks: []string{
				`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","service_tier":` + vServiceTier + `,"x_top":` + vXTop + `,"choices":[` +
					`{"index":0,"delta":{"role":"assistant","content":"","x_msg":` + vXMsg + `},"logprobs":null,"finish_reason":null},` +
					`{"index":1,"delta":{"role":"assistant","content":""},"x_choice":` + vXChoice + `}]}`,
				`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","service_tier":` + vServiceTier + `,"choices":[` +
					`{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.1,"bytes":[72,105],"top_logprobs":[]}],"x_lp":` + vXLogprobs + `}},` +
					`{"index":1,"delta":{"content":"Yo","annotations":` + vAnnotations + `}}]}`,
				`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[` +
					`{"index":0,"delta":{},"finish_reason":"stop","token_ids":` + vTokenIDs0 + `},` +
					`{"index":1,"delta":{},"finish_reason":"stop","token_ids":` + vTokenIDs1 + `}],` +
					`"kv_transfer_params":` + vKVTransfer + `,"prompt_logprobs":` + vPromptLP + `,"prompt_token_ids":` + vPromptIDs + `}`,
				`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,` +
					`"prompt_tokens_details":` + vPTDetails + `,"completion_tokens_details":` + vCTDetails + `,"x_usage":` + vXUsage + `}}`,
				`[DONE]`,
			},
			want: []want{
				{[]string{"service_tier"}, vServiceTier},
				{[]string{"x_top"}, vXTop},
				{[]string{"kv_transfer_params"}, vKVTransfer},
				{[]string{"prompt_logprobs"}, vPromptLP},
				{[]string{"prompt_token_ids"}, vPromptIDs},
				{[]string{"choices", "0", "token_ids"}, vTokenIDs0},
				{[]string{"choices", "1", "token_ids"}, vTokenIDs1},
				{[]string{"choices", "1", "x_choice"}, vXChoice},
				{[]string{"choices", "0", "message", "x_msg"}, vXMsg},
				{[]string{"choices", "0", "message", "x_msg", "deep", "arr"}, `[ 1,2 ]`},
				{[]string{"choices", "1", "message", "annotations"}, vAnnotations},
				{[]string{"choices", "0", "logprobs", "x_lp"}, vXLogprobs},
				{[]string{"usage", "prompt_tokens_details"}, vPTDetails},
				{[]string{"usage", "completion_tokens_details"}, vCTDetails},
				{[]string{"usage", "x_usage"}, vXUsage},
				{[]string{"choices", "0", "message", "content"}, `"Hi"`},
				{[]string{"choices", "1", "message", "content"}, `"Yo"`},
			},
		},
		{
			name: "completions n=2",
			e:    Completions,
			chunks: []string{
				`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","service_tier":` + vServiceTier + `,"x_top":` + vXTop + `,"choices":[` +
					`{"index":0,"text":"Once","logprobs":{"tokens":["Once"],"token_logprobs":[-1.5],"x_lp":` + vXLogprobs + `},"finish_reason":null},` +
					`{"index":1,"text":"Twice","x_choice":` + vXChoice + `}]}`,
				`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[` +
					`{"index":1,"text":"!","finish_reason":"length","token_ids":` + vTokenIDs1 + `},` +
					`{"index":0,"text":" upon","logprobs":{"tokens":[" upon"],"token_logprobs":[-0.5]},"finish_reason":"length","token_ids":` + vTokenIDs0 + `}],` +
					`"kv_transfer_params":` + vKVTransfer + `,"prompt_logprobs":` + vPromptLP + `,"prompt_token_ids":` + vPromptIDs + `}`,
				`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,` +
					`"prompt_tokens_details":` + vPTDetails + `,"completion_tokens_details":` + vCTDetails + `,"x_usage":` + vXUsage + `}}`,
			},
			want: []want{
				{[]string{"service_tier"}, vServiceTier},
				{[]string{"x_top"}, vXTop},
				{[]string{"kv_transfer_params"}, vKVTransfer},
				{[]string{"prompt_logprobs"}, vPromptLP},
				{[]string{"prompt_token_ids"}, vPromptIDs},
				{[]string{"choices", "0", "token_ids"}, vTokenIDs0},
				{[]string{"choices", "1", "token_ids"}, vTokenIDs1},
				{[]string{"choices", "1", "x_choice"}, vXChoice},
				{[]string{"choices", "0", "logprobs", "x_lp"}, vXLogprobs},
				{[]string{"choices", "0", "logprobs", "tokens"}, `["Once"," upon"]`},
				{[]string{"usage", "prompt_tokens_details"}, vPTDetails},
				{[]string{"usage", "completion_tokens_details"}, vCTDetails},
				{[]string{"usage", "x_usage"}, vXUsage},
				{[]string{"choices", "0", "text"}, `"Once upon"`},
				{[]string{"choices", "1", "text"}, `"Twice!"`},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a Assembler
			body := []byte(assemble(t, &a, tc.e, tc.chunks...))
			for _, w := range tc.want {
				if got := rawAt(t, body, w.path...); string(got) != w.raw {
					t.Errorf("%s = %s, want the bytes sent, %s", strings.Join(w.path, "."), got, w.raw)
				}
			}
			if u, ok := a.Usage(); !ok || u != (Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7, HasCached: true}) {
				t.Errorf("Usage() = %+v, %v", u, ok)
			}
		})
	}
}

func TestAssemblerMergeRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		want   string
	}{
		{
			name: "top level: last non-null wins, first-seen order after the known members",
			chunks: []string{
				`{"id":"a","service_tier":"default","x":1,"system_fingerprint":"fp_1","choices":[]}`,
				`{"id":"b","service_tier":null,"y":null,"x":2,"model":"m2"}`,
				`{"id":"c","service_tier":"flex","system_fingerprint":null}`,
			},
			want: `{"id":"c","object":"chat.completion","created":null,"model":"m2","choices":[],"system_fingerprint":"fp_1","usage":null,"service_tier":"flex","x":2,"y":null}`,
		},
		{
			name: "keys are matched decoded and written as first seen",
			chunks: []string{
				`{"x\u005fext":"a","i\u0064":"id-1","choices":[{"index":0,"delta":{"c\u006fntent":"A","n\u00e9":"1"},"t\u006fken_ids":[1]}]}`,
				`{"x_ext":"b","choices":[{"index":0,"delta":{"né":"2"},"token_ids":[2]}]}`,
			},
			want: `{"id":"id-1","object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":"A","n\u00e9":"12"},"logprobs":null,"finish_reason":null,"t\u006fken_ids":[2]}],"system_fingerprint":null,"usage":null,"x\u005fext":"b"}`,
		},
		{
			name: "delta: streamed audio assembles as message.audio",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"role":"assistant","audio":{"id":"audio_1","transcript":"Hel"}}}]}`,
				`{"choices":[{"index":0,"delta":{"audio":{"id":"audio_1","transcript":"lo","data":"UklG"}}}]}`,
				`{"choices":[{"index":0,"delta":{"audio":{"id":"audio_1","data":"RiQA","expires_at":1729000000}}}]}`,
				`{"choices":[{"index":0,"delta":{"audio":{"expires_at":null}},"finish_reason":"stop"}]}`,
			},
			want: `{"id":null,"object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":null,"audio":{"id":"audio_1","transcript":"Hello","data":"UklGRiQA","expires_at":1729000000}},"logprobs":null,"finish_reason":"stop"}],"system_fingerprint":null,"usage":null}`,
		},
		{
			name: "delta: arrays append, the same bytes every time are kept once, scalars take the last non-null",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"annotations":[{"n":1}],"same":[7],"tag":"t","flag":false,"k":null}}]}`,
				`{"choices":[{"index":0,"delta":{"annotations":[ ],"same":[7],"tag":"t","flag":true}}]}`,
				`{"choices":[{"index":0,"delta":{"annotations":[{"n":2}, {"n":3}],"same":[7],"tag":"t","flag":null,"k":"now"}}]}`,
			},
			want: `{"id":null,"object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":null,"annotations":[{"n":1},{"n":2}, {"n":3}],"same":[7],"tag":"t","flag":true,"k":"now"},"logprobs":null,"finish_reason":null}],"system_fingerprint":null,"usage":null}`,
		},
		{
			name: "delta: values that differ once are all kept, a changed type replaces",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"s":"ab","a":[1],"o":"str"}}]}`,
				`{"choices":[{"index":0,"delta":{"s":"ab","a":[1],"o":{"x":1}}}]}`,
				`{"choices":[{"index":0,"delta":{"s":"c","a":[2],"o":{"x":2,"y":[3]}}}]}`,
			},
			want: `{"id":null,"object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":null,"s":"ababc","a":[1,1,2],"o":{"x":2,"y":[3]}},"logprobs":null,"finish_reason":null}],"system_fingerprint":null,"usage":null}`,
		},
		{
			name: "logprobs: arrays always append, even byte-equal entries",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"content":"\n"},"logprobs":{"content":[{"token":"\n","logprob":0.0}],"refusal":null}}]}`,
				`{"choices":[{"index":0,"delta":{"content":"\n"},"logprobs":{"content":[{"token":"\n","logprob":0.0}],"refusal":null}}]}`,
			},
			want: `{"id":null,"object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":"\n\n"},"logprobs":{"content":[{"token":"\n","logprob":0.0},{"token":"\n","logprob":0.0}],"refusal":null},"finish_reason":null}],"system_fingerprint":null,"usage":null}`,
		},
		{
			name: "usage: member by member, the last non-null wins",
			chunks: []string{
				`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}`,
				`{"choices":[],"usage":null}`,
				`{"choices":[],"usage":{"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":null}}`,
			},
			want: `{"id":null,"object":"chat.completion","created":null,"model":null,"choices":[],"system_fingerprint":null,"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":2}}}`,
		},
		{
			name: "tool calls: members of the call and of its function merge as a delta's",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","x_call":{"n":1},"function":{"name":"f","arguments":"{","strict":true}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"x_call":{"s":"a"},"function":{"arguments":"}","x_fn":"b"}}]}}]}`,
			},
			want: `{"id":null,"object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}","strict":true,"x_fn":"b"},"x_call":{"n":1,"s":"a"}}]},"logprobs":null,"finish_reason":null}],"system_fingerprint":null,"usage":null}`,
		},
		{
			name: "a choice's message member in a chunk is not doubled",
			chunks: []string{
				`{"choices":[{"index":0,"delta":{"content":"a"},"message":{"content":"b"}}]}`,
			},
			want: `{"id":null,"object":"chat.completion","created":null,"model":null,"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"logprobs":null,"finish_reason":null}],"system_fingerprint":null,"usage":null}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a Assembler
			if got := assemble(t, &a, Chat, tc.chunks...); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestAssemblerLimit(t *testing.T) {
	chunk := []byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"0123456789"}}]}`)
	many := []byte(`{"choices":[],"x":{` + strings.Repeat(`"k":1,`, 10) + `"k":2}}`)
	for _, tc := range []struct {
		name  string
		limit int
		add   func(a *Assembler) error
		want  error
	}{
		{"unlimited", 0, func(a *Assembler) error { return addN(a, chunk, 1000) }, nil},
		{"under the limit", 1000, func(a *Assembler) error { return addN(a, chunk, 50) }, nil},
		{"over the limit", 1000, func(a *Assembler) error { return addN(a, chunk, 200) }, ErrTooLarge},
		{"raw values replace, they do not add up", 100, func(a *Assembler) error { return addN(a, many, 1000) }, nil},
		{"too many members in one object", 0, func(a *Assembler) error {
			var b []byte
			b = append(b, `{"choices":[{"index":0,"delta":{"x":{`...)
			for i := range maxMembers + 1 {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendQuote(b, strconv.Itoa(i))
				b = append(b, ":1"...)
			}
			b = append(b, "}}}]}"...)
			return a.Add(b)
		}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := Assembler{Limit: tc.limit}
			a.Reset(Chat)
			if err := tc.add(&a); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			a.Reset(Chat) // Reset keeps the limit and forgets the count
			if a.Limit != tc.limit || a.size != 0 {
				t.Errorf("after Reset: limit %d size %d", a.Limit, a.size)
			}
		})
	}
}

func addN(a *Assembler, chunk []byte, n int) error {
	for range n {
		if err := a.Add(chunk); err != nil {
			return err
		}
	}
	return nil
}

// topMember is one top-level member of a JSON object as encoding/json reads it: the decoded key and the raw value.
type topMember struct {
	key string
	raw []byte
}

// topMembers returns the members of the JSON object in data in order, read with encoding/json.
func topMembers(data []byte) ([]topMember, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not an object: %v", err)
	}
	var out []topMember
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		out = append(out, topMember{tok.(string), bytes.TrimSpace(raw)})
	}
	return out, nil
}

// referenceTop merges the top-level members that the Assembler does not know of each chunk with encoding/json,
// by the rule the Assembler documents: the last non-null value wins, first-seen order, null only when nothing
// else came.
func referenceTop(chunks [][]byte) ([]topMember, error) {
	known := map[string]bool{"id": true, "object": true, "created": true, "model": true, "choices": true,
		"system_fingerprint": true, "usage": true, "error": true}
	var out []topMember
	for _, c := range chunks {
		if string(bytes.TrimSpace(c)) == "[DONE]" {
			continue
		}
		ms, err := topMembers(c)
		if err != nil {
			return nil, err
		}
	next:
		for _, m := range ms {
			if known[m.key] {
				continue
			}
			for k := range out {
				if out[k].key == m.key {
					if string(m.raw) != "null" {
						out[k].raw = m.raw
					}
					continue next
				}
			}
			out = append(out, m)
		}
	}
	return out, nil
}

func FuzzAssemble(f *testing.F) {
	for _, s := range []string{vllmStream, openaiStream, vllmErrorStream} {
		f.Add(uint8(0), []byte(strings.Join(streamChunks(s), "\n")))
	}
	f.Add(uint8(0), []byte(strings.Join([]string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","service_tier":"default","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":"","audio":{"id":"audio_1","transcript":"Hi"}},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","service_tier":"default","choices":[{"index":1,"delta":{"content":"Yo","annotations":[{"type":"url_citation"}]},"logprobs":{"content":[{"token":"Yo","logprob":-0.1}],"refusal":null},"token_ids":[42]}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":null}],"kv_transfer_params":{"remote_block_ids":[1,2]},"prompt_logprobs":[null,{"1":{"logprob":-1.0}}],"x_ext":null}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"completion_tokens_details":{"reasoning_tokens":0}},"x_ext":"\u00e9"}`,
		`[DONE]`,
	}, "\n")))
	f.Add(uint8(1), []byte(`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[{"index":0,"text":"Once","logprobs":{"tokens":["Once"]},"token_ids":[1]}],"prompt_token_ids":[1,2]}`+"\n"+
		`{"id":"cmpl-1","choices":[{"index":0,"text":" upon","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4},"x\u005fext":{ "a" : 1 }}`))
	f.Fuzz(func(t *testing.T, e uint8, stream []byte) {
		chunks := bytes.Split(stream, []byte("\n"))
		if len(chunks) > 16 {
			return
		}
		var a Assembler
		a.Reset(Endpoint(e%2 + 1))
		accepted := true
		for _, c := range chunks {
			if a.Add(c) != nil {
				accepted = false
			}
		}
		body := a.AppendBody(nil)
		if !json.Valid(body) {
			t.Fatalf("invalid JSON %s from %q", body, stream)
		}
		if !accepted {
			return
		}
		want, err := referenceTop(chunks)
		if err != nil {
			t.Fatalf("encoding/json rejects a stream the Assembler accepted (%v): %q", err, stream)
		}
		ms, err := topMembers(body)
		if err != nil {
			t.Fatal(err)
		}
		got := ms[:0]
		seen := map[string]bool{}
		for _, m := range ms {
			if seen[m.key] {
				t.Fatalf("member %q twice in %s", m.key, body)
			}
			seen[m.key] = true
			switch m.key {
			case "id", "object", "created", "model", "choices", "system_fingerprint", "usage":
			default:
				got = append(got, m)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("unknown members %q, want %q (stream %q)", got, want, stream)
		}
		for k := range got {
			if got[k].key != want[k].key || !bytes.Equal(got[k].raw, want[k].raw) {
				t.Fatalf("member %d: %q = %s, want %q = %s (stream %q)", k, got[k].key, got[k].raw, want[k].key, want[k].raw, stream)
			}
		}
	})
}

// BenchmarkAssemblerAddUnknown adds an OpenAI chunk whose members the Assembler does not know (service_tier,
// obfuscation), and a vLLM one carrying token_ids; compare with BenchmarkAssemblerAdd.
func BenchmarkAssemblerAddUnknown(b *testing.B) {
	for _, tc := range []struct{ name, chunk string }{
		{"openai", `{"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000001,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_1",` +
			`"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"Xq3z"}`},
		{"vllm", `{"id":"chatcmpl-7f3a","object":"chat.completion.chunk","created":1718000000,"model":"llama-3.1-8b-instruct",` +
			`"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null,"token_ids":[3186]}]}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			chunk := []byte(tc.chunk)
			var a Assembler
			a.Reset(Chat)
			b.ReportAllocs()
			b.SetBytes(int64(len(chunk)))
			n := 0
			for b.Loop() {
				if n++; n%1000 == 0 {
					a.Reset(Chat) // a 1,000-token answer, then the next stream
				}
				if err := a.Add(chunk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestAssembleTokenIDs: vLLM's per-chunk token_ids add up to the answer's, in order, even when two chunks
// carry the same ids.
func TestAssembleTokenIDs(t *testing.T) {
	var a Assembler
	a.Reset(Chat)
	for _, c := range []string{
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"token_ids":[7]}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"a"},"token_ids":[7]}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"b"},"token_ids":[8, 9],"finish_reason":"stop"}]}`,
	} {
		if err := a.Add([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	body := string(a.AppendBody(nil))
	if !strings.Contains(body, `"token_ids":[7,7,8, 9]`) && !strings.Contains(body, `"token_ids":[7,7,8,9]`) {
		t.Errorf("token_ids not appended: %s", body)
	}
}
