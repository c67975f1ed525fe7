package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard/switchyard/openai"
)

// responseObject is the Responses API's response object, as vLLM renders it for a text-only model.
type responseObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Background         bool              `json:"background"`
	Error              *responseError    `json:"error"`
	IncompleteDetails  *struct{}         `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Metadata           struct{}          `json:"metadata"`
	Model              string            `json:"model"`
	Output             []responseMessage `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Store              bool              `json:"store"`
	Temperature        float64           `json:"temperature"`
	Text               struct {
		Format struct {
			Type string `json:"type"`
		} `json:"format"`
	} `json:"text"`
	ToolChoice string         `json:"tool_choice"`
	Tools      [0]struct{}    `json:"tools"`
	TopP       float64        `json:"top_p"`
	Truncation string         `json:"truncation"`
	Usage      *responseUsage `json:"usage"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// responseMessage is an output item of type "message".
type responseMessage struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string      `json:"type"`
	Text        string      `json:"text"`
	Annotations [0]struct{} `json:"annotations"`
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// text is the response's output text ("" before it completes).
func (o *responseObject) text() string {
	if len(o.Output) == 0 || len(o.Output[0].Content) == 0 {
		return ""
	}
	return o.Output[0].Content[0].Text
}

// complete fills in the output and usage of a finished generation.
func (o *responseObject) complete(msgID, text string, s *seq) {
	o.Status = "completed"
	o.Output = []responseMessage{{Type: "message", ID: msgID, Role: "assistant", Status: "completed",
		Content: []outputText{{Type: "output_text", Text: text}}}}
	u := &responseUsage{InputTokens: s.prompt, OutputTokens: s.maxTokens, TotalTokens: s.prompt + s.maxTokens}
	u.InputTokensDetails.CachedTokens = s.cachedTokens()
	o.Usage = u
}

// responsesRequest is the part of a POST /v1/responses body the simulator reads.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Background         bool            `json:"background"`
}

// checkResponsesInput checks the shape of a Responses "input" (its text is openai.AppendPrompt's): a string,
// or a non-empty list of objects where a message item has a role.
func checkResponsesInput(input json.RawMessage) error {
	input = bytes.TrimSpace(input)
	if len(input) == 0 || bytes.Equal(input, []byte("null")) {
		return errorf(http.StatusBadRequest, "Field required: input")
	}
	if input[0] == '"' {
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil {
		return errorf(http.StatusBadRequest, "input: want a string or a list of items")
	}
	if len(items) == 0 {
		return errorf(http.StatusBadRequest, "input must not be empty")
	}
	for i, raw := range items {
		var it struct {
			Type *string `json:"type"`
			Role string  `json:"role"`
		}
		if err := json.Unmarshal(raw, &it); err != nil {
			return errorf(http.StatusBadRequest, "%s: want an object", param("input", i))
		}
		if it.Role == "" && (it.Type == nil || *it.Type == "message") {
			return errorf(http.StatusBadRequest, "%s: a message needs a role", param("input", i))
		}
	}
	return nil
}

// serveResponses answers POST /v1/responses, GET /v1/responses/{id} and POST /v1/responses/{id}/cancel.
func (b *Backend) serveResponses(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/v1/responses")
	switch {
	case rest == "" || rest == "/":
		b.createResponse(w, r)
	case strings.HasSuffix(rest, "/cancel"):
		if !b.allowPost(w, r, writeError) {
			return
		}
		b.cancelResponse(w, strings.TrimSuffix(rest[1:], "/cancel"))
	default:
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			writeError(w, http.StatusMethodNotAllowed, "Method Not Allowed")
			return
		}
		if b.eng.getFaults().Down {
			writeError(w, http.StatusServiceUnavailable, "The engine is down.")
			return
		}
		var out []byte
		if !b.responses.update(rest[1:], func(sr *storedResponse) { out, _ = json.Marshal(&sr.obj) }) {
			writeResponseNotFound(w, rest[1:])
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(out, '\n'))
	}
}

// cancelResponse cancels a background response that is queued or in progress (its sequence is aborted at once)
// and answers it with status "cancelled". As vLLM, any other response is a 400 "Cannot cancel a synchronous
// response." (a completed background response too), and an unknown id a 404.
func (b *Backend) cancelResponse(w http.ResponseWriter, id string) {
	var out []byte
	var s *seq
	cancelled := false
	found := b.responses.update(id, func(sr *storedResponse) {
		if st := sr.obj.Status; st == "queued" || st == "in_progress" {
			sr.obj.Status, s, cancelled = "cancelled", sr.seq, true
		}
		out, _ = json.Marshal(&sr.obj)
	})
	switch {
	case !found:
		writeResponseNotFound(w, id)
		return
	case !cancelled:
		writeInvalidRequest(w, http.StatusBadRequest, "Cannot cancel a synchronous response.")
		return
	}
	if s != nil {
		b.eng.abort(s)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(out, '\n'))
}

// createResponse answers POST /v1/responses: model, input (see checkResponsesInput), instructions,
// max_output_tokens (default Config.DefaultMaxTokens), stream, store (default true), previous_response_id and
// background. The prompt is the request's canonical prompt (openai.AppendPrompt, the bytes the gateway hashes:
// tools, instructions, input); with previous_response_id it follows the stored conversation (the earlier
// prompt and "assistant:" + its output + "\n"), so the prefix cache sees a growing conversation; the id must
// name a stored, completed response. background (requires store; answers status "queued" at once while the
// generation goes on; not with stream). The generation runs through the engine as a chat completion does, to
// max_output_tokens, and ends with status "completed".
func (b *Backend) createResponse(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	var req responsesRequest
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeError, err)
		return
	}
	store := req.Store == nil || *req.Store
	switch {
	case req.MaxOutputTokens != nil && *req.MaxOutputTokens < 1:
		writeError(w, http.StatusBadRequest,
			fmt.Sprintf("max_output_tokens must be at least 1, got %d.", *req.MaxOutputTokens))
		return
	case req.Background && req.Stream:
		writeError(w, http.StatusBadRequest, "background with stream is not supported by the simulator.")
		return
	case req.Background && !store:
		writeError(w, http.StatusBadRequest, "background requires store=true.")
		return
	}
	if !b.checkModel(w, req.Model, writeError) {
		return
	}
	if err := checkResponsesInput(req.Input); err != nil {
		answerError(w, writeError, err)
		return
	}
	var prompt []byte
	if id := req.PreviousResponseID; id != nil {
		found, completed := false, false
		b.responses.update(*id, func(sr *storedResponse) {
			found, completed = true, sr.obj.Status == "completed"
			prompt = append(prompt, sr.conv...)
		})
		switch {
		case !found:
			writeResponseNotFound(w, *id)
			return
		case !completed:
			writeInvalidRequest(w, http.StatusBadRequest, "Previous response with id '"+*id+"' is not completed.")
			return
		}
	}
	prompt, err := openai.AppendPrompt(prompt, openai.Responses, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	promptTokens := max(openai.EstimateTokens(len(prompt)), 1)
	maxTokens := b.defaultMaxTokens(promptTokens)
	if req.MaxOutputTokens != nil {
		maxTokens = *req.MaxOutputTokens
	}
	if err := b.checkContext(promptTokens, maxTokens); err != nil {
		answerError(w, writeError, err)
		return
	}
	if !b.drawFail(w, writeError) {
		return
	}
	s, err := b.submitGeneration(prompt, promptTokens, maxTokens)
	if err != nil {
		writeSubmitError(w, err, writeError)
		return
	}
	id := b.requestID(r)
	obj := responseObject{
		ID: "resp_" + id, Object: "response", CreatedAt: time.Now().Unix(), Status: "in_progress",
		Background: req.Background, Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens,
		Model: b.cfg.Model, Output: []responseMessage{}, ParallelToolCalls: true,
		PreviousResponseID: req.PreviousResponseID, Store: store, Temperature: 1, ToolChoice: "auto", TopP: 1,
		Truncation: "disabled",
	}
	obj.Text.Format.Type = "text"
	gen := &generation{prompt: prompt, seed: textSeed(b.cfg.Seed, prompt), msgID: "msg_" + id, s: s}
	switch {
	case req.Background:
		obj.Status = "queued"
		sr := &storedResponse{obj: obj, conv: prompt, seq: s}
		b.responses.put(sr)
		out, _ := json.Marshal(&obj)
		b.bg.Add(1)
		go b.runBackground(sr, gen)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(out, '\n'))
	case req.Stream:
		ev := &responseEvents{obj: obj, gen: gen, itemID: jsonString(gen.msgID)}
		if b.relay(w, r, s, ev.head(), ev) && store {
			b.responses.put(&storedResponse{obj: ev.obj, conv: gen.conversation(ev.text)})
		}
	default:
		switch b.waitSeq(r.Context().Done(), s) {
		case waitKilled:
			panic(http.ErrAbortHandler)
		case waitLeft:
			return
		}
		text := appendWords(nil, gen.seed, 0, s.maxTokens)
		obj.complete(gen.msgID, string(text), s)
		if store {
			b.responses.put(&storedResponse{obj: obj, conv: gen.conversation(text)})
		}
		out, _ := json.Marshal(&obj)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(out, '\n'))
	}
}

// generation is one Responses generation in flight.
type generation struct {
	prompt []byte
	seed   uint64
	msgID  string
	s      *seq
}

// conversation is the stored conversation after the generation: the prompt and the assistant's turn.
func (g *generation) conversation(text []byte) []byte {
	conv := make([]byte, 0, len(g.prompt)+len("assistant:\n")+len(text))
	conv = append(append(append(conv, g.prompt...), "assistant:"...), text...)
	return append(conv, '\n')
}

// runBackground follows a background response's sequence (its owner is the Backend: Close kills the sequence
// and waits for this goroutine) and records its progress in the store: "in_progress" with the first token,
// "completed" with the output, "failed" if the engine went down. A cancel has already set "cancelled".
func (b *Backend) runBackground(sr *storedResponse, g *generation) {
	defer b.bg.Done()
	s := g.s
	started := false
	for range s.notify {
		switch s.end.Load() {
		case endNone:
			if !started && s.emitted.Load() > 0 {
				started = true
				b.responses.mu.Lock()
				if sr.obj.Status == "queued" {
					sr.obj.Status = "in_progress"
				}
				b.responses.mu.Unlock()
			}
			continue
		case endLength:
			text := appendWords(nil, g.seed, 0, s.maxTokens)
			b.responses.mu.Lock()
			sr.obj.complete(g.msgID, string(text), s)
			sr.conv, sr.seq = g.conversation(text), nil
			b.responses.mu.Unlock()
		case endKilled:
			b.responses.mu.Lock()
			sr.obj.Status, sr.seq = "failed", nil
			sr.obj.Error = &responseError{Code: "server_error", Message: "The engine went down."}
			b.responses.mu.Unlock()
		case endAbort:
			b.responses.mu.Lock()
			sr.seq = nil
			b.responses.mu.Unlock()
		}
		return
	}
}

// responseEvents renders a Responses stream in vLLM's order: response.created and response.in_progress at
// once; response.output_item.added and response.content_part.added with the first token; one
// response.output_text.delta per token; then response.output_text.done, response.content_part.done,
// response.output_item.done and response.completed (the whole response, with usage). Every event is
// "event: <type>\ndata: {"type":"<type>","sequence_number":n,...}\n\n"; there is no [DONE].
type responseEvents struct {
	obj    responseObject
	gen    *generation
	itemID []byte // the message id as a JSON string
	n      int    // the next sequence_number
	text   []byte // the text so far
}

func (e *responseEvents) begin(dst []byte, typ string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, typ...)
	dst = append(dst, `","sequence_number":`...)
	dst = strconv.AppendInt(dst, int64(e.n), 10)
	e.n++
	return dst
}

// appendPart appends `,"item_id":..,"output_index":0,"content_index":0`.
func (e *responseEvents) appendPart(dst []byte) []byte {
	dst = append(dst, `,"item_id":`...)
	dst = append(dst, e.itemID...)
	return append(dst, `,"output_index":0,"content_index":0`...)
}

func (e *responseEvents) appendResponse(dst []byte, typ string) []byte {
	dst = e.begin(dst, typ)
	obj, _ := json.Marshal(&e.obj)
	dst = append(dst, `,"response":`...)
	dst = append(dst, obj...)
	return append(dst, "}\n\n"...)
}

func (e *responseEvents) head() []byte {
	dst := e.appendResponse(nil, "response.created")
	return e.appendResponse(dst, "response.in_progress")
}

func (e *responseEvents) appendTokens(dst []byte, from, to int) []byte {
	if from == 0 && to > 0 {
		dst = e.begin(dst, "response.output_item.added")
		dst = append(dst, `,"output_index":0,"item":{"type":"message","id":`...)
		dst = append(dst, e.itemID...)
		dst = append(dst, `,"role":"assistant","status":"in_progress","content":[]}}`+"\n\n"...)
		dst = e.begin(dst, "response.content_part.added")
		dst = e.appendPart(dst)
		dst = append(dst, `,"part":{"type":"output_text","text":"","annotations":[]}}`+"\n\n"...)
	}
	for i := from; i < to; i++ {
		w := word(e.gen.seed, i)
		e.text = append(e.text, w...)
		dst = e.begin(dst, "response.output_text.delta")
		dst = e.appendPart(dst)
		dst = append(dst, `,"delta":"`...)
		dst = append(dst, w...)
		dst = append(dst, `","logprobs":[]}`+"\n\n"...)
	}
	return dst
}

func (e *responseEvents) appendEnd(dst []byte) []byte {
	text := string(e.text)
	e.obj.complete(e.gen.msgID, text, e.gen.s)
	quoted := jsonString(text)
	dst = e.begin(dst, "response.output_text.done")
	dst = e.appendPart(dst)
	dst = append(dst, `,"text":`...)
	dst = append(dst, quoted...)
	dst = append(dst, `,"logprobs":[]}`+"\n\n"...)
	dst = e.begin(dst, "response.content_part.done")
	dst = e.appendPart(dst)
	dst = append(dst, `,"part":{"type":"output_text","text":`...)
	dst = append(dst, quoted...)
	dst = append(dst, `,"annotations":[]}}`+"\n\n"...)
	dst = e.begin(dst, "response.output_item.done")
	item, _ := json.Marshal(&e.obj.Output[0])
	dst = append(dst, `,"output_index":0,"item":`...)
	dst = append(dst, item...)
	dst = append(dst, "}\n\n"...)
	return e.appendResponse(dst, "response.completed")
}
