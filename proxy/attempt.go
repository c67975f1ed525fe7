package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// attempt is one request sent to one backend. An exchange has one attempt at a time, or two while a hedge
// races the first for the first token.
//
// Ownership: the handler goroutine picks the backend, takes its permit from admission (breaker, concurrency cap,
// outlier probe) and does all routing accounting (acct). The network part (send, readFirst) runs on the handler goroutine, or,
// when hedging, on a goroutine of the attempt's own; it touches only the attempt and copies of the request's
// inputs, so a losing attempt that is abandoned can finish and free itself after its exchange has moved on.
// The watchdog reaches its connection through wd (per request, never reused) to abort it.
type attempt struct {
	wd     *watchdog
	s      *Server
	target routing.Target
	name   string
	hedge  bool // started as a hedge
	retry  bool // started as a retry that took a retry-budget slot (its permit holds it once acquired)

	end    *endpoint // the backend's record (records.go), set with the permit
	acct   routing.Attempt
	began  bool             // acct holds a dispatched attempt
	permit admission.Permit // the breaker, concurrency slot and outlier probe the attempt holds
	held   int              // prefill tokens held on the target from the claim to the dispatch (routing.Backend.Hold)

	up      *upstream
	req     *fasthttp.Request // the upstream request, from prepare until it is written (send): fasthttp's pool
	resp    fasthttp.Response
	conn    *upConn // the connection of the attempt's request and response; guarded by wd.mu
	events  *openai.EventReader
	ci      openai.ChunkInfo
	started time.Time     // set by prepare, on the handler goroutine, right before the send
	predP90 time.Duration // routing's p90 TTFT prediction at dispatch, RTT included
	to      routing.Timeouts
	// atTotal: the read deadline idleDeadline set last is the total bound, not the idle one, so that a
	// timeout says which of the two it was.
	atTotal bool

	// What the network part needs of its exchange, copied by prepare (the part may outlive the exchange).
	streamed bool            // the upstream answer is an SSE stream (exchange.sse)
	intact   bool            // any 2xx is an answer, and an error body goes back as it is (route.intact)
	endpoint openai.Endpoint // how to inspect the events

	sse      bool   // the answer is an SSE stream read through events (else read whole, or not at all)
	gotFirst bool   // a content event arrived
	complete bool   // the stream ended with [DONE]
	pending  []byte // raw events up to and including the first with content
	respID   []byte // the id of the response the engine made (Responses API), from its first events
	body     []byte // a non-streamed answer (embeddings)
	err      error  // how the pre-commit part ended

	span trace.Span // the attempt's client span (trace.go); nil without tracing

	killed atomic.Pointer[error] // this attempt alone was aborted (a hedge that lost)
	state  atomic.Uint32         // raceRunning, raceReported, raceAbandoned (hedged attempts only)
}

const (
	raceRunning   uint32 = iota
	raceReported         // it finished first and reported to its exchange
	raceAbandoned        // the exchange killed it and ended its accounting: its goroutine frees it
	raceOrphaned         // it lost and reads on to its first token, then ends itself (exchange.abandon)
)

var attempts = sync.Pool{New: func() any { return &attempt{events: openai.NewEventReader(nil, maxEventBytes)} }}

func newAttempt(s *Server, wd *watchdog) *attempt {
	a := attempts.Get().(*attempt)
	a.s, a.wd = s, wd
	return a
}

// free returns a to the pool. The attempt must be closed (its body stream released) and its slots given back.
func (a *attempt) free() {
	a.unhold()
	a.releaseRequest()
	a.resp.Reset()
	a.events.Reset(nil)
	a.wd, a.s = nil, nil
	a.target = routing.Target{}
	a.end, a.atTotal = nil, false
	a.name = ""
	a.hedge, a.retry, a.began = false, false, false
	a.acct = routing.Attempt{}
	a.permit = admission.Permit{}
	a.up, a.conn = nil, nil
	a.ci = openai.ChunkInfo{}
	a.sse, a.gotFirst, a.complete = false, false, false
	a.streamed, a.intact, a.endpoint = false, false, 0
	a.pending = a.pending[:0]
	a.respID = a.respID[:0]
	a.body = a.body[:0]
	a.err = nil
	a.span = nil
	a.killed.Store(nil)
	a.state.Store(raceRunning)
	if cap(a.pending) > 1<<20 || cap(a.body) > 1<<20 {
		a.pending, a.body = nil, nil
	}
	if a.events.Buffered() > 64<<10 { // one huge event must not pin its buffer in the pool
		a.events = openai.NewEventReader(nil, maxEventBytes)
	}
	attempts.Put(a)
}

// unhold gives back the prefill tokens the attempt's claim held on its backend: at its dispatch, which counts
// them from then on, or when it is given up unsent.
func (a *attempt) unhold() {
	if a.held > 0 {
		a.target.Backend.Unhold(a.held)
		a.held = 0
	}
}

// releaseRequest gives the upstream request back to fasthttp's pool.
func (a *attempt) releaseRequest() {
	if a.req != nil {
		fasthttp.ReleaseRequest(a.req)
		a.req = nil
	}
}

// aborted returns why the attempt was aborted from outside (the exchange's reason, or its own kill), or nil.
func (a *attempt) aborted() error {
	if p := a.killed.Load(); p != nil {
		return *p
	}
	return a.wd.reason()
}

// send sends the prepared request (a.req) and waits for the response headers. It may run on the attempt's own
// goroutine. Any status but 200 fails the attempt; with intact (routes whose answers go back as the engine sent
// them) any 2xx is an answer, and a failure keeps the engine's error body for the client.
func (a *attempt) send(streamed, intact bool) error {
	firstByte := a.to.FirstByte
	if firstByte <= 0 {
		firstByte = a.to.Total
	}
	var deadline time.Time
	if firstByte > 0 {
		deadline = a.started.Add(firstByte)
	}
	c, err := a.up.acquire(a.started, deadline)
	if err != nil {
		if why := a.aborted(); why != nil {
			return why
		}
		kind := kindConnect
		if errors.Is(err, os.ErrDeadlineExceeded) && !deadline.IsZero() && !time.Now().Before(deadline) {
			kind = kindFirstByte
		}
		return &upstreamError{kind: kind, backend: a.name, err: err}
	}
	_ = c.SetDeadline(deadline)
	a.wd.setConn(a, c) // from here an abort interrupts the wait for the headers too
	err = c.roundTrip(a.req, &a.resp)
	a.releaseRequest() // written: a stream does not hold it while it waits
	if err != nil {
		if why := a.aborted(); why != nil {
			return why
		}
		var small *fasthttp.ErrSmallBuffer
		if errors.As(err, &small) { // the backend answered, with more headers than upstreamReadBuffer
			return a.overLimit(limitHeaders, kindProtocol)
		}
		kind := kindConnect
		if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
			kind = kindFirstByte // fasthttp's header reader says ErrTimeout for the deadline
		}
		return &upstreamError{kind: kind, backend: a.name, err: err}
	}
	if code := a.resp.StatusCode(); code != fasthttp.StatusOK && !(intact && code >= 200 && code < 300) {
		return a.statusError(code, intact)
	}
	if streamed {
		if ct := a.resp.Header.ContentType(); !bytes.HasPrefix(ct, []byte("text/event-stream")) {
			return &upstreamError{kind: kindProtocol, backend: a.name,
				err: errors.New("streamed request answered with content type " + string(ct))}
		}
		a.events.Reset(c)
		a.sse = true
	}
	return nil
}

// statusError reads (a bounded part of) an upstream error body; with keep, the error holds a copy of it and its
// content type, to go back to the client as they are.
func (a *attempt) statusError(code int, keep bool) error {
	buf := bytes.NewBuffer(a.body[:0])
	_, _ = io.Copy(buf, io.LimitReader(a.conn, maxErrorBody))
	body := buf.Bytes()
	a.body = body[:0]
	msg, typ := openai.ParseUpstreamError(body)
	ue := &upstreamError{kind: kindStatus, backend: a.name, status: code, message: msg, typ: typ}
	if keep {
		ue.body = append([]byte(nil), body...)
		ue.contentType = string(a.resp.Header.ContentType())
	}
	return ue
}

// readFirst reads events into a.pending until one carries content, or the stream ends ([DONE]: an answer with
// no tokens is still an answer). It may run on the attempt's own goroutine.
func (a *attempt) readFirst(e openai.Endpoint) error {
	a.firstDeadline()
	for {
		ev, err := a.events.Next()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // a stream must end with [DONE]
			}
			return a.streamError(err)
		}
		if len(a.pending)+len(ev.Raw) > a.s.opts.MaxPreFirstTokenBytes {
			return a.overLimit(limitPreFirstToken, kindProtocol)
		}
		a.pending = append(a.pending, ev.Raw...)
		if ev.Comment {
			continue
		}
		if bytes.Equal(ev.Data, []byte("[DONE]")) {
			a.complete = true
			return nil
		}
		if err := openai.InspectEvent(e, ev.Data, &a.ci); err != nil {
			return &upstreamError{kind: kindProtocol, backend: a.name, err: err}
		}
		if len(a.ci.ID) > 0 && len(a.respID) == 0 {
			a.respID = append(a.respID, a.ci.ID...)
		}
		if a.ci.Error {
			msg, typ := openai.ParseUpstreamError(ev.Data)
			return &upstreamError{kind: kindStatus, backend: a.name, status: 502, message: msg, typ: typ}
		}
		if a.ci.Content {
			a.gotFirst = true
			return nil
		}
		if a.ci.Terminal { // a Responses or Messages stream that ends without output: still an answer
			a.complete = true
			return nil
		}
	}
}

// readWhole reads a non-streamed answer (embeddings) into a.body.
func (a *attempt) readWhole() error {
	buf := bytes.NewBuffer(a.body[:0])
	limit := a.s.opts.MaxResponseBytes
	if _, err := io.Copy(buf, io.LimitReader(a.conn, int64(limit)+1)); err != nil {
		return a.streamError(err)
	}
	if buf.Len() > limit {
		a.body = buf.Bytes()[:0] // keep the buffer for free's size check
		return a.overLimit(limitAnswer, kindProtocol)
	}
	a.body = buf.Bytes()
	a.gotFirst, a.complete = true, true
	return nil
}

// streamError classifies a failed upstream read.
func (a *attempt) streamError(err error) error {
	if why := a.aborted(); why != nil {
		return why
	}
	kind := kindStream
	timeout := errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout)
	if !a.gotFirst {
		kind = kindProtocol // nothing reached the client: another backend may still answer
		if timeout {
			kind = kindFirstByte
		}
	}
	cause := endUpstreamReset
	switch {
	case errors.Is(err, openai.ErrEventTooLarge):
		a.s.m.UpstreamLimits.WithLabelValues(a.name, limitEvent).Inc()
		cause = endGatewayLimit
	case timeout && a.atTotal:
		cause = endUpstreamTotal
	case timeout:
		if a.gotFirst {
			a.s.m.UpstreamLimits.WithLabelValues(a.name, limitIdle).Inc()
		}
		cause = endUpstreamIdle
	case errors.Is(err, io.ErrUnexpectedEOF):
		// The body ended without [DONE] (nextEvent), or the connection closed inside it (fasthttp's chunked
		// reader): the backend ended the stream, with no error of the transport.
		cause = endUpstreamClosed
	}
	return &upstreamError{kind: kind, backend: a.name, err: err, cause: cause}
}

// The bounds on what an engine sends (the label of switchyard_upstream_limit_exceeded_total).
const (
	limitHeaders       = "headers"         // an engine's response headers: upstreamReadBuffer
	limitPreFirstToken = "pre_first_token" // bytes before the first token: Options.MaxPreFirstTokenBytes
	limitEvent         = "event"           // one SSE event (line): maxEventBytes
	limitAnswer        = "answer"          // an answer held whole or assembled: Options.MaxResponseBytes
	limitIdle          = "idle"            // time between events once streaming: the backend's timeouts.idle
)

// errOverLimit is the cause of an attempt ended by one of the bounds above.
var errOverLimit = errors.New("proxy: the answer passed a bound of the gateway")

// overLimit counts and returns the failure of an attempt whose answer passed the bound limit.
func (a *attempt) overLimit(limit string, kind upstreamKind) error {
	a.s.m.UpstreamLimits.WithLabelValues(a.name, limit).Inc()
	return &upstreamError{kind: kind, backend: a.name, err: fmt.Errorf("%w: %s", errOverLimit, limit), cause: endGatewayLimit}
}

// idleDeadline moves the read deadline to the next idle bound (and never past the total bound) after an event,
// and returns it (zero: none).
func (a *attempt) idleDeadline() time.Time {
	c := a.conn
	if c == nil {
		return time.Time{}
	}
	deadline := time.Time{}
	if a.to.Idle > 0 {
		deadline = time.Now().Add(a.to.Idle)
	}
	a.atTotal = false
	if a.to.Total > 0 {
		if end := a.started.Add(a.to.Total); deadline.IsZero() || end.Before(deadline) {
			deadline, a.atTotal = end, true
		}
	}
	_ = c.SetReadDeadline(deadline)
	// abort stores its reason before it moves the deadline to the past; checking after our own update means an
	// abort racing with it is never lost.
	if a.aborted() != nil {
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}
	return deadline
}

// firstDeadline bounds the wait for the first event with content by the first-byte timeout (counted from the
// send, like the wait for the headers; the total bound when there is none): an engine that sends its headers at
// once and then stalls is timed out as one that sends nothing.
func (a *attempt) firstDeadline() {
	c := a.conn
	if c == nil {
		return
	}
	d := a.to.FirstByte
	if d <= 0 || a.to.Total > 0 && a.to.Total < d {
		d = a.to.Total
	}
	if d <= 0 {
		return
	}
	_ = c.SetReadDeadline(a.started.Add(d))
	if a.aborted() != nil { // as in idleDeadline: an abort racing with this update is never lost
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}
}

// closeStream ends the attempt's use of its connection. A stream read to [DONE] is read on to the end of the
// HTTP body (bounded by a short deadline) so that the connection goes back to its pool; any other is closed
// with its body unread, which is how an engine learns to abort the generation. A whole answer (readWhole) was
// read to its end already: only an SSE stream is read on, since the event reader has no other source.
func (a *attempt) closeStream(ok bool) {
	c := a.conn
	if c == nil {
		return
	}
	if ok && a.sse && a.complete && a.aborted() == nil && c.body != bodyDone {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := a.events.Next(); err != io.EOF {
			c.broken = true
		}
	}
	a.wd.setConn(a, nil)
	c.release()
}
