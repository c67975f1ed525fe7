package sim

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/openai"
)

func TestServeMessages(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.DefaultMaxTokens = 5; c.KVBlocks = 64 })
	tests := []struct {
		name, body string
		prompt     string // canonical
		n          int
		stop       string
	}{
		{"max_tokens reached", `{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`,
			"user:hi\n", 3, "max_tokens"},
		{"ends its turn", `{"max_tokens":500,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
			"system:be brief\nuser:hi\n", 5, "end_turn"},
		{"blocks", `{"max_tokens":2,"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user",` +
			`"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"c"},` +
			`{"role":"user","content":"d"}]}`, "system:sys\nuser:ab\nassistant:c\nuser:d\n", 2, "max_tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, b, http.MethodPost, "/v1/messages", tc.body)
			if status != 200 {
				t.Fatalf("%d %s", status, body)
			}
			var m struct {
				ID           string  `json:"id"`
				Type         string  `json:"type"`
				Role         string  `json:"role"`
				Model        string  `json:"model"`
				StopReason   string  `json:"stop_reason"`
				StopSequence *string `json:"stop_sequence"`
				Content      []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
				Usage struct {
					InputTokens  int `json:"input_tokens"`
					OutputTokens int `json:"output_tokens"`
				} `json:"usage"`
			}
			decode(t, body, &m)
			want := string(AppendText(nil, 1, []byte(tc.prompt), tc.n))
			if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "sim-model" ||
				m.StopReason != tc.stop || m.StopSequence != nil || len(m.Content) != 1 || m.Content[0].Type != "text" ||
				m.Content[0].Text != want || m.Usage.InputTokens != openai.EstimateTokens(len(tc.prompt)) ||
				m.Usage.OutputTokens != tc.n {
				t.Errorf("got %s\nwant text %q, stop_reason %s", body, want, tc.stop)
			}
		})
	}
	t.Run("stream", func(t *testing.T) {
		resp := post(t.Context(), t, b.URL()+"/v1/messages",
			[]byte(`{"max_tokens":2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		defer resp.Body.Close()
		events := readNamedEvents(t, resp.Body)
		seed := textSeed(1, []byte("user:hi\n"))
		want := []sseEvent{
			{"message_start", ""}, // checked below
			{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
			{"ping", `{"type":"ping"}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + word(seed, 0) + `"}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + word(seed, 1) + `"}}`},
			{"content_block_stop", `{"type":"content_block_stop","index":0}`},
			{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":2}}`},
			{"message_stop", `{"type":"message_stop"}`},
		}
		if len(events) != len(want) {
			t.Fatalf("%d events: %v", len(events), events)
		}
		for i, w := range want {
			if events[i].name != w.name || (w.data != "" && events[i].data != w.data) {
				t.Errorf("event %d = %+v, want %+v", i, events[i], w)
			}
		}
		var start struct {
			Type    string `json:"type"`
			Message struct {
				ID      string            `json:"id"`
				Role    string            `json:"role"`
				Content []json.RawMessage `json:"content"`
				Usage   struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
		}
		decode(t, events[0].data, &start)
		if start.Type != "message_start" || !strings.HasPrefix(start.Message.ID, "msg_") || start.Message.Role != "assistant" ||
			start.Message.Content == nil || start.Message.Usage.InputTokens != 2 {
			t.Errorf("message_start %s", events[0].data)
		}
	})
	errTests := []struct {
		name, method, body string
		status             int
		typ                string
	}{
		{"no max_tokens", "POST", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error"},
		{"max_tokens 0", "POST", `{"max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error"},
		{"no messages", "POST", `{"max_tokens":5}`, 400, "invalid_request_error"},
		{"empty messages", "POST", `{"max_tokens":5,"messages":[]}`, 400, "invalid_request_error"},
		{"bad role", "POST", `{"max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, 400, "invalid_request_error"},
		{"bad content", "POST", `{"max_tokens":5,"messages":[{"role":"user","content":5}]}`, 400, "invalid_request_error"},
		{"past the context", "POST", `{"max_tokens":2000,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{"bad JSON", "POST", `{"max_tokens":`, 400, "invalid_request_error"},
		{"unknown model", "POST", `{"model":"claude-9","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{"GET", "GET", ``, 405, "invalid_request_error"},
	}
	for _, tc := range errTests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, b, tc.method, "/v1/messages", tc.body)
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			decode(t, body, &e)
			if status != tc.status || e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message == "" {
				t.Errorf("%d %s, want %d %s", status, body, tc.status, tc.typ)
			}
		})
	}
	t.Run("end_turn counts as stop", func(t *testing.T) {
		if got := scrape(t, b, `vllm:request_success_total{finished_reason="stop",model_name="sim-model"}`); got != 1 {
			t.Errorf("finished_reason=stop %v, want 1 (the end_turn reply)", got)
		}
	})
}

// audioForm builds a multipart body with a file of n bytes and the given fields.
func audioForm(t *testing.T, n int, fields ...string) (body *bytes.Buffer, contentType string) {
	t.Helper()
	body = &bytes.Buffer{}
	mw := multipart.NewWriter(body)
	for i := 0; i+1 < len(fields); i += 2 {
		if err := mw.WriteField(fields[i], fields[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if n >= 0 {
		fw, err := mw.CreateFormFile("file", "clip.wav")
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i * 7)
		}
		fw.Write(data)
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return body, mw.FormDataContentType()
}

func postForm(t *testing.T, b *Backend, path string, body *bytes.Buffer, ct string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.URL()+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	return resp.StatusCode, out.String(), resp.Header
}

func TestServeAudio(t *testing.T) {
	b := startBackend(t, fastConfig)
	tests := []struct {
		name, path string
		size       int
		fields     []string
		status     int
		want       string // a prefix of the body
	}{
		{"transcription", "/v1/audio/transcriptions", 64000, []string{"model", "sim-model"}, 200, `{"text":"`},
		{"translation", "/v1/audio/translations", 64000, nil, 200, `{"text":"`},
		{"text format", "/v1/audio/transcriptions", 1000, []string{"response_format", "text", "language", "en"}, 200, ""},
		{"no file", "/v1/audio/transcriptions", -1, []string{"model", "sim-model"}, 400, `{"error":`},
		{"empty file", "/v1/audio/transcriptions", 0, nil, 400, `{"error":`},
		{"verbose_json", "/v1/audio/transcriptions", 10, []string{"response_format", "verbose_json"}, 400, `{"error":`},
		{"bad stream", "/v1/audio/transcriptions", 10, []string{"stream", "maybe"}, 400, `{"error":`},
		{"unknown model", "/v1/audio/transcriptions", 10, []string{"model", "whisper-9"}, 404, `{"error":`},
		{"too large", "/v1/audio/transcriptions", maxAudioBytes + 1, nil, 413, `{"error":`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body, ct := audioForm(t, tc.size, tc.fields...)
			status, out, _ := postForm(t, b, tc.path, body, ct)
			if status != tc.status || !strings.HasPrefix(out, tc.want) {
				t.Fatalf("%d %.200s, want %d %s...", status, out, tc.status, tc.want)
			}
		})
	}
	t.Run("deterministic from the file", func(t *testing.T) {
		get := func(path string, n int) string {
			body, ct := audioForm(t, n)
			_, out, _ := postForm(t, b, path, body, ct)
			var r struct {
				Text  string `json:"text"`
				Usage *struct {
					Type    string `json:"type"`
					Seconds int    `json:"seconds"`
				} `json:"usage"`
			}
			decode(t, out, &r)
			if path == "/v1/audio/transcriptions" && (r.Usage == nil || r.Usage.Type != "duration" ||
				r.Usage.Seconds != (n+audioBytesPerSecond-1)/audioBytesPerSecond) {
				t.Errorf("usage %s", out)
			}
			return r.Text
		}
		a := get("/v1/audio/transcriptions", 64000)
		if a != get("/v1/audio/transcriptions", 64000) || a == get("/v1/audio/transcriptions", 64001) ||
			a == get("/v1/audio/translations", 64000) || strings.Count(a, " ")+1 != 5 {
			t.Errorf("transcript %q: want 5 words (2 s), the same for the same file only", a)
		}
	})
	t.Run("stream", func(t *testing.T) {
		body, ct := audioForm(t, 32000, "stream", "true")
		status, out, h := postForm(t, b, "/v1/audio/transcriptions", body, ct)
		events, err := readEvents(strings.NewReader(out))
		if err != nil || status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") ||
			len(events) != 3 || events[2].data != "[DONE]" {
			t.Fatalf("%d %v %s", status, err, out)
		}
		for i, ev := range events[:2] {
			var c struct {
				Object  string `json:"object"`
				Choices []struct {
					Delta        struct{ Content string } `json:"delta"`
					FinishReason *string                  `json:"finish_reason"`
				} `json:"choices"`
			}
			decode(t, ev.data, &c)
			last := i == 1
			if c.Object != "transcription.chunk" || len(c.Choices) != 1 || c.Choices[0].Delta.Content == "" ||
				(c.Choices[0].FinishReason != nil) != last {
				t.Errorf("chunk %d %s", i, ev.data)
			}
		}
	})
	t.Run("wrong method", func(t *testing.T) {
		if status, _ := call(t, b, http.MethodGet, "/v1/audio/translations", ""); status != 405 {
			t.Errorf("status %d", status)
		}
	})
}

func TestNewEndpointsWhileDown(t *testing.T) {
	b := startBackend(t, fastConfig)
	if err := b.SetFaults(Faults{Slowdown: 1, Down: true}); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ path, body, want string }{
		{"/v1/embeddings", `{"input":"x"}`, `"type":"ServiceUnavailableError"`},
		{"/v1/rerank", `{"query":"x","documents":["x"]}`, `"type":"ServiceUnavailableError"`},
		{"/v1/responses", `{"input":"x"}`, `"type":"ServiceUnavailableError"`},
		{"/v1/messages", `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, `"type":"overloaded_error"`},
		{"/tokenize", `{"prompt":"x"}`, `"type":"ServiceUnavailableError"`},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			if status, body := call(t, b, http.MethodPost, tc.path, tc.body); status != 503 || !strings.Contains(body, tc.want) {
				t.Errorf("%d %s, want 503 with %s", status, body, tc.want)
			}
		})
	}
}
