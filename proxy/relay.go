package proxy

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/openai"
)

// The exchange is the response body stream of a committed streaming answer. fasthttp calls WriteTo once, in
// the connection's own goroutine, with a writer that frames every Write as one HTTP chunk and flushes it to the
// socket at once (fasthttp.BodyWriterTo). So each SSE event reaches the client as soon as it is written, a
// vanished client shows up as a write error, and no extra goroutine or pipe sits between upstream and client.
var _ fasthttp.BodyWriterTo = (*exchange)(nil)

// SupportsBodyWriteTo tells fasthttp to consume the body with WriteTo.
func (ex *exchange) SupportsBodyWriteTo() bool { return true }

// Read exists because fasthttp takes the body as an io.Reader; with SupportsBodyWriteTo it never calls it.
func (ex *exchange) Read([]byte) (int, error) {
	return 0, errors.New("proxy: the relay is consumed with WriteTo")
}

// WriteTo relays the stream: first the events read before the commit (ending with the first content), then
// every further event as it arrives. When the upstream breaks, the client gets an SSE error event and
// [DONE], never a silent end. It returns an error only when the client is gone, so fasthttp drops the
// connection.
func (ex *exchange) WriteTo(w io.Writer) (int64, error) {
	wd := ex.wd
	wd.mu.Lock()
	wd.w = w
	_, err := w.Write(ex.pending)
	wd.lastWrite = time.Now()
	wd.mu.Unlock()
	var fail error
	if err != nil {
		fail = errClientGone
	} else {
		ex.countTokens() // the last pending event was the first content
		for {
			done, err := ex.next(ex.emit)
			if err != nil {
				fail = err
				break
			}
			ex.countTokens()
			if done {
				break
			}
		}
	}
	if fail != nil && !errors.Is(fail, errClientGone) {
		fail = ex.endStream(fail)
	}
	wd.mu.Lock()
	wd.w = nil
	wd.mu.Unlock()
	ex.finish(fail)
	if errors.Is(fail, errClientGone) {
		return 0, fail
	}
	return 0, nil
}

// emit writes one event to the client, serialised with the watchdog's pings.
func (ex *exchange) emit(b []byte) error {
	wd := ex.wd
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.w == nil {
		return errClientGone
	}
	if _, err := wd.w.Write(b); err != nil {
		return errClientGone
	}
	wd.lastWrite = time.Now()
	return nil
}

// endStream tells the client that the stream failed: an SSE error event (unless the backend already sent
// one) and [DONE]. It returns the failure to record, errClientGone if even that write failed.
func (ex *exchange) endStream(fail error) error {
	buf := ex.scratch[:0]
	if !ex.upstreamError {
		e := status(fail)
		var msg string
		if errors.Is(fail, errShutdown) {
			msg = "the gateway is shutting down; the answer is incomplete"
		} else {
			msg = "the backend's stream broke off; the answer is incomplete"
		}
		buf = openai.AppendErrorEvent(buf, msg, e.typ, e.code)
	}
	buf = openai.AppendDone(buf)
	ex.scratch = buf
	if err := ex.emit(buf); err != nil {
		return errClientGone
	}
	return fail
}

// Close releases the exchange once fasthttp is done with the response body (also when WriteTo never ran).
func (ex *exchange) Close() error {
	if !ex.done {
		ex.finish(errClientGone)
	}
	ex.s.releaseExchange(ex)
	return nil
}

// finish records the outcome of the exchange in the metrics and ends the current attempt. fail is nil for a
// complete answer.
func (ex *exchange) finish(fail error) {
	if ex.done {
		return
	}
	ex.done = true
	ex.stopWatchdog()
	code := fasthttp.StatusOK
	if fail != nil {
		code = status(fail).status
		if errors.Is(fail, errClientGone) {
			ex.s.m.ClientDisconnects.WithLabelValues("streaming").Inc()
		}
	} else if ex.upstreamError {
		code = fasthttp.StatusBadGateway
	}
	backend := "none"
	if ex.target.Backend != nil {
		backend = ex.target.Backend.Name()
	}
	ex.closeAttempt(fail)
	ex.record(code, backend)
}

// record counts a finished request.
func (ex *exchange) record(code int, backend string) {
	ex.code = code
	model := ""
	if ex.model != nil {
		model = ex.model.Name
	}
	c := strconv.Itoa(code)
	m := ex.s.m
	m.Requests.WithLabelValues(model, backend, c).Inc()
	m.Duration.WithLabelValues(model, c).Observe(time.Since(ex.arrival).Seconds())
	if ex.hasUsage && model != "" {
		m.Tokens.WithLabelValues(model, "input").Observe(float64(ex.usage.PromptTokens))
		m.Tokens.WithLabelValues(model, "output").Observe(float64(ex.usage.CompletionTokens))
	}
}
