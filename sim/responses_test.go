package sim

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/openai"
)

// sseEvent is one named SSE event.
type sseEvent struct{ name, data string }

// readNamedEvents reads "event: X\ndata: Y\n\n" events until the body ends.
func readNamedEvents(t *testing.T, body io.Reader) []sseEvent {
	t.Helper()
	var events []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[len("data: "):]
		case line == "":
			events = append(events, cur)
			cur = sseEvent{}
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

type responseJSON struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	CreatedAt          int64   `json:"created_at"`
	Model              string  `json:"model"`
	Status             string  `json:"status"`
	PreviousResponseID *string `json:"previous_response_id"`
	Output             []struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type        string            `json:"type"`
			Text        string            `json:"text"`
			Annotations []json.RawMessage `json:"annotations"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens *int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int `json:"total_tokens"`
	} `json:"usage"`
}

// text checks r is a completed one-message response and returns its text.
func (r *responseJSON) text(t *testing.T) string {
	t.Helper()
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || r.Status != "completed" || r.Model != "sim-model" ||
		len(r.Output) != 1 || r.Output[0].Type != "message" || !strings.HasPrefix(r.Output[0].ID, "msg_") ||
		r.Output[0].Role != "assistant" || r.Output[0].Status != "completed" || len(r.Output[0].Content) != 1 ||
		r.Output[0].Content[0].Type != "output_text" || r.Output[0].Content[0].Annotations == nil || r.Usage == nil ||
		r.Usage.OutputTokensDetails.ReasoningTokens == nil ||
		r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Fatalf("not a completed response: %+v", r)
	}
	return r.Output[0].Content[0].Text
}

func TestServeResponses(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.KVBlocks = 256 })
	tests := []struct {
		name, body string
		prompt     string // the canonical prompt
		n          int
	}{
		{"string input", `{"model":"sim-model","input":"hello there","max_output_tokens":4}`, "user:hello there\n", 4},
		{"instructions and parts", `{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],` +
			`"instructions":"be brief","max_output_tokens":2}`, "instructions:be brief\nuser:hi\n", 2},
		{"other items as raw JSON", `{"input":[{"role":"user","content":"a"},{"type":"function_call_output","call_id":"c1","output":"o"}],` +
			`"max_output_tokens":1}`, "user:a\n" + `{"type":"function_call_output","call_id":"c1","output":"o"}` + "\n", 1},
		{"messages", `{"input":[{"type":"message","role":"user","content":"a"},{"role":"assistant","content":"b"},` +
			`{"role":"user","content":"c"}],"max_output_tokens":3,"store":false}`, "user:a\nassistant:b\nuser:c\n", 3},
		{"default length", `{"input":"x"}`, "user:x\n", 256},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, b, http.MethodPost, "/v1/responses", tc.body)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			var r responseJSON
			decode(t, body, &r)
			// The same words as a chat completion of the same conversation.
			if got, want := r.text(t), string(AppendText(nil, 1, []byte(tc.prompt), tc.n)); got != want {
				t.Errorf("text %q, want %q", got, want)
			}
			if r.Usage.InputTokens != openai.EstimateTokens(len(tc.prompt)) || r.Usage.OutputTokens != tc.n {
				t.Errorf("usage %+v", *r.Usage)
			}
		})
	}
}

func TestServeResponsesStream(t *testing.T) {
	b := startBackend(t, fastConfig)
	resp := post(t.Context(), t, b.URL()+"/v1/responses",
		[]byte(`{"model":"sim-model","input":"hello there","max_output_tokens":3,"stream":true}`))
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	events := readNamedEvents(t, resp.Body)
	want := []string{"response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done",
		"response.output_item.done", "response.completed"}
	if len(events) != len(want) {
		t.Fatalf("%d events, want %d: %v", len(events), len(want), events)
	}
	seed := textSeed(1, []byte("user:hello there\n"))
	var text strings.Builder
	for i, ev := range events {
		var e struct {
			Type           string          `json:"type"`
			SequenceNumber int             `json:"sequence_number"`
			ItemID         string          `json:"item_id"`
			Delta          string          `json:"delta"`
			Text           string          `json:"text"`
			Response       json.RawMessage `json:"response"`
		}
		decode(t, ev.data, &e)
		if ev.name != want[i] || e.Type != want[i] || e.SequenceNumber != i {
			t.Errorf("event %d: %s %s, want %s with sequence_number %d", i, ev.name, ev.data, want[i], i)
		}
		switch e.Type {
		case "response.output_text.delta":
			if e.Delta != word(seed, i-4) || !strings.HasPrefix(e.ItemID, "msg_") {
				t.Errorf("delta %s", ev.data)
			}
			text.WriteString(e.Delta)
		case "response.output_text.done":
			if e.Text != text.String() {
				t.Errorf("done text %q, want %q", e.Text, text.String())
			}
		case "response.created", "response.in_progress":
			var r responseJSON
			decode(t, string(e.Response), &r)
			if r.Status != "in_progress" || r.Usage != nil || len(r.Output) != 0 {
				t.Errorf("%s carries %s", e.Type, e.Response)
			}
		case "response.completed":
			var r responseJSON
			decode(t, string(e.Response), &r)
			if r.text(t) != text.String() || r.Usage.OutputTokens != 3 || r.Usage.InputTokens != 5 {
				t.Errorf("completed %s", e.Response)
			}
			// Stored: GET returns the same object.
			status, body := call(t, b, http.MethodGet, "/v1/responses/"+r.ID, "")
			if status != 200 || strings.TrimSpace(body) != string(e.Response) {
				t.Errorf("GET %s: %d\n%s\nwant %s", r.ID, status, body, e.Response)
			}
		}
	}
}

func TestServeResponsesConversation(t *testing.T) {
	b := startBackend(t, fastConfig)
	first := `{"input":"` + strings.Repeat("tell me a long story ", 8) + `","max_output_tokens":20}`
	_, body := call(t, b, http.MethodPost, "/v1/responses", first)
	var r1 responseJSON
	decode(t, body, &r1)
	text1 := r1.text(t)
	_, body = call(t, b, http.MethodPost, "/v1/responses",
		`{"input":"and then?","max_output_tokens":2,"previous_response_id":"`+r1.ID+`"}`)
	var r2 responseJSON
	decode(t, body, &r2)
	// The second prompt is the first conversation, its answer and the new turn: the cache holds its prefix.
	prompt := "user:" + strings.Repeat("tell me a long story ", 8) + "\nassistant:" + text1 + "\nuser:and then?\n"
	if got, want := r2.text(t), string(AppendText(nil, 1, []byte(prompt), 2)); got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	if r2.Usage.InputTokens != openai.EstimateTokens(len(prompt)) || r2.Usage.InputTokensDetails.CachedTokens < 32 ||
		r2.PreviousResponseID == nil || *r2.PreviousResponseID != r1.ID {
		t.Errorf("second turn %s", body)
	}
	notFound := `{"error":{"message":"Response with id 'resp_nope' not found.","type":"invalid_request_error","param":null,"code":null}}`
	tests := []struct {
		name, method, path, body string
		status                   int
		want                     string // the whole body, when set
	}{
		{"GET unknown", "GET", "/v1/responses/resp_nope", "", 404, notFound},
		{"unknown previous", "POST", "/v1/responses", `{"input":"x","previous_response_id":"resp_nope"}`, 404, notFound},
		{"cancel unknown", "POST", "/v1/responses/resp_nope/cancel", "", 404, notFound},
		{"cancel completed", "POST", "/v1/responses/" + r1.ID + "/cancel", "", 400,
			`{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":null,"code":null}}`},
		{"store false is not stored", "GET", "/v1/responses/" + storeFalse(t, b), "", 404, ""},
		{"missing input", "POST", "/v1/responses", `{"model":"sim-model"}`, 400, ""},
		{"empty input", "POST", "/v1/responses", `{"input":[]}`, 400, ""},
		{"item without role", "POST", "/v1/responses", `{"input":[{"type":"message","content":"x"}]}`, 400, ""},
		{"bad content", "POST", "/v1/responses", `{"input":[{"role":"user","content":5}]}`, 400, ""},
		{"max_output_tokens 0", "POST", "/v1/responses", `{"input":"x","max_output_tokens":0}`, 400, ""},
		{"past the context", "POST", "/v1/responses", `{"input":"x","max_output_tokens":200000}`, 400, ""},
		{"background stream", "POST", "/v1/responses", `{"input":"x","background":true,"stream":true}`, 400, ""},
		{"background without store", "POST", "/v1/responses", `{"input":"x","background":true,"store":false}`, 400, ""},
		{"bad JSON", "POST", "/v1/responses", `{"input":`, 400, ""},
		{"unknown model", "POST", "/v1/responses", `{"model":"gpt-9","input":"x"}`, 404, ""},
		{"GET create", "GET", "/v1/responses", "", 405, ""},
		{"POST retrieve", "POST", "/v1/responses/" + r1.ID, "", 405, ""},
		{"GET cancel", "GET", "/v1/responses/" + r1.ID + "/cancel", "", 405, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, b, tc.method, tc.path, tc.body)
			if status != tc.status || (tc.want != "" && strings.TrimSpace(body) != tc.want) {
				t.Errorf("%d %s, want %d %s", status, body, tc.status, tc.want)
			}
			var e struct {
				Error struct{ Message, Type string } `json:"error"`
			}
			decode(t, body, &e)
			if e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("error body %s", body)
			}
		})
	}
}

func storeFalse(t *testing.T, b *Backend) string {
	_, body := call(t, b, http.MethodPost, "/v1/responses", `{"input":"x","max_output_tokens":1,"store":false}`)
	var r responseJSON
	decode(t, body, &r)
	return r.ID
}

// waitStatus polls GET /v1/responses/{id} until its status is want (a state to reach, not a time to wait).
func waitStatus(t *testing.T, b *Backend, id, want string) responseJSON {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := call(t, b, http.MethodGet, "/v1/responses/"+id, "")
		var r responseJSON
		decode(t, body, &r)
		if r.Status == want {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %q, want %q: %s", r.Status, want, body)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestServeResponsesBackground(t *testing.T) {
	b := startBackend(t, fastConfig)
	t.Run("runs to completion", func(t *testing.T) {
		status, body := call(t, b, http.MethodPost, "/v1/responses", `{"input":"hello","max_output_tokens":3,"background":true}`)
		var r responseJSON
		decode(t, body, &r)
		if status != 200 || r.Status != "queued" || r.Usage != nil {
			t.Fatalf("%d %s", status, body)
		}
		done := waitStatus(t, b, r.ID, "completed")
		if got, want := done.text(t), string(AppendText(nil, 1, []byte("user:hello\n"), 3)); got != want {
			t.Errorf("text %q, want %q", got, want)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		aborts := scrape(t, b, `vllm:request_success_total{finished_reason="abort",model_name="sim-model"}`)
		_, body := call(t, b, http.MethodPost, "/v1/responses", `{"input":"hello","max_output_tokens":100000,"background":true}`)
		var r responseJSON
		decode(t, body, &r)
		status, body := call(t, b, http.MethodPost, "/v1/responses/"+r.ID+"/cancel", "")
		var c responseJSON
		decode(t, body, &c)
		if status != 200 || c.Status != "cancelled" || c.ID != r.ID {
			t.Fatalf("cancel: %d %s", status, body)
		}
		if got := scrape(t, b, `vllm:request_success_total{finished_reason="abort",model_name="sim-model"}`); got != aborts+1 {
			t.Errorf("aborts %v, want %v: the sequence was not aborted", got, aborts+1)
		}
		waitStatus(t, b, r.ID, "cancelled")
		if status, _ := call(t, b, http.MethodPost, "/v1/responses/"+r.ID+"/cancel", ""); status != 400 {
			t.Errorf("second cancel: %d, want 400", status)
		}
	})
	t.Run("close ends a running one", func(t *testing.T) {
		b := startBackend(t, fastConfig)
		call(t, b, http.MethodPost, "/v1/responses", `{"input":"hello","max_output_tokens":100000,"background":true}`)
		if err := b.Close(); err != nil { // returns only after the background goroutine has
			t.Fatal(err)
		}
	})
}

func TestResponseStoreIsBounded(t *testing.T) {
	st := newResponseStore()
	for i := range maxStoredResponses + 10 {
		st.put(&storedResponse{obj: responseObject{ID: "resp_" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}})
	}
	if len(st.byID) != maxStoredResponses || len(st.order) != maxStoredResponses {
		t.Errorf("%d stored, %d in order; want %d", len(st.byID), len(st.order), maxStoredResponses)
	}
	if st.update("resp_a", func(*storedResponse) {}) {
		t.Error("the oldest response was not evicted")
	}
	big := &storedResponse{obj: responseObject{ID: "resp_big"}, conv: make([]byte, maxStoredBytes/2)}
	st.put(big)
	st.put(&storedResponse{obj: responseObject{ID: "resp_big2"}, conv: make([]byte, maxStoredBytes/2)})
	if st.bytes > maxStoredBytes || st.update("resp_big", func(*storedResponse) {}) {
		t.Errorf("%d bytes stored (bound %d); the first big response should be evicted", st.bytes, maxStoredBytes)
	}
}
