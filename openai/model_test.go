package openai

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

func TestAppendRenamedModel(t *testing.T) {
	const from, to = "llama-3", "public"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"compact", `{"id":"x","model":"llama-3","choices":[]}`, `{"id":"x","model":"public","choices":[]}`},
		{"spacing", "{ \"id\" : \"x\" ,\n\t\"model\"\t:\r\n \"llama-3\" , \"n\":1 }", "{ \"id\" : \"x\" ,\n\t\"model\"\t:\r\n \"public\" , \"n\":1 }"},
		{"last member", `{"choices":[],"model" :"llama-3"}`, `{"choices":[],"model" :"public"}`},
		{"escaped key", `{"m\u006fdel":"llama-3"}`, `{"m\u006fdel":"public"}`},
		{"escaped value", `{"model":"llama\u002d3"}`, `{"model":"public"}`},
		{"escaped solidus", `{"model":"org\/m"}`, `{"model":"org\/m"}`},
		{"every top-level model member", `{"model":"llama-3","model":"llama-3"}`, `{"model":"public","model":"public"}`},
		{"another model", `{"model":"llama-3-70b"}`, `{"model":"llama-3-70b"}`},
		{"a prefix of it", `{"model":"llama"}`, `{"model":"llama"}`},
		{"not a string", `{"model":3,"x":{"model":"llama-3"}}`, `{"model":3,"x":{"model":"llama-3"}}`},
		{"deeper objects are content", `{"model":"llama-3-70b","x":{"model":"llama-3"}}`, `{"model":"llama-3-70b","x":{"model":"llama-3"}}`},
		{"content strings are content", `{"choices":[{"delta":{"content":"\"model\":\"llama-3\""}}],"model":"llama-3"}`, `{"choices":[{"delta":{"content":"\"model\":\"llama-3\""}}],"model":"public"}`},
		{"tool arguments are content", `{"choices":[{"message":{"tool_calls":[{"function":{"arguments":"{\"model\":\"llama-3\"}"}}]}}]}`, `{"choices":[{"message":{"tool_calls":[{"function":{"arguments":"{\"model\":\"llama-3\"}"}}]}}]}`},
		{"messages are content", `{"messages":[{"model":"llama-3"}],"model":"llama-3"}`, `{"messages":[{"model":"llama-3"}],"model":"public"}`},
		{"Responses API event", `{"type":"response.created","response":{"id":"resp_1","model" : "llama-3","output":[{"model":"llama-3"}]}}`, `{"type":"response.created","response":{"id":"resp_1","model" : "public","output":[{"model":"llama-3"}]}}`},
		{"Anthropic message_start", `{"type":"message_start","message":{"id":"msg_1","model":"llama-3","content":[]}}`, `{"type":"message_start","message":{"id":"msg_1","model":"public","content":[]}}`},
		{"response deeper than the top is content", `{"x":{"response":{"model":"llama-3"}}}`, `{"x":{"response":{"model":"llama-3"}}}`},
		{"not an object", `["model","llama-3"]`, `["model","llama-3"]`},
		{"done", `[DONE]`, `[DONE]`},
		{"broken JSON", `{"model":"llama-3",}`, `{"model":"llama-3",}`},
		{"truncated", `{"model":"llama-3"`, `{"model":"llama-3"`},
		{"trailing bytes", `{"model":"llama-3"} x`, `{"model":"llama-3"} x`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.in)
			if got := string(AppendRenamedModel([]byte("prefix"), body, body, from, to)); got != "prefix"+tc.want {
				t.Errorf("body:  got %s\nwant %s", got, "prefix"+tc.want)
			}
			ev := []byte("event: chunk\ndata: " + tc.in + "\n\n")
			data := ev[len("event: chunk\ndata: ") : len(ev)-2]
			want := "event: chunk\ndata: " + tc.want + "\n\n"
			if got := string(AppendRenamedModel(nil, ev, data, from, to)); got != want {
				t.Errorf("event: got %q\nwant %q", got, want)
			}
		})
	}
}

func TestAppendRenamedModelQuotesTo(t *testing.T) {
	body := []byte(`{"model":"a"}`)
	got := AppendRenamedModel(nil, body, body, "a", "b\"c\n\xff")
	if want := `{"model":"b\"c\n\ufffd"}`; string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestAppendRenamedModelNotASubslice(t *testing.T) {
	raw := []byte(`data: {"model":"a"}` + "\n\n")
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"a copy", []byte(`{"model":"a"}`)},
		{"empty", raw[:0]},
		{"capacity cut", raw[6:19:19]},
		{"past the end", raw[6:19][:0]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := AppendRenamedModel(nil, raw, tc.data, "a", "b"); !bytes.Equal(got, raw) {
				t.Errorf("got %q, want raw unchanged", got)
			}
		})
	}
}

func TestAppendRenamedModelAllocs(t *testing.T) {
	ev := []byte("data: " + string(benchChunk) + "\n\n")
	escaped := []byte(`{"m\u006fdel":"llama\u002d3.1-8b-instruct","choices":[{"delta":{"content":"\"model\" \u00e9"}}]}`)
	dst := make([]byte, 0, 1024)
	for _, tc := range []struct {
		name      string
		raw, data []byte
	}{
		{"event", ev, ev[len("data: ") : len(ev)-2]},
		{"escaped body", escaped, escaped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := AppendRenamedModel(dst[:0], tc.raw, tc.data, "llama-3.1-8b-instruct", "public"); !bytes.Contains(got, []byte(`"public"`)) {
				t.Fatalf("not renamed: %s", got)
			}
			if n := testing.AllocsPerRun(100, func() {
				dst = AppendRenamedModel(dst[:0], tc.raw, tc.data, "llama-3.1-8b-instruct", "public")
			}); n != 0 {
				t.Errorf("%v allocs, want 0", n)
			}
		})
	}
}

func BenchmarkAppendRenamedModel(b *testing.B) {
	ev := []byte("data: " + string(benchChunk) + "\n\n")
	data := ev[len("data: ") : len(ev)-2]
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		dst = AppendRenamedModel(dst[:0], ev, data, "llama-3.1-8b-instruct", "public-model")
	}
}

// renameReference renames the model members AppendRenamedModel documents in v, a decoded JSON value.
func renameReference(v any, from, to string) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	rename := func(m map[string]any) {
		if s, ok := m["model"].(string); ok && s == from {
			m["model"] = to
		}
	}
	rename(m)
	for _, k := range []string{"response", "message"} {
		if inner, ok := m[k].(map[string]any); ok {
			rename(inner)
		}
	}
	return m
}

func decodeNumbers(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

func FuzzAppendRenamedModel(f *testing.F) {
	for _, s := range []string{vllmStream, openaiStream, vllmErrorStream} {
		for _, c := range streamChunks(s) {
			f.Add([]byte(c), "llama", "public")
			f.Add([]byte(c), "gpt-4o-mini-2024-07-18", "gpt-4o-mini")
		}
	}
	f.Add([]byte(`{"type":"response.created","response":{"id":"resp_1","model":"llama","output":[]}}`), "llama", "pub")
	f.Add([]byte(`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[]}}`), "claude", "pub")
	f.Add([]byte(`{ "m\u006fdel" : "gpt\u002d4", "choices":[{"message":{"content":"{\"model\":\"gpt-4\"}"}}] }`), "gpt-4", "x\"y")
	f.Fuzz(func(t *testing.T, data []byte, from, to string) {
		ev := append(append([]byte("data: "), data...), "\n\n"...)
		out := AppendRenamedModel(nil, ev, ev[6:6+len(data)], from, to)
		if !bytes.HasPrefix(out, []byte("data: ")) || !bytes.HasSuffix(out, []byte("\n\n")) {
			t.Fatalf("the event around the data changed: %q", out)
		}
		got := out[6 : len(out)-2]
		if body := AppendRenamedModel(nil, data, data, from, to); !bytes.Equal(body, got) {
			t.Fatalf("body %q and event %q disagree", body, got)
		}
		valid := json.Valid(data)
		if json.Valid(got) != valid {
			t.Fatalf("valid %v in, %v out: %q -> %q", valid, !valid, data, got)
		}
		if !valid || len(data) == 0 || bytes.TrimLeft(data, " \t\r\n")[0] != '{' {
			if !bytes.Equal(got, data) {
				t.Fatalf("data that is not an object changed: %q -> %q", data, got)
			}
			return
		}
		in, err1 := decodeNumbers(data)
		res, err2 := decodeNumbers(got)
		if err1 != nil || err2 != nil {
			t.Fatalf("decode: %v, %v", err1, err2)
		}
		var quotedTo string
		json.Unmarshal(AppendQuoted(nil, to), &quotedTo)
		if want := renameReference(in, from, quotedTo); !reflect.DeepEqual(res, want) {
			t.Fatalf("decoded output %v, want %v (%q -> %q)", res, want, data, got)
		}
	})
}
