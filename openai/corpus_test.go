package openai

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Realistic wire samples: they seed the fuzzers (testdata/fuzz, written by TestWriteSeedCorpus) and the tests.

// vllmStream is a vLLM chat stream with include_usage, as vLLM 0.6+ writes it.
var vllmStream = "" +
	`data: {"id":"chatcmpl-b1","object":"chat.completion.chunk","created":1718000000,"model":"llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
	`data: {"id":"chatcmpl-b1","object":"chat.completion.chunk","created":1718000000,"model":"llama","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
	`data: {"id":"chatcmpl-b1","object":"chat.completion.chunk","created":1718000000,"model":"llama","choices":[{"index":0,"delta":{"content":" world\n\u00e9"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
	`data: {"id":"chatcmpl-b1","object":"chat.completion.chunk","created":1718000000,"model":"llama","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}` + "\n\n" +
	`data: {"id":"chatcmpl-b1","object":"chat.completion.chunk","created":1718000000,"model":"llama","choices":[],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":null}}` + "\n\n" +
	"data: [DONE]\n\n"

// openaiStream is an OpenAI chat stream with include_usage: "usage":null on every chunk but the last.
var openaiStream = "" +
	`data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000001,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000001,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_x","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000001,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000001,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}` + "\n\n" +
	`data: {"id":"chatcmpl-A1","object":"chat.completion.chunk","created":1718000001,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":80,"completion_tokens":17,"total_tokens":97,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}` + "\n\n" +
	"data: [DONE]\n\n"

// vllmErrorStream fails mid-stream the way vLLM does.
var vllmErrorStream = "" +
	`data: {"id":"cmpl-9","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Once","logprobs":null,"finish_reason":null}]}` + "\n\n" +
	`data: {"error":{"object":"error","message":"CUDA out of memory","type":"InternalServerError","param":null,"code":500}}` + "\n\n" +
	"data: [DONE]\n\n"

// streamChunks returns the data of each event of a stream.
func streamChunks(stream string) []string {
	var out []string
	for _, ev := range strings.Split(stream, "\n\n") {
		if d, ok := strings.CutPrefix(ev, "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// TestWriteSeedCorpus regenerates testdata/fuzz from the samples: SWITCHYARD_WRITE_CORPUS=1 go test -run TestWriteSeedCorpus ./openai/
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("SWITCHYARD_WRITE_CORPUS") == "" {
		t.Skip("set SWITCHYARD_WRITE_CORPUS=1 to rewrite testdata/fuzz")
	}
	write := func(fuzzer, name string, args ...any) {
		var b strings.Builder
		b.WriteString("go test fuzz v1\n")
		for _, a := range args {
			switch v := a.(type) {
			case uint8:
				fmt.Fprintf(&b, "byte(%s)\n", strconv.QuoteRune(rune(v)))
			case uint16:
				fmt.Fprintf(&b, "uint16(%d)\n", v)
			case bool:
				fmt.Fprintf(&b, "bool(%v)\n", v)
			case string:
				fmt.Fprintf(&b, "string(%s)\n", strconv.Quote(v))
			case []byte:
				fmt.Fprintf(&b, "[]byte(%s)\n", strconv.Quote(string(v)))
			}
		}
		dir := filepath.Join("testdata", "fuzz", fuzzer)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bodies := map[string]struct {
		e    Endpoint
		body string
	}{
		"chat-4k":       {Chat, string(chatBody(4 << 10))},
		"chat-tools":    {Chat, `{"model":"gpt-4o","messages":[{"role":"system","content":"Use tools."},{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18C"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":"auto","stream":true,"stream_options":{"include_usage":false}}`},
		"chat-vision":   {Chat, `{"model":"llava","messages":[{"role":"user","content":[{"type":"text","text":"What is in this image?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}}]}],"max_completion_tokens":300,"temperature":0.2,"n":2}`},
		"completions":   {Completions, `{"model":"llama","prompt":"Say this is a test","max_tokens":7,"temperature":0,"stream":true,"logprobs":2,"echo":false}`},
		"completions-t": {Completions, `{"model":"llama","prompt":[[1,15043,29892],[1,2]],"max_tokens":16}`},
		"embeddings":    {Embeddings, `{"model":"bge","input":["The food was delicious","and the waiter..."],"encoding_format":"float"}`},
	}
	for name, b := range bodies {
		write("FuzzParse", name, uint8(b.e-1), []byte(b.body))
		write("FuzzAppendPrompt", name, uint8(b.e-1), []byte(b.body))
		write("FuzzAppendUpstreamBody", name, uint8(b.e-1), []byte(b.body), "routed-model", true)
	}
	streams := map[string]string{"vllm": vllmStream, "openai": openaiStream, "error": vllmErrorStream,
		"crlf": strings.ReplaceAll(vllmStream, "\n", "\r\n"), "cr": strings.ReplaceAll(openaiStream, "\n", "\r")}
	for name, s := range streams {
		write("FuzzEventReader", name, []byte(s), []byte{7, 1, 200, 3}, uint16(4096))
		for i, c := range streamChunks(s) {
			write("FuzzInspectChunk", fmt.Sprintf("%s-%d", name, i), []byte(c))
			write("FuzzAppendWithoutNullUsage", fmt.Sprintf("%s-%d", name, i), []byte(c))
		}
		chunks := streamChunks(s)
		for i := 0; i+1 < len(chunks); i++ {
			write("FuzzAssembler", fmt.Sprintf("%s-%d", name, i), uint8(0), []byte(chunks[i]), []byte(chunks[i+1]))
		}
	}
	write("FuzzAppendQuoted", "mixed", "line\nbreak \"quoted\" \\ tab\t \x00 é 日本 \u2028 \xff")
}

func TestSampleStreams(t *testing.T) {
	// The vLLM stream re-assembles into its non-streaming body; the OpenAI stream keeps its bytes once the nulls go.
	var a Assembler
	got := assemble(t, &a, Chat, streamChunks(vllmStream)...)
	want := `{"id":"chatcmpl-b1","object":"chat.completion","created":1718000000,"model":"llama","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world\n\u00e9"},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"system_fingerprint":null,"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":null}}`
	if got != want {
		t.Errorf("vLLM stream:\n got %s\nwant %s", got, want)
	}
	got = assemble(t, &a, Chat, streamChunks(openaiStream)...)
	want = `{"id":"chatcmpl-A1","object":"chat.completion","created":1718000001,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"","tool_calls":[{"id":"call_x","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"system_fingerprint":"fp_1","usage":{"prompt_tokens":80,"completion_tokens":17,"total_tokens":97,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`
	if got != want {
		t.Errorf("OpenAI stream:\n got %s\nwant %s", got, want)
	}
	if u, _ := a.Usage(); u.CachedTokens != 64 {
		t.Errorf("cached tokens %d", u.CachedTokens)
	}
	// Relaying the OpenAI stream: every chunk's "usage":null goes, nothing else changes.
	er := NewEventReader(strings.NewReader(openaiStream), 0)
	var out []byte
	for {
		ev, err := er.Next()
		if err != nil {
			break
		}
		var ci ChunkInfo
		if err := InspectChunk(ev.Data, &ci); err != nil {
			t.Fatal(err)
		}
		if ci.UsageOnly {
			continue // the injected usage chunk is the gateway's, not the client's
		}
		out = append(out, "data: "...)
		out = AppendWithoutNullUsage(out, ev.Data)
		out = append(out, "\n\n"...)
	}
	var relayed strings.Builder
	for i, c := range streamChunks(openaiStream) {
		if i != 4 { // the usage chunk
			relayed.WriteString("data: " + strings.Replace(c, `,"usage":null`, "", 1) + "\n\n")
		}
	}
	if string(out) != relayed.String() {
		t.Errorf("relayed stream:\n got %s\nwant %s", out, relayed.String())
	}
	// The error stream: InspectChunk flags the error, Add returns it.
	chunks := streamChunks(vllmErrorStream)
	var ci ChunkInfo
	if InspectChunk([]byte(chunks[1]), &ci); !ci.Error {
		t.Error("error chunk not flagged")
	}
	a.Reset(Completions)
	a.Add([]byte(chunks[0]))
	if err := a.Add([]byte(chunks[1])); err == nil || !strings.Contains(err.Error(), "CUDA out of memory") {
		t.Errorf("Add(error chunk) = %v", err)
	}
}
