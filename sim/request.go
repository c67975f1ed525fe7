package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/switchyard/switchyard/openai"
)

// errWriter answers a failed request in one API's error shape: writeError (vLLM's, for the OpenAI-style
// endpoints) or writeAnthropicError (/v1/messages).
type errWriter func(w http.ResponseWriter, status int, msg string)

// decodeJSON decodes body into v, turning a decoding failure into a 400 in the words parseRequest uses.
func decodeJSON(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return errorf(http.StatusBadRequest, "Invalid JSON at offset %d: %v", syn.Offset, err)
		}
		return errorf(http.StatusBadRequest, "Invalid request: %v", err)
	}
	return nil
}

// answerError answers err with fail: a badRequest with its own status, anything else as a 400.
func answerError(w http.ResponseWriter, fail errWriter, err error) {
	var br *badRequest
	if errors.As(err, &br) {
		fail(w, br.status, br.msg)
		return
	}
	fail(w, http.StatusBadRequest, err.Error())
}

// allowPost answers 405 unless r is a POST, and 503 while the engine is down; it reports whether to go on.
func (b *Backend) allowPost(w http.ResponseWriter, r *http.Request, fail errWriter) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		fail(w, http.StatusMethodNotAllowed, "Method Not Allowed")
		return false
	}
	if b.eng.getFaults().Down {
		fail(w, http.StatusServiceUnavailable, "The engine is down.")
		return false
	}
	return true
}

// readPost checks r as allowPost does and reads its body, at most maxBodyBytes (413 past that). ok is false when
// the request was answered (or the client left while sending).
func (b *Backend) readPost(w http.ResponseWriter, r *http.Request, fail errWriter) (body []byte, ok bool) {
	if !b.allowPost(w, r, fail) {
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Request body larger than %d bytes.", tooBig.Limit))
		}
		return nil, false
	}
	return body, true
}

// checkModel answers 404 for a model the backend does not serve (an empty model means the served one); it
// reports whether to go on.
func (b *Backend) checkModel(w http.ResponseWriter, model string, fail errWriter) bool {
	if model != "" && model != b.cfg.Model {
		fail(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model))
		return false
	}
	return true
}

// admit is checkModel for a request that reaches the engine, which also answers 500 when drawn into the
// fail_rate share.
func (b *Backend) admit(w http.ResponseWriter, model string, fail errWriter) bool {
	return b.checkModel(w, model, fail) && b.drawFail(w, fail)
}

// drawFail answers 500 for a request drawn into the fail_rate share; it reports whether to go on.
func (b *Backend) drawFail(w http.ResponseWriter, fail errWriter) bool {
	if b.failDraw(b.eng.getFaults().FailRate) {
		fail(w, http.StatusInternalServerError, "Simulated engine failure (fail_rate).")
		return false
	}
	return true
}

// checkContext is vLLM's context check for a generation of maxTokens after promptTokens.
func (b *Backend) checkContext(promptTokens, maxTokens int) error {
	maxCtx := b.cfg.maxContextTokens()
	if maxTokens > maxCtx-promptTokens || maxTokens < 1 {
		return errorf(http.StatusBadRequest, "This model's maximum context length is %d tokens. "+
			"However, you requested %d tokens (%d in the messages, %d in the completion). "+
			"Please reduce the length of the messages or completion.",
			maxCtx, promptTokens+maxTokens, promptTokens, maxTokens)
	}
	return nil
}

// defaultMaxTokens is the generation length of a request that sets none: Config.DefaultMaxTokens, cut to what
// fits the context after promptTokens.
func (b *Backend) defaultMaxTokens(promptTokens int) int {
	return min(b.cfg.DefaultMaxTokens, b.cfg.maxContextTokens()-promptTokens)
}

// submitGeneration puts a generation of maxTokens tokens after prompt into the engine, drawing the stall fault as
// chat does. It fails while the engine is down or overloaded (see engine.submit).
func (b *Backend) submitGeneration(prompt []byte, promptTokens, maxTokens int) (*seq, error) {
	s := newSeq(promptTokens, maxTokens, b.blockHashes(prompt))
	faults := b.eng.getFaults()
	s.stalled = faults.StallRate > 0 && b.failDraw(faults.StallRate)
	if err := b.eng.submit(s); err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	return s, nil
}

// How waitSeq found a sequence.
const (
	waitDone   = iota // it ran to its end
	waitLeft          // done closed first (the client left): the sequence was aborted
	waitKilled        // the engine went down, restarted or closed
)

// waitSeq waits until s ends or done is closed; on done it aborts s.
func (b *Backend) waitSeq(done <-chan struct{}, s *seq) int {
	for {
		select {
		case <-s.notify:
		case <-done:
			b.eng.abort(s)
			return waitLeft
		}
		switch s.end.Load() {
		case endLength:
			return waitDone
		case endKilled:
			return waitKilled
		case endAbort:
			return waitLeft
		}
	}
}

// tokenEvents renders one streaming API's events around the engine's tokens (see relay).
type tokenEvents interface {
	// appendTokens appends the events of generated tokens [from, to).
	appendTokens(dst []byte, from, to int) []byte
	// appendEnd appends the events that close the stream once every token is out.
	appendEnd(dst []byte) []byte
}

// relay streams s as SSE: head at once, then on each engine wake-up the events of every token produced since
// the last one, in one write and one flush, and the closing events after the last. A client that hangs up
// aborts s; a killed sequence drops the connection without the closing events, as a crashed engine would. It
// reports whether the stream ran to its end.
func (b *Backend) relay(w http.ResponseWriter, r *http.Request, s *seq, head []byte, ev tokenEvents) bool {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if _, err := w.Write(head); err != nil {
		b.eng.abort(s)
		return false
	}
	if err := rc.Flush(); err != nil {
		b.eng.abort(s)
		return false
	}
	buf := make([]byte, 0, 4096)
	sent := 0
	done := r.Context().Done()
	for {
		select {
		case <-s.notify:
		case <-done:
			b.eng.abort(s)
			return false
		}
		end := s.end.Load() // before emitted: the engine stores emitted first, so a final end sees every token
		if end == endKilled {
			panic(http.ErrAbortHandler)
		}
		n := int(s.emitted.Load())
		buf = ev.appendTokens(buf[:0], sent, n)
		sent = n
		finished := end == endLength
		if finished {
			buf = ev.appendEnd(buf)
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				b.eng.abort(s)
				return false
			}
			if err := rc.Flush(); err != nil {
				b.eng.abort(s)
				return false
			}
		}
		if finished || end == endAbort {
			return finished
		}
	}
}

// appendWords appends tokens [from, to) of the text seeded by seed.
func appendWords(dst []byte, seed uint64, from, to int) []byte {
	for i := from; i < to; i++ {
		dst = append(dst, word(seed, i)...)
	}
	return dst
}

// jsonString returns s as a JSON string literal.
func jsonString(s string) []byte {
	out, _ := json.Marshal(s)
	return out
}

// blockHashes returns the chained hashes of prompt's full KV blocks at the backend's block size.
func (b *Backend) blockHashes(prompt []byte) []uint64 {
	return appendBlockHashes(nil, prompt, b.cfg.blockSize()*openai.BytesPerToken)
}
