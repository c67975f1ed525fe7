package openai

import (
	"encoding/json"
	"errors"
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
	chunks := [][]byte{
		[]byte(`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`),
		[]byte(`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token "}}]}`),
		[]byte(`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]}}]}`),
		[]byte(`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`),
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
	}
	run()
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Errorf("a reused Assembler: %v allocs per stream, want 0", n)
	}
}

func FuzzAssembler(f *testing.F) {
	f.Add(uint8(Chat), []byte(`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"logprobs":{"content":[{"token":"a"}]}}]}`),
		[]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","function":{"name":"f","arguments":"{"}}]},"finish_reason":"stop"}],"usage":{"total_tokens":1}}`))
	f.Add(uint8(Completions), []byte(`{"choices":[{"index":1,"text":"a\u00e9"}]}`), []byte(`{"choices":[{"index":0,"text":"b","logprobs":{"tokens":["b"]}}]}`))
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
