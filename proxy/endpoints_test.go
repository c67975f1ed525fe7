package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// Every endpoint of the route table, end to end: the real gateway in front of real simulators over loopback,
// with the official openai-go client wherever it has the call.

func fastSim(t *testing.T, name string) *sim.Backend {
	return startSim(t, name, func(c *sim.Config) { c.ITL = time.Millisecond; c.EmbeddingDim = 16 })
}

func allEndpoints(snap *Snapshot) *Snapshot {
	for _, m := range snap.Models {
		m.Endpoints = AllEndpoints
	}
	return snap
}

func TestEmbeddingsThroughGateway(t *testing.T) {
	t.Parallel()
	be := fastSim(t, "a")
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 1, be.URL()), Options{})
	ctx := context.Background()
	params := oai.EmbeddingNewParams{Model: "sim-model", Input: oai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"red apples", "green pears"}}}
	direct, via := sdk(be.URL()), sdk(gw.url)
	want, err := direct.Embeddings.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	got, err := via.Embeddings.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Data) != 2 || len(got.Data[0].Embedding) != 16 {
		t.Fatalf("got %d vectors of %d", len(got.Data), len(got.Data[0].Embedding))
	}
	for i := range want.Data {
		for j := range want.Data[i].Embedding {
			if got.Data[i].Embedding[j] != want.Data[i].Embedding[j] {
				t.Fatalf("vector %d differs at %d", i, j)
			}
		}
	}
	if got.Usage.PromptTokens != want.Usage.PromptTokens || got.Usage.PromptTokens == 0 {
		t.Errorf("usage %+v, want %+v", got.Usage, want.Usage)
	}
}

func responseParams(input string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model:           "sim-model",
		Input:           responses.ResponseNewParamsInputUnion{OfString: oai.String(input)},
		MaxOutputTokens: oai.Int(8),
	}
}

// TestResponsesThroughGateway: the Responses API, streaming and not, answers as the engine does, and its first
// tokens are measured.
func TestResponsesThroughGateway(t *testing.T) {
	t.Parallel()
	be := fastSim(t, "a")
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 1, be.URL()), Options{})
	ctx := context.Background()
	direct, via := sdk(be.URL()), sdk(gw.url)

	want, err := direct.Responses.New(ctx, responseParams("tell me about water"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := via.Responses.New(ctx, responseParams("tell me about water"))
	if err != nil {
		t.Fatal(err)
	}
	if got.OutputText() == "" || got.OutputText() != want.OutputText() || got.Status != "completed" {
		t.Errorf("non-streaming: %q (%s), want %q", got.OutputText(), got.Status, want.OutputText())
	}
	if got.Usage.OutputTokens != 8 || got.Usage.InputTokens != want.Usage.InputTokens {
		t.Errorf("usage %+v, want %+v", got.Usage, want.Usage)
	}
	if !strings.HasPrefix(got.ID, "resp") {
		t.Errorf("id %q", got.ID)
	}

	st := via.Responses.NewStreaming(ctx, responseParams("tell me about water"))
	var text strings.Builder
	var types []string
	for st.Next() {
		ev := st.Current()
		types = append(types, ev.Type)
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != want.OutputText() {
		t.Errorf("streamed text %q, want %q", text.String(), want.OutputText())
	}
	if len(types) == 0 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
		t.Errorf("event types %v", types)
	}
	if n := histogram(t, gw.reg, "gen_ai_server_time_to_first_token_seconds").GetSampleCount(); n != 2 {
		t.Errorf("%d first tokens measured, want 2 (one per generated response)", n)
	}
}

// TestStoredResponsesStayOnTheirBackend: with two backends, every follow-up of a stored response (GET, a new
// response continuing it, cancel, DELETE) goes to the backend that made it, also after the gateway forgot it.
func TestStoredResponsesStayOnTheirBackend(t *testing.T) {
	t.Parallel()
	a, b := fastSim(t, "a"), fastSim(t, "b")
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 1, a.URL(), b.URL()), Options{})
	ctx := context.Background()
	via := sdk(gw.url)
	var hdr http.Header
	first, err := via.Responses.New(ctx, responseParams("remember the blue door"), captureHeader(&hdr))
	if err != nil {
		t.Fatal(err)
	}
	home := hdr.Get("X-Switchyard-Backend")
	for i := range 4 { // round robin would alternate; the stored response pins them
		var h http.Header
		got, err := via.Responses.Get(ctx, first.ID, responses.ResponseGetParams{}, captureHeader(&h))
		if err != nil {
			t.Fatalf("GET %d: %v", i, err)
		}
		if got.ID != first.ID || h.Get("X-Switchyard-Backend") != home {
			t.Errorf("GET %d: id %s from %s, want %s from %s", i, got.ID, h.Get("X-Switchyard-Backend"), first.ID, home)
		}
		p := responseParams("and what colour was it?")
		p.PreviousResponseID = oai.String(first.ID)
		next, err := via.Responses.New(ctx, p, captureHeader(&h))
		if err != nil {
			t.Fatalf("follow-up %d: %v", i, err)
		}
		if h.Get("X-Switchyard-Backend") != home || next.OutputText() == "" {
			t.Errorf("follow-up %d served by %s, want %s", i, h.Get("X-Switchyard-Backend"), home)
		}
	}

	gw.s.homes.forget([]byte(first.ID)) // as after a restart, or on another replica
	var h http.Header
	if _, err := via.Responses.Get(ctx, first.ID, responses.ResponseGetParams{}, captureHeader(&h)); err != nil || h.Get("X-Switchyard-Backend") != home {
		t.Errorf("GET after the table forgot it: %v, from %s, want %s", err, h.Get("X-Switchyard-Backend"), home)
	}

	_, err = via.Responses.Get(ctx, "resp_nobody_has_this", responses.ResponseGetParams{})
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, "resp_nobody_has_this") {
		t.Errorf("unknown id: %v, want a 404 naming it", err)
	}
	p := responseParams("continue")
	p.PreviousResponseID = oai.String("resp_nobody_has_this")
	_, err = via.Responses.New(ctx, p)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "previous_response_id" {
		t.Errorf("unknown previous_response_id: %v, want a 404 on previous_response_id", err)
	}

	if err := via.Responses.Delete(ctx, first.ID); err != nil {
		// The simulator may not implement DELETE; the gateway must still pass the engine's answer on intact.
		if !errors.As(err, &apiErr) || apiErr.StatusCode/100 != 4 {
			t.Errorf("DELETE: %v", err)
		}
	}
}

// TestFindResponseOwnsItsPath: the search for a stored response returns at the first backend that holds it,
// while the others are still being asked; those questions must not read the caller's id, which belongs to an
// exchange that is reused once its request ends (under -race, reading it is a data race, as CI once found).
func TestFindResponseOwnsItsPath(t *testing.T) {
	t.Parallel()
	const id = "resp_kept"
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/responses/"+id {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, `{"id":"`+id+`","object":"response"}`)
	}))
	defer fast.Close()
	asked := make(chan string, 16)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/responses/") {
			time.Sleep(20 * time.Millisecond) // answers after the fast backend has
			asked <- r.URL.Path
		}
		http.NotFound(w, r)
	}))
	defer slow.Close()
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 1, fast.URL, slow.URL), Options{})
	snap := gw.s.src.Snapshot()

	for range 20 { // the race needs a question still out when the search returns; it is not there every time
		buf := []byte(id)
		b := gw.s.findResponse(buf, snap.Backends)
		copy(buf, "XXXXXXXXX") // as the next request to use the exchange would
		if b == nil || b.Name() != "b0" {
			t.Fatalf("found on %v, want b0", b)
		}
		select {
		case p := <-asked:
			if p != "/v1/responses/"+id {
				t.Fatalf("the slow backend was asked for %s, want /v1/responses/%s", p, id)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the slow backend was never asked")
		}
	}
}

// captureHeader records the response headers of a call.
func captureHeader(dst *http.Header) option.RequestOption {
	return option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		resp, err := next(r)
		if resp != nil {
			*dst = resp.Header.Clone()
		}
		return resp, err
	})
}

// TestMessagesThroughGateway: Anthropic's Messages API, streaming and not, through the gateway as the engine
// answers it; gateway errors in Anthropic's shape.
func TestMessagesThroughGateway(t *testing.T) {
	t.Parallel()
	be := fastSim(t, "a")
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 1, be.URL()), Options{})
	body := `{"model":"sim-model","max_tokens":6,"system":"be brief","messages":[{"role":"user","content":"hello there"}]}`
	_, want := rawPost(t, be.URL(), "/v1/messages", []byte(body), nil)
	resp, got := rawPost(t, gw.url, "/v1/messages", []byte(body), nil)
	if resp.StatusCode != 200 || maskIDs(got) != maskIDs(want) {
		t.Errorf("non-streaming: %d\n got %s\nwant %s", resp.StatusCode, got, want)
	}
	stream := strings.Replace(body, `"max_tokens":6`, `"max_tokens":6,"stream":true`, 1)
	_, want = rawPost(t, be.URL(), "/v1/messages", []byte(stream), nil)
	resp, got = rawPost(t, gw.url, "/v1/messages", []byte(stream), nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || maskIDs(got) != maskIDs(want) {
		t.Errorf("streaming: %d %q\n got %s\nwant %s", resp.StatusCode, resp.Header.Get("Content-Type"), got, want)
	}
	if !bytes.Contains(got, []byte("event: message_stop")) {
		t.Errorf("stream without message_stop: %s", got)
	}
	resp, got = rawPost(t, gw.url, "/v1/messages", []byte(`{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`), nil)
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if resp.StatusCode != 404 || json.Unmarshal(got, &e) != nil || e.Type != "error" || e.Error.Type != "not_found_error" {
		t.Errorf("unknown model: %d %s, want Anthropic's not_found_error", resp.StatusCode, got)
	}
	if n := histogram(t, gw.reg, "gen_ai_server_time_to_first_token_seconds").GetSampleCount(); n != 1 {
		t.Errorf("%d first tokens measured, want 1 (the streamed message)", n)
	}
}

// TestEngineEndpointsThroughGateway: tokenize, detokenize, rerank, score, /v2/embed and audio through the
// gateway equal the engine's own answers.
func TestEngineEndpointsThroughGateway(t *testing.T) {
	t.Parallel()
	be := fastSim(t, "a")
	gw := startGateway(t, allEndpoints(snapshotOf(&routing.RoundRobin{}, 1, be.URL())), Options{})
	for _, tc := range []struct{ path, body string }{
		{"/tokenize", `{"model":"sim-model","prompt":"hello world, how are you"}`},
		{"/detokenize", `{"model":"sim-model","tokens":[1819043176]}`},
		{"/v1/rerank", `{"model":"sim-model","query":"red fruit","documents":["red apples","blue sky"],"top_n":1}`},
		{"/rerank", `{"model":"sim-model","query":"red fruit","documents":["red apples","blue sky"]}`},
		{"/v1/score", `{"model":"sim-model","text_1":"red fruit","text_2":["red apples","blue sky"]}`},
		{"/v2/embed", `{"model":"sim-model","texts":["red apples"],"input_type":"search_document","embedding_types":["float"]}`},
		{"/v1/tokenize/unknown", `{"model":"sim-model"}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			wantResp, want := rawPost(t, be.URL(), tc.path, []byte(tc.body), nil)
			resp, got := rawPost(t, gw.url, tc.path, []byte(tc.body), nil)
			if tc.path == "/v1/tokenize/unknown" {
				if resp.StatusCode != 404 {
					t.Errorf("%d %s", resp.StatusCode, got)
				}
				return
			}
			if resp.StatusCode != wantResp.StatusCode || maskIDs(got) != maskIDs(want) {
				t.Errorf("%d %s\nwant %d %s", resp.StatusCode, got, wantResp.StatusCode, want)
			}
		})
	}
	t.Run("audio", func(t *testing.T) {
		ct, body := form(t, map[string]string{"model": "sim-model"})
		_, want := rawPost(t, be.URL(), "/v1/audio/transcriptions", body, map[string]string{"Content-Type": ct})
		resp, got := rawPost(t, gw.url, "/v1/audio/transcriptions", body, map[string]string{"Content-Type": ct})
		if resp.StatusCode != 200 || maskIDs(got) != maskIDs(want) {
			t.Errorf("%d %s\nwant %s", resp.StatusCode, got, want)
		}
	})
}

// TestNonStreamingAnswerKeepsUnknownFields: the gateway streams from the engine to measure it and assembles
// the answer for a client that did not stream; every member the engine sent, at every level, arrives with its
// value byte for byte (issue 13's ten unknown fields).
func TestNonStreamingAnswerKeepsUnknownFields(t *testing.T) {
	t.Parallel()
	chunks := []string{
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"sim-model","service_tier":"priority","kv_transfer_params":{"remote_block_ids":[1, 2],"do_remote_decode":false},"choices":[{"index":0,"delta":{"role":"assistant","content":"","annotations":[{"type":"url_citation","url":"https://x"}]},"logprobs":null,"finish_reason":null,"x_choice":{"a" : 1}}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"sim-model","prompt_logprobs":[null,{"42":{"logprob":-0.5}}],"choices":[{"index":0,"delta":{"content":"Hel","audio":{"id":"au_1","data":"AAA","transcript":"Hel"}},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{"content":"lo","audio":{"data":"BBB","transcript":"lo","expires_at":99}},"logprobs":null,"finish_reason":"stop","stop_reason":128009}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"sim-model","system_fingerprint":"fp_9","x_top":[true,{"deep":"v"}],"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0},"x_usage":7}}`,
	}
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			_, _ = io.WriteString(w, "data: "+c+"\n\n")
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(be.Close)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, be.URL), Options{})
	resp, body := rawPost(t, gw.url, "/v1/chat/completions", []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	var choices []map[string]json.RawMessage
	_ = json.Unmarshal(got["choices"], &choices)
	if len(choices) != 1 {
		t.Fatalf("choices: %s", got["choices"])
	}
	var msg, usage map[string]json.RawMessage
	_ = json.Unmarshal(choices[0]["message"], &msg)
	_ = json.Unmarshal(got["usage"], &usage)
	for _, tc := range []struct {
		where string
		m     map[string]json.RawMessage
		key   string
		want  string
	}{
		{"top", got, "service_tier", `"priority"`},
		{"top", got, "kv_transfer_params", `{"remote_block_ids":[1, 2],"do_remote_decode":false}`},
		{"top", got, "prompt_logprobs", `[null,{"42":{"logprob":-0.5}}]`},
		{"top", got, "system_fingerprint", `"fp_9"`},
		{"top", got, "x_top", `[true,{"deep":"v"}]`},
		{"choice", choices[0], "x_choice", `{"a" : 1}`},
		{"choice", choices[0], "stop_reason", `128009`},
		{"message", msg, "annotations", `[{"type":"url_citation","url":"https://x"}]`},
		{"message", msg, "audio", `{"id":"au_1","data":"AAABBB","transcript":"Hello","expires_at":99}`},
		{"usage", usage, "prompt_tokens_details", `{"cached_tokens":1,"audio_tokens":0}`},
		{"usage", usage, "completion_tokens_details", `{"reasoning_tokens":0}`},
		{"usage", usage, "x_usage", `7`},
		{"message", msg, "content", `"Hello"`},
	} {
		if v := string(tc.m[tc.key]); v != tc.want {
			t.Errorf("%s.%s = %s, want %s", tc.where, tc.key, v, tc.want)
		}
	}
}

// TestResponseCancelAndAudioStream: a background response cancelled through the gateway reaches the engine that
// runs it, and a streamed transcription comes through event by event, measured.
func TestResponseCancelAndAudioStream(t *testing.T) {
	t.Parallel()
	a := startSim(t, "a", func(c *sim.Config) { c.ITL = 20 * time.Millisecond })
	b := startSim(t, "b", func(c *sim.Config) { c.ITL = 20 * time.Millisecond })
	gw := startGateway(t, allEndpoints(snapshotOf(&routing.RoundRobin{}, 1, a.URL(), b.URL())), Options{})
	ctx := context.Background()
	via := sdk(gw.url)
	p := responseParams("a long story")
	p.MaxOutputTokens = oai.Int(2000)
	p.Background = oai.Bool(true)
	started, err := via.Responses.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if started.Status != "queued" && started.Status != "in_progress" {
		t.Fatalf("background response: status %s", started.Status)
	}
	for range 3 { // round robin would send every other call elsewhere
		cancelled, err := via.Responses.Cancel(ctx, started.ID)
		if err != nil {
			var apiErr *oai.Error
			if errors.As(err, &apiErr) && apiErr.StatusCode == 400 { // already cancelled: the engine says so
				continue
			}
			t.Fatalf("cancel: %v", err)
		}
		if cancelled.ID != started.ID || cancelled.Status != "cancelled" {
			t.Errorf("cancel: %s %s", cancelled.ID, cancelled.Status)
		}
	}

	ct, body := form(t, map[string]string{"model": "sim-model", "stream": "true"})
	resp, got := rawPost(t, gw.url, "/v1/audio/transcriptions", body, map[string]string{"Content-Type": ct})
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" ||
		!bytes.Contains(got, []byte("transcription.chunk")) || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) {
		t.Errorf("audio stream: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), got)
	}
}
