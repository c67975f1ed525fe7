package sim

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/openai"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name      string
		ep        openai.Endpoint
		body      string
		maxTokens int
		status    int // 0: valid
	}{
		{"chat", openai.Chat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, 5, 0},
		{"no max_tokens", openai.Chat, `{"messages":[{"role":"user","content":"hi"}]}`, 0, 0},
		{"max_completion_tokens wins", openai.Chat,
			`{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_completion_tokens":7}`, 7, 0},
		{"null max_tokens", openai.Chat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":null}`, 0, 0},
		{"completions", openai.Completions, `{"prompt":"x","max_tokens":3}`, 3, 0},
		{"completions token ids", openai.Completions, `{"prompt":[1,2,3]}`, 0, 0},
		{"n=1", openai.Chat, `{"messages":[{"role":"user","content":"hi"}],"n":1}`, 0, 0},
		{"n=2", openai.Chat, `{"messages":[{"role":"user","content":"hi"}],"n":2}`, 0, 400},
		{"negative max_tokens", openai.Completions, `{"prompt":"x","max_tokens":-1}`, 0, 400},
		{"null messages", openai.Chat, `{"messages":null}`, 0, 400},
		{"empty messages", openai.Chat, `{"messages":[ ]}`, 0, 400},
		{"missing prompt", openai.Completions, `{"max_tokens":3}`, 0, 400},
		{"not JSON", openai.Chat, `hello`, 0, 400},
		{"wrong type", openai.Chat, `{"messages":[],"stream":"yes"}`, 0, 400},
		{"stream options need stream", openai.Chat,
			`{"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, 0, 400},
		{"continuation", openai.Chat, `{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"He"}],` +
			`"continue_final_message":true,"add_generation_prompt":false,"max_tokens":4}`, 4, 0},
		{"continuation with the generation prompt", openai.Chat,
			`{"messages":[{"role":"assistant","content":"He"}],"continue_final_message":true}`, 0, 400},
		{"continuation of the user", openai.Chat, `{"messages":[{"role":"user","content":"hi"}],` +
			`"continue_final_message":true,"add_generation_prompt":false}`, 0, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, mt, err := parseRequest(tc.ep, []byte(tc.body))
			if tc.status == 0 {
				if err != nil || mt != tc.maxTokens {
					t.Errorf("got %d, %v; want %d", mt, err, tc.maxTokens)
				}
				return
			}
			br, ok := err.(*badRequest)
			if !ok || br.status != tc.status {
				t.Errorf("error %v, want status %d", err, tc.status)
			}
		})
	}
}

func TestWriteErrorShape(t *testing.T) {
	for status, typ := range map[int]string{400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
		503: "ServiceUnavailableError"} {
		rec := &recorder{header: http.Header{}}
		writeError(rec, status, "boom")
		want := `{"error":{"message":"boom","type":"` + typ + `","param":null,"code":` + strconv.Itoa(status) + `}}`
		if rec.status != status || strings.TrimSpace(rec.body.String()) != want {
			t.Errorf("%d: %d %s, want %s", status, rec.status, rec.body.String(), want)
		}
	}
}

func TestNonStreamBody(t *testing.T) {
	enc := newEncoder(true, "chatcmpl-x", 7, "m")
	got := string(enc.appendBody(nil, []byte("hi there"), 3, 2, 0))
	want := `{"id":"chatcmpl-x","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"hi there","tool_calls":[]},"logprobs":null,"finish_reason":"length",` +
		`"stop_reason":null}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,` +
		`"prompt_tokens_details":{"cached_tokens":0}}}` + "\n"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestTextIsDeterministic(t *testing.T) {
	a := string(AppendText(nil, 1, []byte("same"), 50))
	if b := string(AppendText(nil, 1, []byte("same"), 50)); a != b {
		t.Error("same seed and prompt gave different text")
	}
	if b := string(AppendText(nil, 2, []byte("same"), 50)); a == b {
		t.Error("another seed gave the same text")
	}
	if b := string(AppendText(nil, 1, []byte("other"), 50)); a == b {
		t.Error("another prompt gave the same text")
	}
	if b := string(AppendText(nil, 1, []byte("same"), 20)); !strings.HasPrefix(a, b) {
		t.Error("a shorter max_tokens is not a prefix of the longer text")
	}
	if strings.HasPrefix(a, " ") || strings.Count(a, " ") != 49 {
		t.Errorf("text %q: want 50 space-separated words", a)
	}
	for _, w := range words {
		if w == "" || strings.ContainsAny(w, "\"\\ ") {
			t.Errorf("word %q needs JSON escaping or is empty", w)
		}
	}
}

type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(p []byte) (int, error) { return r.body.Write(p) }
func (r *recorder) WriteHeader(s int)           { r.status = s }

// BenchmarkAppendChunk is the per-token encoding cost: it must not allocate.
func BenchmarkAppendChunk(b *testing.B) {
	enc := newEncoder(true, "chatcmpl-0123456789abcdef", 1767225600, "sim-model")
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for i := range b.N {
		buf = enc.appendToken(buf[:0], word(42, i), false)
	}
	if !bytes.Contains(buf, []byte(`"delta":{"content":`)) {
		b.Fatal("bad chunk")
	}
}

// BenchmarkParseRequest is the simulator's per-request parsing cost (encoding/json plus the canonical prompt):
// measured because the simulator may spend it, unlike the gateway.
func BenchmarkParseRequest(b *testing.B) {
	content := bytes.Repeat([]byte("The quick brown fox jumps over the lazy dog. "), 90) // ~1,000 tokens
	body := []byte(`{"model":"sim-model","stream":true,"max_tokens":500,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` +
		string(content) + `"}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for range b.N {
		if _, _, err := parseRequest(openai.Chat, body); err != nil {
			b.Fatal(err)
		}
		prompt, err := openai.AppendPrompt(nil, openai.Chat, body)
		if err != nil {
			b.Fatal(err)
		}
		_ = AppendBlockHashes(nil, prompt)
	}
}

func TestAppendChunkDoesNotAllocate(t *testing.T) {
	enc := newEncoder(false, "cmpl-1", 1, "m")
	buf := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		buf = enc.appendToken(buf[:0], word(7, 3), true)
		buf = enc.appendUsageChunk(buf, 10, 5, 0)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per chunk, want 0", allocs)
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`))
	f.Add([]byte(`{"prompt":["a","b"],"max_completion_tokens":2}`))
	f.Add([]byte(`{"messages":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ep := range []openai.Endpoint{openai.Chat, openai.Completions} {
			_, mt, err := parseRequest(ep, body)
			if err == nil && mt < 0 {
				t.Errorf("accepted max_tokens %d", mt)
			}
			if err != nil {
				if _, ok := err.(*badRequest); !ok {
					t.Errorf("error %v is not a client error", err)
				}
			}
		}
	})
}
