package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/switchyard/switchyard/openai"
)

// request is the part of a completion request body the simulator reads. The prompt itself is taken by
// openai.AppendPrompt; here messages and prompt are only checked for presence (without copying them).
type request struct {
	Model               string         `json:"model"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	N                   *int           `json:"n"`
	Priority            int            `json:"priority"`
	Messages            presence       `json:"messages"`
	Prompt              presence       `json:"prompt"`
	// ContinueFinalMessage and AddGenerationPrompt are vLLM's chat template switches: a continuation of a final
	// assistant message (a gateway resumes a stream that yielded its seat so) sets the first and clears the
	// second, whose default is true.
	ContinueFinalMessage bool  `json:"continue_final_message"`
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// presence records whether a JSON value was there and not null, and whether it is an empty array.
type presence struct{ set, empty bool }

func (p *presence) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	p.set = !bytes.Equal(b, []byte("null"))
	p.empty = len(b) >= 2 && b[0] == '[' && len(bytes.TrimSpace(b[1:len(b)-1])) == 0
	return nil
}

// badRequest is a client error: the handler answers it with its status in vLLM's error shape.
type badRequest struct {
	status int
	msg    string
}

func (e *badRequest) Error() string { return e.msg }

func errorf(status int, format string, args ...any) error {
	return &badRequest{status: status, msg: fmt.Sprintf(format, args...)}
}

// parseRequest decodes and checks body for endpoint ep. maxTokens is 0 when the request sets none.
func parseRequest(ep openai.Endpoint, body []byte) (req request, maxTokens int, err error) {
	if err := json.Unmarshal(body, &req); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return req, 0, errorf(http.StatusBadRequest, "Invalid JSON at offset %d: %v", syn.Offset, err)
		}
		return req, 0, errorf(http.StatusBadRequest, "Invalid request: %v", err)
	}
	switch ep {
	case openai.Chat:
		if !req.Messages.set {
			return req, 0, errorf(http.StatusBadRequest, "Field required: messages")
		}
		if req.Messages.empty {
			return req, 0, errorf(http.StatusBadRequest, "messages must not be empty")
		}
		if err := checkContinuation(&req, body); err != nil {
			return req, 0, err
		}
	case openai.Completions:
		if !req.Prompt.set {
			return req, 0, errorf(http.StatusBadRequest, "Field required: prompt")
		}
	}
	if req.StreamOptions != nil && !req.Stream {
		return req, 0, errorf(http.StatusBadRequest, "Stream options can only be defined when `stream=True`.")
	}
	if req.N != nil && *req.N != 1 {
		return req, 0, errorf(http.StatusBadRequest, "n must be 1 in the simulator, got %d.", *req.N)
	}
	// As vLLM's chat endpoint: max_completion_tokens wins over the deprecated max_tokens.
	switch mt := req.MaxCompletionTokens; {
	case mt == nil:
		mt = req.MaxTokens
		if mt != nil {
			maxTokens = *mt
		} else {
			return req, 0, nil
		}
	default:
		maxTokens = *mt
	}
	if maxTokens < 1 {
		return req, 0, errorf(http.StatusBadRequest, "max_tokens must be at least 1, got %d.", maxTokens)
	}
	return req, maxTokens, nil
}

// checkContinuation refuses what vLLM's chat endpoint refuses of continue_final_message: together with
// add_generation_prompt (true unless the request clears it), or with a final message that is not the
// assistant's, which there is nothing to continue.
func checkContinuation(req *request, body []byte) error {
	if !req.ContinueFinalMessage {
		return nil
	}
	if req.AddGenerationPrompt == nil || *req.AddGenerationPrompt {
		return errorf(http.StatusBadRequest, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	var roles struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &roles); err != nil || len(roles.Messages) == 0 ||
		roles.Messages[len(roles.Messages)-1].Role != "assistant" {
		return errorf(http.StatusBadRequest, "continue_final_message is set but the final message is not the assistant's.")
	}
	return nil
}

// apiError is vLLM's error body: {"error":{"message":..,"type":..,"param":null,"code":<status>}}.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

// errorType is the "type" vLLM gives each status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowedError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	return "InternalServerError"
}

// writeError answers status with vLLM's error body.
func writeError(w http.ResponseWriter, status int, msg string) {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, errorType(status), status
	body, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// encoder renders one response's JSON: SSE chunks and the non-streaming body. Its prefix (id, created, model) is
// built once per request; each chunk then costs appends into a reused buffer and no allocation.
type encoder struct {
	chat   bool
	prefix []byte // `data: {"id":...,"model":...,"choices":[`
	head   []byte // `{"id":...,"model":...,` of the non-streaming body
}

func newEncoder(chat bool, id string, created int64, model string) *encoder {
	e := &encoder{chat: chat}
	idJSON, _ := json.Marshal(id)
	modelJSON, _ := json.Marshal(model)
	object := "text_completion"
	if chat {
		object = "chat.completion"
	}
	common := func(dst []byte, object string) []byte {
		dst = append(dst, `{"id":`...)
		dst = append(dst, idJSON...)
		dst = append(dst, `,"object":"`...)
		dst = append(dst, object...)
		dst = append(dst, `","created":`...)
		dst = strconv.AppendInt(dst, created, 10)
		dst = append(dst, `,"model":`...)
		dst = append(dst, modelJSON...)
		return append(dst, ',')
	}
	chunkObject := object
	if chat {
		chunkObject = "chat.completion.chunk"
	}
	e.prefix = append(common([]byte("data: "), chunkObject), `"choices":[`...)
	e.head = common(nil, object)
	return e
}

// appendRole appends the first chat chunk, which carries the role and empty content.
func (e *encoder) appendRole(dst []byte) []byte {
	dst = append(dst, e.prefix...)
	return append(dst, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
}

// appendToken appends the chunk of one token; the last one carries finish_reason "length". The words are plain
// ASCII letters and spaces, so they need no JSON escaping.
func (e *encoder) appendToken(dst []byte, text string, last bool) []byte {
	dst = append(dst, e.prefix...)
	if e.chat {
		dst = append(dst, `{"index":0,"delta":{"content":"`...)
		dst = append(dst, text...)
		dst = append(dst, `"},"logprobs":null,"finish_reason":`...)
	} else {
		dst = append(dst, `{"index":0,"text":"`...)
		dst = append(dst, text...)
		dst = append(dst, `","logprobs":null,"finish_reason":`...)
	}
	if last {
		return append(dst, `"length","stop_reason":null}]}`+"\n\n"...)
	}
	if e.chat {
		return append(dst, `null}]}`+"\n\n"...)
	}
	return append(dst, `null,"stop_reason":null}]}`+"\n\n"...)
}

// appendUsageChunk appends the include_usage chunk: no choices, only usage.
func (e *encoder) appendUsageChunk(dst []byte, prompt, completion, cached int) []byte {
	dst = append(dst, e.prefix...)
	dst = append(dst, `],`...)
	dst = appendUsage(dst, prompt, completion, cached)
	return append(dst, "}\n\n"...)
}

func appendUsage(dst []byte, prompt, completion, cached int) []byte {
	dst = append(dst, `"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(cached), 10)
	return append(dst, `}}`...)
}

const doneEvent = "data: [DONE]\n\n"

// appendBody appends the non-streaming response whose content is text.
func (e *encoder) appendBody(dst, text []byte, prompt, completion, cached int) []byte {
	dst = append(dst, e.head...)
	if e.chat {
		dst = append(dst, `"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
		dst = append(dst, text...)
		dst = append(dst, `","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],`...)
	} else {
		dst = append(dst, `"choices":[{"index":0,"text":"`...)
		dst = append(dst, text...)
		dst = append(dst, `","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],`...)
	}
	dst = appendUsage(dst, prompt, completion, cached)
	return append(dst, "}\n"...)
}
