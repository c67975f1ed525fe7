package routing

import (
	"errors"
)

// ErrNoBackend is returned when no backend can take a request: none serves the model, all are unhealthy, or all
// were already tried.
var ErrNoBackend = errors.New("routing: no backend available")

// Target is one way to serve a public model: a backend and the model name to send it upstream.
type Target struct {
	Backend *Backend
	// Model is the model name the backend knows; the request's "model" is rewritten to it when it differs.
	Model string
}

// Request is what a strategy knows about the request it routes. The request path owns it and reuses it.
type Request struct {
	// Model is the public model name the client asked for.
	Model string
	// PromptTokens estimates the prompt's length in tokens.
	PromptTokens int
	// MaxTokens is the client's output bound (0 when unset).
	MaxTokens int
	// Prompt is the canonical prompt (openai.AppendPrompt), for prefix hashing; valid during Pick only.
	Prompt []byte
}

// Strategy picks the target to send a request to. Implementations are safe for concurrent use.
type Strategy interface {
	// Pick chooses one of targets (all serve the request's model and none was tried yet). It returns
	// ErrNoBackend when none is acceptable. targets is owned by the caller and valid during the call only.
	Pick(r *Request, targets []Target) (Target, error)
}

// healthy returns the targets whose backend is healthy, appended to dst.
func healthy(dst, targets []Target) []Target {
	for _, t := range targets {
		if t.Backend.Healthy() {
			dst = append(dst, t)
		}
	}
	return dst
}
