package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func TestAppendContinuation(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    Endpoint
		body string
		want string
	}{
		{"chat", Chat,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":true}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel\"lo"}],` +
				`"max_tokens":70,"stream":true,"continue_final_message":true,"add_generation_prompt":false}`},
		{"chat with both bounds and the flags set", Chat,
			`{"messages": [ {"role":"user","content":"hi"} ] ,"max_completion_tokens":40,"max_tokens":20,` +
				`"add_generation_prompt":true,"continue_final_message":false,"min_tokens":50}`,
			`{"messages": [ {"role":"user","content":"hi"} ,{"role":"assistant","content":"Hel\"lo"}] ,` +
				`"max_completion_tokens":10,"max_tokens":1,"add_generation_prompt":false,"continue_final_message":true,` +
				`"min_tokens":20}`},
		{"completions", Completions,
			`{"model":"m","prompt":"Once upon","max_tokens":null,"stream":true}`,
			`{"model":"m","prompt":"Once uponHel\"lo","max_tokens":null,"stream":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AppendContinuation([]byte("x"), []byte(tc.body), tc.e, []byte(`Hel\"lo`), 30)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "x"+tc.want {
				t.Errorf("got  %s\nwant x%s", got, tc.want)
			}
			if !json.Valid(got[1:]) {
				t.Errorf("not valid JSON: %s", got[1:])
			}
		})
	}
	for _, tc := range []struct {
		name string
		e    Endpoint
		body string
	}{
		{"two choices", Chat, `{"messages":[{"role":"user","content":"hi"}],"n":2}`},
		{"already continuing", Chat, `{"messages":[{"role":"assistant","content":"a"}],"continue_final_message":true}`},
		{"no messages", Chat, `{"model":"m"}`},
		{"token ids", Completions, `{"prompt":[1,2,3]}`},
		{"batch", Completions, `{"prompt":["a","b"]}`},
		{"echo", Completions, `{"prompt":"a","echo":true}`},
		{"suffix", Completions, `{"prompt":"a","suffix":"z"}`},
		{"best of", Completions, `{"prompt":"a","best_of":3}`},
		{"embeddings", Embeddings, `{"input":"a"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := AppendContinuation(nil, []byte(tc.body), tc.e, []byte("x"), 1); !errors.Is(err, ErrNotContinuable) {
				t.Errorf("err = %v, want ErrNotContinuable", err)
			}
		})
	}
}

func TestAppendResumed(t *testing.T) {
	id := []byte(`"chatcmpl-first"`)
	for _, tc := range []struct{ name, data, want string }{
		{"content", `{"id":"chatcmpl-2","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}`,
			`{"id":"chatcmpl-first","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}`},
		{"usage", `{"id":"chatcmpl-2","choices":[],"usage":{"prompt_tokens":80,"total_tokens":130,` +
			`"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":75}}}`,
			`{"id":"chatcmpl-first","choices":[],"usage":{"prompt_tokens":50,"total_tokens":130,` +
				`"completion_tokens":80,"prompt_tokens_details":{"cached_tokens":50}}}`},
		{"null usage", `{"id":"c","usage":null}`, `{"id":"chatcmpl-first","usage":null}`},
		{"not an object", `[DONE]`, `[DONE]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := []byte("data: " + tc.data + "\n\n")
			data := raw[len("data: ") : len(raw)-2]
			got := AppendResumed(nil, raw, data, id, 30)
			if want := "data: " + tc.want + "\n\n"; string(got) != want {
				t.Errorf("got  %q\nwant %q", got, want)
			}
		})
	}
}

func TestAssemblerPartial(t *testing.T) {
	var a Assembler
	a.Reset(Chat)
	for _, c := range []string{
		`{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"}}]}`,
		`{"id":"c1","choices":[{"index":0,"delta":{"content":"\"lo"}}]}`,
	} {
		if err := a.Add([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	id, text, ok := a.Partial()
	if !ok || string(id) != `"c1"` || string(text) != `Hel\"lo` {
		t.Fatalf("Partial = %s, %s, %v", id, text, ok)
	}
	for _, c := range []struct{ name, chunk string }{
		{"finished", `{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`},
		{"a tool call", `{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}`},
		{"reasoning", `{"id":"c1","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`},
		{"a second choice", `{"id":"c1","choices":[{"index":1,"delta":{"content":"x"}}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b Assembler
			b.Reset(Chat)
			if err := b.Add([]byte(`{"id":"c1","choices":[{"index":0,"delta":{"content":"a"}}]}`)); err != nil {
				t.Fatal(err)
			}
			if err := b.Add([]byte(c.chunk)); err != nil {
				t.Fatal(err)
			}
			if _, _, ok := b.Partial(); ok {
				t.Error("Partial ok, want not")
			}
		})
	}
}

// FuzzAppendResumed feeds AppendResumed whatever an engine may send as a chunk: it must not panic, it must keep
// the event's framing, and a well-formed JSON chunk must stay well formed, with the first answer's id.
func FuzzAppendResumed(f *testing.F) {
	for _, s := range []string{
		`{"id":"c2","choices":[{"index":0,"delta":{"content":"x"}}]}`,
		`{"id":"c2","choices":[],"usage":{"prompt_tokens":80,"total_tokens":130,"completion_tokens":50,` +
			`"prompt_tokens_details":{"cached_tokens":75}}}`,
		`{"usage":{"prompt_tokens":"x","completion_tokens":1e3},"id":null}`,
		`{"id":"a","id":"b","usage":{}}`, `[DONE]`, `{`, `{"\u0069d":1}`, `[[[[`,
	} {
		f.Add(s, 30)
	}
	id := []byte(`"chatcmpl-first"`)
	f.Fuzz(func(t *testing.T, data string, generated int) {
		raw := []byte("data: " + data + "\n\n")
		d := raw[len("data: ") : len(raw)-2]
		out := AppendResumed(nil, raw, d, id, generated)
		if !bytes.HasPrefix(out, []byte("data: ")) || !bytes.HasSuffix(out, []byte("\n\n")) {
			t.Fatalf("framing lost: %q", out)
		}
		got := out[len("data: ") : len(out)-2]
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(data), &obj) != nil {
			return
		}
		if err := json.Unmarshal(got, &obj); err != nil {
			t.Fatalf("%s became %s: %v", data, got, err)
		}
		if _, had := obj["id"]; had && string(obj["id"]) != string(id) {
			t.Fatalf("%s became %s: id %s", data, got, obj["id"])
		}
	})
}

// TestAppendResumedDoesNotAllocate: a resumed stream's every chunk goes through AppendResumed.
func TestAppendResumedDoesNotAllocate(t *testing.T) {
	raw := []byte(`data: {"id":"c2","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}],` +
		`"usage":{"prompt_tokens":80,"completion_tokens":5,"total_tokens":85}}` + "\n\n")
	data := raw[len("data: ") : len(raw)-2]
	dst := make([]byte, 0, 512)
	id := []byte(`"first"`)
	if n := testing.AllocsPerRun(100, func() { dst = AppendResumed(dst[:0], raw, data, id, 3) }); n != 0 {
		t.Errorf("AppendResumed allocates %v times a chunk, want 0", n)
	}
}
