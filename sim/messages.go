package sim

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/switchyard/switchyard/openai"
)

// writeAnthropicError answers status with Anthropic's error body, as vLLM's /v1/messages does:
// {"type":"error","error":{"type":..,"message":..}}.
func writeAnthropicError(w http.ResponseWriter, status int, msg string) {
	typ := "api_error"
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusMethodNotAllowed:
		typ = "invalid_request_error"
	case http.StatusNotFound:
		typ = "not_found_error"
	case http.StatusServiceUnavailable:
		typ = "overloaded_error"
	}
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e.Type, e.Error.Type, e.Error.Message = "error", typ, msg
	body, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// messagesRequest is the part of a POST /v1/messages body the simulator reads.
type messagesRequest struct {
	Model     string `json:"model"`
	MaxTokens *int   `json:"max_tokens"`
	Messages  *[]struct {
		Role string `json:"role"`
	} `json:"messages"`
	Stream bool `json:"stream"`
}

// checkMessages checks what the canonical prompt does not: max_tokens is set and positive, messages is a
// non-empty list, each with role "user" or "assistant".
func checkMessages(req *messagesRequest) error {
	switch {
	case req.MaxTokens == nil:
		return errorf(http.StatusBadRequest, "max_tokens: Field required")
	case *req.MaxTokens < 1:
		return errorf(http.StatusBadRequest, "max_tokens: must be at least 1, got %d", *req.MaxTokens)
	case req.Messages == nil:
		return errorf(http.StatusBadRequest, "messages: Field required")
	case len(*req.Messages) == 0:
		return errorf(http.StatusBadRequest, "messages: must not be empty")
	}
	for i, m := range *req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return errorf(http.StatusBadRequest, "messages.%d.role: want \"user\" or \"assistant\", got %q", i, m.Role)
		}
	}
	return nil
}

// serveMessages answers POST /v1/messages (Anthropic's Messages API, as vLLM and SGLang serve it): model,
// max_tokens (required), system, messages, stream. The prompt is the canonical one (openai.AppendPrompt, the
// bytes the gateway hashes: tools, system, messages), and the generation runs through the engine as a chat
// completion does. Since Anthropic clients must set max_tokens and set it as a ceiling, the simulated model
// ends its turn after Config.DefaultMaxTokens tokens: a reply is min(max_tokens, DefaultMaxTokens) tokens,
// with stop_reason "end_turn" (counted as finished_reason="stop") when it ended first and "max_tokens"
// otherwise.
//
// Without stream the answer is {"id":"msg_..","type":"message","role":"assistant","model":..,"content":
// [{"type":"text","text":..}],"stop_reason":..,"stop_sequence":null,"usage":{"input_tokens":N,
// "output_tokens":M}}. The stream (see messageEvents) is Anthropic's events. Errors are Anthropic's shape.
func (b *Backend) serveMessages(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeAnthropicError)
	if !ok {
		return
	}
	var req messagesRequest
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeAnthropicError, err)
		return
	}
	if err := checkMessages(&req); err != nil {
		answerError(w, writeAnthropicError, err)
		return
	}
	prompt, err := openai.AppendPrompt(nil, openai.Messages, body)
	if err != nil {
		writeAnthropicError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !b.checkModel(w, req.Model, writeAnthropicError) {
		return
	}
	promptTokens := max(openai.EstimateTokens(len(prompt)), 1)
	if err := b.checkContext(promptTokens, *req.MaxTokens); err != nil {
		answerError(w, writeAnthropicError, err)
		return
	}
	if !b.drawFail(w, writeAnthropicError) {
		return
	}
	n := min(*req.MaxTokens, b.cfg.DefaultMaxTokens)
	s := newSeq(promptTokens, n, b.blockHashes(prompt))
	s.stop = n < *req.MaxTokens
	faults := b.eng.getFaults()
	s.stalled = faults.StallRate > 0 && b.failDraw(faults.StallRate)
	if err := b.eng.submit(s); err != nil {
		writeSubmitError(w, err, writeAnthropicError)
		return
	}
	ev := &messageEvents{id: jsonString("msg_" + b.requestID(r)), model: jsonString(b.cfg.Model),
		seed: textSeed(b.cfg.Seed, prompt), s: s}
	if req.Stream {
		b.relay(w, r, s, nil, ev)
		return
	}
	switch b.waitSeq(r.Context().Done(), s) {
	case waitKilled:
		panic(http.ErrAbortHandler)
	case waitLeft:
		return
	}
	out := append(make([]byte, 0, 256+8*n), `{"id":`...)
	out = append(out, ev.id...)
	out = append(out, `,"type":"message","role":"assistant","model":`...)
	out = append(out, ev.model...)
	out = append(out, `,"content":[{"type":"text","text":"`...)
	out = appendWords(out, ev.seed, 0, n)
	out = append(out, `"}],"stop_reason":"`...)
	out = append(out, ev.stopReason()...)
	out = append(out, `","stop_sequence":null,"usage":{"input_tokens":`...)
	out = strconv.AppendInt(out, int64(promptTokens), 10)
	out = append(out, `,"output_tokens":`...)
	out = strconv.AppendInt(out, int64(n), 10)
	out = append(out, "}}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// messageEvents renders a /v1/messages stream as Anthropic's events, "event: <type>\ndata: {..}\n\n": with the
// first token (when vLLM's converter sends them, its first chat chunk) message_start (the message with
// usage.input_tokens), content_block_start and ping; one content_block_delta per token; then
// content_block_stop, message_delta (stop_reason and usage.output_tokens) and message_stop.
type messageEvents struct {
	id, model []byte // JSON strings
	seed      uint64
	s         *seq
}

func (e *messageEvents) stopReason() string {
	if e.s.stop {
		return "end_turn"
	}
	return "max_tokens"
}

func (e *messageEvents) appendTokens(dst []byte, from, to int) []byte {
	if from == 0 && to > 0 {
		dst = append(dst, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":"...)
		dst = append(dst, e.id...)
		dst = append(dst, `,"type":"message","role":"assistant","model":`...)
		dst = append(dst, e.model...)
		dst = append(dst, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":`...)
		dst = strconv.AppendInt(dst, int64(e.s.prompt), 10)
		dst = append(dst, ",\"output_tokens\":0}}}\n\n"...)
		dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"+
			"\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
		dst = append(dst, "event: ping\ndata: {\"type\":\"ping\"}\n\n"...)
	}
	for i := from; i < to; i++ {
		dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"+
			"\"delta\":{\"type\":\"text_delta\",\"text\":\""...)
		dst = append(dst, word(e.seed, i)...)
		dst = append(dst, "\"}}\n\n"...)
	}
	return dst
}

func (e *messageEvents) appendEnd(dst []byte) []byte {
	dst = append(dst, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
	dst = append(dst, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\""...)
	dst = append(dst, e.stopReason()...)
	dst = append(dst, `","stop_sequence":null},"usage":{"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(e.s.maxTokens), 10)
	dst = append(dst, "}}\n\n"...)
	return append(dst, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
}
