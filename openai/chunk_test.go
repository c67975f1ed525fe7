package openai

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestInspectChunk(t *testing.T) {
	tests := []struct {
		name string
		data string
		want ChunkInfo
	}{
		{"done", `[DONE]`, ChunkInfo{Done: true}},
		{"done with blanks", ` [DONE] `, ChunkInfo{Done: true}},
		{"role chunk", `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, ChunkInfo{}},
		{"content", `{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}`, ChunkInfo{Content: true, Tokens: 1}},
		{"reasoning_content", `{"choices":[{"delta":{"reasoning_content":"hm"}}]}`, ChunkInfo{Content: true, Tokens: 1}},
		{"reasoning", `{"choices":[{"delta":{"reasoning":"hm"}}]}`, ChunkInfo{Content: true, Tokens: 1}},
		{"refusal", `{"choices":[{"delta":{"refusal":"no"}}]}`, ChunkInfo{Content: true, Tokens: 1}},
		{"tool call", `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`, ChunkInfo{Content: true, Tokens: 1}},
		{"empty tool calls", `{"choices":[{"delta":{"tool_calls":[]}}]}`, ChunkInfo{}},
		{"completions text", `{"object":"text_completion","choices":[{"index":0,"text":" world","finish_reason":null}]}`, ChunkInfo{Content: true, Tokens: 1}},
		{"empty text", `{"choices":[{"index":0,"text":"","finish_reason":"length"}]}`, ChunkInfo{FinishReason: []byte("length")}},
		{"n=2 in one chunk", `{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"},"finish_reason":"stop"}]}`,
			ChunkInfo{Content: true, Tokens: 2, FinishReason: []byte("stop")}},
		{"first finish reason", `{"choices":[{"index":0,"delta":{},"finish_reason":null},{"index":1,"delta":{},"finish_reason":"length"},{"index":2,"delta":{},"finish_reason":"stop"}]}`,
			ChunkInfo{FinishReason: []byte("length")}},
		{"usage chunk", `{"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}}`,
			ChunkInfo{UsageOnly: true, HasUsage: true, Usage: Usage{10, 5, 15, 8, true}}},
		{"usage null", `{"choices":[{"delta":{"content":"x"}}],"usage":null}`, ChunkInfo{Content: true, Tokens: 1}},
		{"continuous usage", `{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1,"prompt_tokens_details":null}}`,
			ChunkInfo{Content: true, Tokens: 1, HasUsage: true, Usage: Usage{3, 1, 4, 0, false}}},
		{"vllm error", `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`, ChunkInfo{Error: true}},
		{"null error", `{"error":null,"choices":[]}`, ChunkInfo{}},
		{"escaped keys", `{"ch\u006fices":[{"delta":{"c\u006fntent":"x"}}]}`, ChunkInfo{Content: true, Tokens: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ci ChunkInfo
			if err := InspectChunk([]byte(tc.data), &ci); err != nil {
				t.Fatal(err)
			}
			if ci.FinishReason == nil && tc.want.FinishReason == nil {
				ci.FinishReason, tc.want.FinishReason = []byte{}, []byte{}
			}
			if !reflect.DeepEqual(ci, tc.want) {
				t.Errorf("got  %+v\nwant %+v", ci, tc.want)
			}
		})
	}
	for _, bad := range []string{``, `{`, `{"choices":[}`, `[1]`, `"x"`, `[DONE`, `{"a":1}x`, `{"a":1} [DONE]`} {
		var ci ChunkInfo
		if err := InspectChunk([]byte(bad), &ci); err == nil {
			t.Errorf("InspectChunk(%q) accepted", bad)
		}
	}
}

func TestInspectChunkAllocs(t *testing.T) {
	data := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"c\u006fntent":"Hello"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`)
	var ci ChunkInfo
	if n := testing.AllocsPerRun(100, func() { InspectChunk(data, &ci) }); n != 0 {
		t.Errorf("%v allocs, want 0", n)
	}
}

func FuzzInspectChunk(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":"Hi","tool_calls":[{"index":0}]},"finish_reason":"stop"}],"usage":null}`,
		`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":1}}}`,
		`{"error":{"message":"x","code":500}}`, `[DONE]`, `{"choices":[{"text":"a"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ci ChunkInfo
		err := InspectChunk(data, &ci)
		if ci.Done {
			return
		}
		var m map[string]any
		jerr := decodeJSON(data, &m)
		if jerr == nil && m == nil {
			jerr = errNotObject // null: encoding/json leaves the map nil, a chunk must be an object
		}
		if (err == nil) != (jerr == nil) {
			// encoding/json accepts deeper nesting than chunkDepth; nothing else may differ.
			if err == nil || !strings.Contains(err.Error(), "nesting") {
				t.Fatalf("%q: InspectChunk %v, encoding/json %v", data, err, jerr)
			}
		}
		if err != nil {
			return
		}
		choices, hasChoices := m["choices"].([]any)
		usage, _ := m["usage"].(map[string]any)
		if ci.HasUsage != (usage != nil) || ci.UsageOnly != (hasChoices && len(choices) == 0 && usage != nil) {
			t.Fatalf("%q: %+v", data, ci)
		}
		if ci.Tokens > len(choices) || ci.Content != (ci.Tokens > 0) {
			t.Fatalf("%q: %+v", data, ci)
		}
		if ci.Error != (m["error"] != nil) {
			t.Fatalf("%q: Error %v", data, ci.Error)
		}
	})
}

func TestAppendWithoutNullUsage(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"id":"x","choices":[],"usage":null}`, `{"id":"x","choices":[]}`},
		{`{"usage":null,"id":"x"}`, `{"id":"x"}`},
		{`{ "usage" : null , "id":"x"}`, `{ "id":"x"}`},
		{`{"usage":null}`, `{}`},
		{`{"a":1 , "usage":null , "b":2}`, `{"a":1 , "b":2}`},
		{`{"a":1,"usage":null,"usage":null}`, `{"a":1}`},
		{`{"usage":null,"usage":null,"a":1}`, `{"a":1}`},
		{`{"a":1,"\u0075sage":null}`, `{"a":1}`},
		{`{"a":{"usage":null},"usage":{"total_tokens":1}}`, `{"a":{"usage":null},"usage":{"total_tokens":1}}`},
		{`{"a":"usage"}`, `{"a":"usage"}`},
		{`[DONE]`, `[DONE]`},
		{`{"usage":null`, `{"usage":null`},
	}
	for _, tc := range tests {
		if got := AppendWithoutNullUsage([]byte("pre"), []byte(tc.in)); string(got) != "pre"+tc.want {
			t.Errorf("AppendWithoutNullUsage(%s) = %s, want pre%s", tc.in, got, tc.want)
		}
	}
	data := []byte(`{"id":"x","choices":[{"delta":{"content":"usage"}}],"usage":null}`)
	dst := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { AppendWithoutNullUsage(dst, data) }); n != 0 {
		t.Errorf("%v allocs, want 0", n)
	}
}

func FuzzAppendWithoutNullUsage(f *testing.F) {
	f.Add([]byte(`{"a":1 , "usage":null , "b":2}`))
	f.Add([]byte(`{"usage":null,"usage":null,"a":{"usage":null}}`))
	f.Add([]byte(`{"n":1e700,"usage":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out := AppendWithoutNullUsage(nil, data)
		var before map[string]any
		if decodeJSON(data, &before) != nil || !validJSON(data) {
			if string(out) != string(data) {
				t.Fatalf("%q changed to %q", data, out)
			}
			return
		}
		var after map[string]any
		if err := decodeJSON(out, &after); err != nil {
			t.Fatalf("%q -> %q: %v", data, out, err)
		}
		if v, ok := before["usage"]; ok && v == nil {
			if after["usage"] != nil {
				return // "usage" repeated, a null last: removing the nulls lets an earlier value through
			}
			delete(before, "usage")
		}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("%q -> %q", data, out)
		}
	})
}

// FuzzAddInspectAgreesWithInspectChunk: the assembler's inspection (AddInspect, the non-streaming relay's single
// scan) reports what InspectChunk reports, field for field, for any chunk, and rejects what InspectChunk rejects.
// The seeds are FuzzInspectChunk's corpus and cases chosen for the rules that differ from merging: duplicate
// members (the last "choices", "usage" and "error" win), several deltas in one choice, escaped keys.
func FuzzAddInspectAgreesWithInspectChunk(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"delta":{"content":"Hi","tool_calls":[{"index":0}]},"finish_reason":"stop"}],"usage":null}`,
		`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":1}}}`,
		`{"error":{"message":"x","code":500}}`, `[DONE]`, ` [DONE] `, `{"choices":[{"text":"a"}]}`, `null`, `[1]`,
		`{"choices":[{"delta":{"content":"a"}}],"choices":[]}`, `{"choices":[],"choices":[{"delta":{"refusal":"no"}}]}`,
		`{"usage":{"total_tokens":1},"usage":null}`, `{"error":{"message":"x"},"error":null}`,
		`{"choices":[{"delta":{"content":""},"delta":{"reasoning":"r"},"finish_reason":null,"finish_reason":"length"}]}`,
		`{"ch\u006fices":[{"d\u0065lta":{"c\u006fntent":"x"}},{"index":1,"text":""},7]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[ ]}},{"index":1,"delta":{"tool_calls":[{}]}}]}`,
		`{"choices":[{"index":99999,"delta":{"content":"x"}}]}`, `{"choices":[{"delta":{"content":"x"}}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got ChunkInfo
		werr := InspectChunk(data, &want)
		var a Assembler
		a.Reset(Chat)
		gerr := a.AddInspect(data, &got)
		var se *SyntaxError
		if werr != nil {
			if gerr == nil {
				t.Fatalf("%q: InspectChunk %v, AddInspect accepted it", data, werr)
			}
			return
		}
		var serr *StreamError
		switch {
		case gerr == nil, errors.As(gerr, &serr), errors.Is(gerr, ErrTooLarge):
			// scanned to the end: every field must agree
		case errors.As(gerr, &se):
			t.Fatalf("%q: InspectChunk accepted it, AddInspect %v", data, gerr)
		default:
			return // the assembler's own refusal (a choice index out of range) stops its scan early
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\nAddInspect   %+v\nInspectChunk %+v", data, got, want)
		}
	})
}
