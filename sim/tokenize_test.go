package sim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/openai"
)

// call posts body to path on b and returns the status and the body read whole.
func call(t *testing.T, b *Backend, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

// decode unmarshals body into v or fails the test.
func decode(t *testing.T, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%v in %s", err, body)
	}
}

func TestTokenIDsRoundTrip(t *testing.T) {
	for _, text := range []string{"", "a", "ab", "abc", "abcd", "hello world", "\x00\x00\x00\x00\x00", "naïve café ☕"} {
		t.Run(text, func(t *testing.T) {
			ids := appendTokenIDs(nil, []byte(text))
			if len(ids) != openai.EstimateTokens(len(text)) {
				t.Errorf("%d ids, want %d", len(ids), openai.EstimateTokens(len(text)))
			}
			back, err := appendDetokenized(nil, ids)
			if err != nil || string(back) != text {
				t.Errorf("round trip gave %q, %v", back, err)
			}
			for _, id := range ids {
				if id < 0 || id > maxTokenID {
					t.Errorf("id %d out of range", id)
				}
			}
		})
	}
	for _, bad := range []int64{-1, maxTokenID + 1, partialToken, partialToken | 4<<24, partialToken | 1<<24 | 0x100} {
		if _, err := appendDetokenized(nil, []int64{bad}); err == nil {
			t.Errorf("id %d accepted", bad)
		}
	}
}

func TestServeTokenize(t *testing.T) {
	b := startBackend(t, fastConfig)
	chat := `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}]}`
	tests := []struct {
		name, path, body string
		status           int
		count            int    // for /tokenize
		prompt           string // for /detokenize
	}{
		{"prompt", "/tokenize", `{"model":"sim-model","prompt":"Once upon a time","add_special_tokens":true}`, 200, 4, ""},
		{"empty prompt", "/tokenize", `{"prompt":""}`, 200, 0, ""},
		{"messages as chat counts them", "/tokenize", chat, 200, 5, ""}, // "user:hello there\n" is 17 bytes
		{"detokenize", "/detokenize", `{"model":"sim-model","tokens":[543515502,1852797045,4328546592]}`, 200, 0, "nce upon a"},
		{"both prompt and messages", "/tokenize", `{"prompt":"x","messages":[{"role":"user","content":"y"}]}`, 400, 0, ""},
		{"neither", "/tokenize", `{"model":"sim-model"}`, 400, 0, ""},
		{"bad JSON", "/tokenize", `{"prompt":`, 400, 0, ""},
		{"unknown model", "/tokenize", `{"model":"gpt-9","prompt":"x"}`, 404, 0, ""},
		{"no tokens", "/detokenize", `{"model":"sim-model"}`, 400, 0, ""},
		{"not a token", "/detokenize", `{"tokens":[-5]}`, 400, 0, ""},
		{"GET", "/tokenize", ``, 405, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := http.MethodPost
			if tc.status == 405 {
				method = http.MethodGet
			}
			status, body := call(t, b, method, tc.path, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if status != 200 {
				var e apiError
				decode(t, body, &e)
				if e.Error.Code != status || e.Error.Message == "" {
					t.Errorf("error body %s", body)
				}
				return
			}
			if tc.path == "/detokenize" {
				var d struct{ Prompt string }
				decode(t, body, &d)
				if d.Prompt != tc.prompt {
					t.Errorf("prompt %q, want %q", d.Prompt, tc.prompt)
				}
				return
			}
			var tok struct {
				Count       int     `json:"count"`
				MaxModelLen int     `json:"max_model_len"`
				Tokens      []int64 `json:"tokens"`
			}
			decode(t, body, &tok)
			if tok.Count != tc.count || len(tok.Tokens) != tc.count || tok.MaxModelLen != 8192*16 {
				t.Errorf("got %s, want count %d", body, tc.count)
			}
		})
	}
	// tokenize then detokenize gives the text back, and the count is the prompt_tokens chat reports.
	_, body := call(t, b, http.MethodPost, "/tokenize", chat)
	var tok struct{ Tokens []int64 }
	decode(t, body, &tok)
	ids, _ := json.Marshal(map[string]any{"tokens": tok.Tokens})
	_, body = call(t, b, http.MethodPost, "/detokenize", string(ids))
	if !strings.Contains(body, `"prompt":"user:hello there\n"`) {
		t.Errorf("detokenize gave %s", body)
	}
	_, body = call(t, b, http.MethodPost, "/v1/chat/completions", `{"max_tokens":1,`+chat[1:])
	if !bytes.Contains([]byte(body), []byte(`"prompt_tokens":5,`)) {
		t.Errorf("chat usage %s, want prompt_tokens 5 as /tokenize counts", body)
	}
}
