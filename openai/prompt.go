package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Endpoint names the OpenAI API a request body belongs to.
type Endpoint uint8

// The endpoints Switchyard understands.
const (
	Chat        Endpoint = iota + 1 // POST /v1/chat/completions
	Completions                     // POST /v1/completions
	Embeddings                      // POST /v1/embeddings
)

// String returns the endpoint's path.
func (e Endpoint) String() string {
	switch e {
	case Chat:
		return "/v1/chat/completions"
	case Completions:
		return "/v1/completions"
	case Embeddings:
		return "/v1/embeddings"
	}
	return fmt.Sprintf("Endpoint(%d)", uint8(e))
}

// BytesPerToken is the prompt-length estimate used everywhere a tokenizer is not configured: one token per four
// bytes of canonical prompt text, rounded up. The simulator counts tokens the same way, so the gateway's estimate
// of uncached prefill work matches what the simulated engine does.
const BytesPerToken = 4

// EstimateTokens returns ceil(n / BytesPerToken).
func EstimateTokens(n int) int { return (n + BytesPerToken - 1) / BytesPerToken }

// The canonical prompt is the byte string that stands for "what the engine prefills", built the same way by the
// gateway (to hash prefix blocks) and by the simulator (to fill its KV cache), so that block boundaries agree:
//
//   - chat: if "tools" is present, "tools:" + its raw JSON + "\n"; then for each message in order:
//     role + ":" + text + "\n", where text is the unescaped string content, or for array content the
//     concatenation of each part's unescaped "text" (parts without "text", such as images, contribute their
//     raw JSON); an assistant message's "tool_calls" contribute their raw JSON after the text.
//   - completions: the unescaped prompt string; for a list of strings the first one; for a list of token IDs
//     (or a list of such lists) the raw JSON of the (first) list.
//   - embeddings: the unescaped input string, or the first string of a list, or the raw JSON of token IDs.
//
// Raw JSON is copied byte for byte as the client sent it (clients resend identical bytes for identical tools).

// AppendPromptReference appends the canonical prompt of body to dst. It is the reference implementation, built on
// encoding/json for clarity: slow and allocating, kept as the oracle that the fast scanner is tested against.
func AppendPromptReference(dst []byte, e Endpoint, body []byte) ([]byte, error) {
	switch e {
	case Chat:
		var req struct {
			Tools    json.RawMessage `json:"tools"`
			Messages []struct {
				Role      string          `json:"role"`
				Content   json.RawMessage `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		if len(req.Tools) > 0 && !bytes.Equal(req.Tools, []byte("null")) {
			dst = append(dst, "tools:"...)
			dst = append(dst, req.Tools...)
			dst = append(dst, '\n')
		}
		for _, m := range req.Messages {
			dst = append(dst, m.Role...)
			dst = append(dst, ':')
			var err error
			if dst, err = appendContentReference(dst, m.Content); err != nil {
				return dst, err
			}
			if len(m.ToolCalls) > 0 && !bytes.Equal(m.ToolCalls, []byte("null")) {
				dst = append(dst, m.ToolCalls...)
			}
			dst = append(dst, '\n')
		}
		return dst, nil
	case Completions, Embeddings:
		field := "prompt"
		if e == Embeddings {
			field = "input"
		}
		var req map[string]json.RawMessage
		if err := json.Unmarshal(body, &req); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		return appendPromptValueReference(dst, req[field])
	}
	return dst, fmt.Errorf("prompt: unknown endpoint %v", e)
}

func appendContentReference(dst []byte, content json.RawMessage) ([]byte, error) {
	content = bytes.TrimSpace(content)
	if len(content) == 0 || bytes.Equal(content, []byte("null")) {
		return dst, nil
	}
	switch content[0] {
	case '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return dst, fmt.Errorf("prompt: content: %w", err)
		}
		return append(dst, s...), nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(content, &parts); err != nil {
			return dst, fmt.Errorf("prompt: content: %w", err)
		}
		for _, p := range parts {
			var part struct {
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(p, &part); err == nil && part.Text != nil {
				dst = append(dst, *part.Text...)
			} else {
				dst = append(dst, bytes.TrimSpace(p)...)
			}
		}
		return dst, nil
	}
	return dst, errors.New("prompt: content must be a string or an array")
}

func appendPromptValueReference(dst []byte, v json.RawMessage) ([]byte, error) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || bytes.Equal(v, []byte("null")) {
		return dst, nil
	}
	switch v[0] {
	case '"':
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		return append(dst, s...), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(v, &items); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
		if len(items) == 0 {
			return dst, nil
		}
		first := bytes.TrimSpace(items[0])
		switch {
		case len(first) > 0 && first[0] == '"':
			return appendPromptValueReference(dst, first)
		case len(first) > 0 && first[0] == '[':
			return append(dst, first...), nil // a batch of token-ID lists: the first list
		default:
			return append(dst, v...), nil // one list of token IDs
		}
	}
	return dst, errors.New("prompt: must be a string or an array")
}

// AppendPrompt appends the canonical prompt of body to dst (see the format above).
//
// TODO(openai): replace with the single-pass scanner; until then it calls the reference implementation.
func AppendPrompt(dst []byte, e Endpoint, body []byte) ([]byte, error) {
	return AppendPromptReference(dst, e, body)
}
