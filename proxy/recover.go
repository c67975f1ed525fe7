package proxy

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/openai"
)

// Panics on the request path. A panic in one exchange must never take the process down: every goroutine that
// runs request code (the handler, the relay fasthttp calls after it, a hijacked stream's goroutines, a hedged
// attempt's goroutine, the queue's dispatch) recovers it, logs it with its stack, counts it in
// switchyard_panics_total{stage}, and ends that one request with an error: 500 before the response started, an
// SSE error event and [DONE] once it streams. The connection stays usable. An exchange that panicked is not returned to the pool, since its state may be
// inconsistent; what it held (the attempt's slots, the quota reservation, the retry budget) is given back on a
// best-effort basis, itself guarded against a second panic.

// Stages of the request path, the label of switchyard_panics_total.
const (
	stageHandler  = "handler"  // the fasthttp handler: parse, admit, route, the first attempts, a whole answer
	stageRelay    = "relay"    // relaying a committed stream (exchange.WriteTo, exchange.pump)
	stageHijack   = "hijack"   // taking a committed stream's connection over from fasthttp (hijack.go)
	stageAttempt  = "attempt"  // an attempt's network part: send and read the first event or the whole answer
	stageDispatch = "dispatch" // the gateway queue's late-binding pick
)

// testPanic calls the test hook for stage, if any.
func (s *Server) testPanic(stage string) {
	if s.panicAt != nil {
		s.panicAt(stage)
	}
}

// errPanic ends a request whose code panicked; it maps to 500 internal_error.
var errPanic = errors.New("proxy: internal error")

// recovered logs and counts a recovered panic value r.
func (s *Server) recovered(stage string, r any) {
	s.m.Panics.WithLabelValues(stage).Inc()
	s.log.Error("panic recovered; the request ended with an error and the gateway goes on",
		"stage", stage, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
}

// panicResponse replaces whatever the handler had put in the response with a 500. The request has been read
// whole, so the connection stays usable for the client's next request.
func panicResponse(ctx *fasthttp.RequestCtx) {
	ctx.Response.ResetBody()
	ctx.Response.Header.Set(headerBackend, "none")
	writeError(ctx, errPanic)
}

// discard ends an exchange whose code panicked without returning it to the pool: it gives back what the
// exchange holds (watchdog, attempts and their slots, the quota reservation, the retry budget) and records the
// request as failed. A second panic on the way is logged, and the rest is left to the garbage collector.
func (s *Server) discard(ex *exchange) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic while discarding a failed exchange", "panic", fmt.Sprint(r))
		}
	}()
	asked := ex.unregister() // yield.go
	if ex.wd != nil {
		ex.wd.stop()
	}
	backend := "none"
	if a := ex.cur; a != nil {
		backend = a.name
		ex.cur = nil
		ex.endAttempt(a, errPanic)
	}
	if asked {
		ex.rec.yield.freed()
	}
	if a := ex.queued; a != nil {
		ex.queued = nil
		a.free()
	}
	if ex.budgeted {
		ex.budgeted = false
		s.retries.End()
	}
	if !ex.done {
		ex.done = true
		ex.record(fasthttp.StatusInternalServerError, backend)
	}
}

// abortStream ends a committed stream after a panic in the relay: an SSE error event and [DONE] for the
// client, the request recorded as failed. It returns errClientGone when the client cannot be written to.
func (ex *exchange) abortStream() (err error) {
	defer func() {
		if r := recover(); r != nil {
			ex.s.log.Error("panic while ending a stream after a panic", "panic", fmt.Sprint(r))
			err = errClientGone
		}
	}()
	ex.end = endPanic // whatever the relay was doing, the gateway's code ended the stream
	buf := appendStreamError(nil, ex.endpoint, "internal error in the gateway; the answer is incomplete", "server_error", "internal_error")
	if ex.endpoint != openai.Responses && ex.endpoint != openai.Messages {
		buf = openai.AppendDone(buf)
	}
	if werr := ex.emit(buf); werr != nil {
		err = errClientGone
	}
	ex.finish(errPanic)
	return err
}

// safePump is pump with its panics recovered (see the comment at the top of this file): the stream ends with an
// error event and [DONE] (abortStream), in fasthttp's WriteTo and in a hijacked stream's goroutines alike.
func (ex *exchange) safePump() (parked bool, fail error) {
	defer func() {
		if r := recover(); r != nil {
			ex.s.recovered(stageRelay, r)
			ex.poisoned = true
			parked, fail = false, ex.abortStream()
		}
	}()
	return ex.pump()
}

// safeAttemptOnce is attemptOnce with its panics recovered: a panic while reading a backend's answer is
// treated as a protocol error of that backend (its answer is what made the code fail), so the request may be
// retried on another.
func (a *attempt) safeAttemptOnce() (err error) {
	defer func() {
		if r := recover(); r != nil {
			a.s.recovered(stageAttempt, r)
			err = &upstreamError{kind: kindProtocol, backend: a.name, err: fmt.Errorf("proxy: reading the answer: %w", errPanic)}
		}
	}()
	return a.attemptOnce()
}
