package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// maxEventBytes bounds one upstream SSE event; maxErrorBody bounds an upstream error body we read.
const (
	maxEventBytes = 4 << 20
	maxErrorBody  = 64 << 10
)

// exchange is one client request on its way through the gateway: the client's body and its summary, the
// attempts on backends, and the relay of the answer. Exchanges are pooled.
//
// Ownership: the handler acquires it; for a streaming answer it hands it to fasthttp as the response body
// stream (WriteTo relays, Close releases); otherwise the handler releases it before returning. Nothing in it
// refers to the fasthttp.RequestCtx after the handler returns, except the client net.Conn, which lives as long
// as the connection and is only used while fasthttp is inside the handler or WriteTo.
type exchange struct {
	s        *Server
	endpoint openai.Endpoint
	path     []byte
	arrival  time.Time
	reqID    []byte
	client   net.Conn
	clientIP net.IP

	body   []byte         // the client's body, copied
	sum    openai.Summary // what routing needs from body
	upBody []byte         // body as sent upstream
	upFor  string         // the upstream model name upBody was built for ("" = not built)
	fwd    fasthttp.RequestHeader

	snap  *Snapshot
	model *Model
	rreq  routing.Request
	tried []*routing.Backend
	cands []routing.Target

	// The current attempt.
	target  routing.Target
	att     routing.Attempt
	up      *upstream
	ureq    fasthttp.Request
	uresp   fasthttp.Response
	uconn   *upConn
	started time.Time // when the attempt was sent
	events  *openai.EventReader
	attempt int

	// What the relay learned.
	injectedUsage bool // the gateway asked upstream for usage; the client did not
	gotFirst      bool // a content event arrived from the current attempt
	complete      bool // the current attempt's stream ended with [DONE]
	firstAt       time.Time
	lastTokenAt   time.Time
	tokens        int
	usage         openai.Usage
	hasUsage      bool
	upstreamError bool // the upstream sent an error event mid-stream
	pending       []byte
	scratch       []byte
	modelBuf      []byte
	asm           openai.Assembler
	ci            openai.ChunkInfo
	tpot          prometheus.Observer

	brkDone func(error) // the circuit breaker's callback for the current attempt
	wd      *watchdog
	cancel  atomic.Pointer[error] // why the exchange was cancelled from outside (client gone, shutdown)
	code    int                   // the status the client got (499 when it left)
	done    bool
}

// watchdog runs beside an exchange while it waits on a backend or relays a stream: every tick it checks that
// the client is still there, that the gateway is not past its drain deadline, and, once the stream is
// committed, sends a ": ping" comment when the upstream has been silent. It also serialises writes to the
// client (mu), since pings and events go to the same connection.
//
// It is allocated per exchange (not pooled) so that a tick that fires while the exchange is being released
// finds ex == nil instead of the next request's state.
type watchdog struct {
	mu        sync.Mutex
	ex        *exchange
	t         *time.Timer
	interval  time.Duration
	w         io.Writer // the client's body writer once the stream is committed
	lastWrite time.Time
}

func (s *Server) acquireExchange() *exchange {
	ex, _ := s.exchanges.Get().(*exchange)
	if ex == nil {
		ex = &exchange{s: s}
		ex.events = openai.NewEventReader(nil, maxEventBytes)
	}
	return ex
}

func (s *Server) releaseExchange(ex *exchange) {
	ex.stopWatchdog()
	ex.closeAttempt(errNotSent)
	ex.path = ex.path[:0]
	ex.reqID = ex.reqID[:0]
	ex.client = nil
	ex.clientIP = nil
	ex.body = ex.body[:0]
	ex.upBody = ex.upBody[:0]
	ex.upFor = ""
	ex.fwd.Reset()
	ex.snap, ex.model = nil, nil
	ex.rreq.Reset()
	clear(ex.tried)
	ex.tried = ex.tried[:0]
	clear(ex.cands)
	ex.cands = ex.cands[:0]
	ex.target = routing.Target{}
	ex.attempt = 0
	ex.injectedUsage, ex.gotFirst, ex.hasUsage, ex.upstreamError = false, false, false, false
	ex.firstAt, ex.lastTokenAt = time.Time{}, time.Time{}
	ex.tokens = 0
	ex.usage = openai.Usage{}
	ex.pending = ex.pending[:0]
	ex.scratch = ex.scratch[:0]
	ex.tpot = nil
	ex.cancel.Store(nil)
	ex.code = 0
	ex.done = false
	if cap(ex.body) > 1<<20 { // do not let one huge prompt pin memory in the pool
		ex.body, ex.upBody = nil, nil
	}
	s.exchanges.Put(ex)
}

// startWatchdog starts ticking every interval.
func (ex *exchange) startWatchdog(interval time.Duration) {
	wd := &watchdog{ex: ex, interval: interval}
	ex.wd = wd
	wd.mu.Lock() // the first tick must see wd.t
	wd.t = time.AfterFunc(interval, wd.tick)
	wd.mu.Unlock()
}

func (ex *exchange) stopWatchdog() {
	wd := ex.wd
	if wd == nil {
		return
	}
	wd.mu.Lock()
	wd.ex = nil
	wd.w = nil
	wd.mu.Unlock()
	wd.t.Stop()
	ex.wd = nil
}

func (wd *watchdog) tick() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	ex := wd.ex
	if ex == nil {
		return
	}
	switch {
	case ex.s.drainExpired.Load():
		ex.abort(errShutdown)
	case ex.client != nil && clientGone(ex.client):
		ex.abort(errClientGone)
	case wd.w != nil && time.Since(wd.lastWrite) >= wd.interval:
		if _, err := wd.w.Write(openai.Ping); err != nil {
			ex.abort(errClientGone)
		} else {
			wd.lastWrite = time.Now()
		}
	}
	wd.t.Reset(wd.interval)
}

// abort cancels the exchange from outside its goroutine: it records why and unblocks a pending upstream read
// by moving its deadline to the past. Callers hold wd.mu, which also guards ex.uconn against a new attempt.
func (ex *exchange) abort(why error) {
	ex.cancel.CompareAndSwap(nil, &why)
	if c := ex.uconn; c != nil {
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}
}

func (ex *exchange) cancelled() error {
	if p := ex.cancel.Load(); p != nil {
		return *p
	}
	return nil
}

// setConn publishes the current attempt's connection to the watchdog.
func (ex *exchange) setConn(c *upConn) {
	if ex.wd != nil {
		ex.wd.mu.Lock()
		ex.uconn = c
		ex.wd.mu.Unlock()
		if c != nil && ex.cancelled() != nil {
			_ = c.SetReadDeadline(time.Unix(1, 0))
		}
		return
	}
	ex.uconn = c
}

// run tries backends until one answers: for a streaming client, until the first event with content (earlier
// events are kept in ex.pending); otherwise until the whole answer is assembled. Failures before that point
// are retried on another backend, up to the model's retries; the error returned is the last attempt's.
func (ex *exchange) run() error {
	var last error
	for {
		err := ex.dispatch()
		if err == nil {
			err = ex.awaitAnswer()
			if err == nil {
				return nil
			}
		}
		if why := ex.cancelled(); why != nil {
			ex.closeAttempt(why)
			return why
		}
		var ue *upstreamError
		if !errors.As(err, &ue) {
			if last != nil && errors.Is(err, routing.ErrNoBackend) {
				return last // every backend was tried: the last failure says more
			}
			return err
		}
		ex.s.m.UpstreamErrors.WithLabelValues(ue.backend, ue.kind.String()).Inc()
		ex.closeAttempt(err)
		last = err
		if !ue.retryable() || ex.attempt > ex.model.Retries {
			return last
		}
		ex.s.m.Retries.WithLabelValues(ex.model.Name, ue.kind.String()).Inc()
	}
}

// dispatch picks a backend not tried yet, sends the request and waits for the response headers.
func (ex *exchange) dispatch() error {
	ex.cands = ex.cands[:0]
	for _, t := range ex.model.Targets {
		tried := false
		for _, b := range ex.tried {
			if b == t.Backend {
				tried = true
				break
			}
		}
		if !tried {
			ex.cands = append(ex.cands, t)
		}
	}
	var t routing.Target
	for {
		var err error
		if t, err = ex.model.Strategy.Pick(&ex.rreq, ex.cands); err != nil {
			return err
		}
		done, err := ex.s.brk.get(t.Backend).cb.Allow()
		if err == nil {
			ex.brkDone = done
			break
		}
		// Open, or half-open with its probes taken: leave the backend out of this request.
		ex.tried = append(ex.tried, t.Backend)
		for i := range ex.cands {
			if ex.cands[i].Backend == t.Backend {
				ex.cands = append(ex.cands[:i], ex.cands[i+1:]...)
				break
			}
		}
	}
	ex.attempt++
	ex.target = t
	ex.tried = append(ex.tried, t.Backend)
	cfg := t.Backend.Config()
	to := ex.s.timeouts(cfg)
	up, err := ex.s.ups.get(cfg.URL, to.Connect)
	if err != nil {
		return &upstreamError{kind: kindConnect, backend: cfg.Name, err: err}
	}
	ex.up = up
	if ex.upFor != t.Model || len(ex.upBody) == 0 {
		ex.buildUpstreamBody(t.Model)
	}

	req := &ex.ureq
	req.Reset()
	ex.fwd.CopyTo(&req.Header)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetHost(up.host)
	uri := req.URI()
	if up.tls {
		uri.SetScheme("https")
	} else {
		uri.SetScheme("http")
	}
	uri.SetHost(up.host)
	ex.scratch = append(append(ex.scratch[:0], up.base...), ex.path...)
	uri.SetPathBytes(ex.scratch)
	req.Header.SetContentType("application/json")
	req.Header.Set(fasthttp.HeaderAcceptEncoding, "identity")
	req.Header.SetBytesV(headerRequestID, ex.reqID)
	if ex.clientIP != nil {
		req.Header.Set("X-Forwarded-For", ex.clientIP.String())
	}
	if cfg.APIKey != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+cfg.APIKey)
	}
	req.SetBodyRaw(ex.upBody)

	ex.att = t.Backend.Dispatch(&ex.rreq)
	ex.s.m.Inflight.WithLabelValues(cfg.Name).Set(float64(t.Backend.Inflight()))
	ex.gotFirst = false
	ex.started = time.Now()
	if ex.attempt == 1 {
		ex.s.m.Overhead.Observe(ex.started.Sub(ex.arrival).Seconds())
	}
	firstByte := to.FirstByte
	if firstByte <= 0 {
		firstByte = to.Total
	}
	var doErr error
	if firstByte > 0 {
		doErr = up.hc.DoDeadline(req, &ex.uresp, ex.started.Add(firstByte))
	} else {
		doErr = up.hc.Do(req, &ex.uresp)
	}
	if doErr != nil {
		kind := kindConnect
		if errors.Is(doErr, fasthttp.ErrTimeout) || errors.Is(doErr, os.ErrDeadlineExceeded) {
			kind = kindFirstByte
		}
		return &upstreamError{kind: kind, backend: cfg.Name, err: doErr}
	}
	ex.setConn(ex.s.ups.conn(&ex.uresp))
	if code := ex.uresp.StatusCode(); code != fasthttp.StatusOK {
		return ex.statusError(cfg.Name, code)
	}
	if ex.endpoint != openai.Embeddings {
		if ct := ex.uresp.Header.ContentType(); !bytes.HasPrefix(ct, []byte("text/event-stream")) {
			return &upstreamError{kind: kindProtocol, backend: cfg.Name,
				err: errors.New("streamed request answered with content type " + string(ct))}
		}
		ex.events.Reset(ex.uresp.BodyStream())
	}
	return nil
}

// statusError reads (a bounded part of) an upstream error body and closes the stream.
func (ex *exchange) statusError(backend string, code int) error {
	var body []byte
	if rs := ex.uresp.BodyStream(); rs != nil {
		buf := bytes.NewBuffer(ex.scratch[:0])
		_, _ = io.Copy(buf, io.LimitReader(rs, maxErrorBody))
		body = buf.Bytes()
		ex.scratch = body[:0]
	} else {
		body = ex.uresp.Body()
	}
	msg, typ := openai.ParseUpstreamError(body)
	return &upstreamError{kind: kindStatus, backend: backend, status: code, message: msg, typ: typ}
}

// buildUpstreamBody rewrites the client's body for a backend that knows the model as upstreamModel: the model
// name when it differs, and, for chat and completions, stream:true with include_usage so that the gateway
// always streams from upstream and always learns the usage.
func (ex *exchange) buildUpstreamBody(upstreamModel string) {
	var model []byte
	if upstreamModel != "" && upstreamModel != string(ex.sum.Model) {
		model = []byte(upstreamModel)
	}
	streamUsage := ex.endpoint != openai.Embeddings
	if model == nil && (!streamUsage || (ex.sum.Stream && ex.sum.IncludeUsage)) {
		ex.upBody = append(ex.upBody[:0], ex.body...)
	} else {
		ex.upBody = openai.AppendUpstreamBody(ex.upBody[:0], ex.body, &ex.sum, model, streamUsage)
	}
	ex.upFor = upstreamModel
}

// awaitAnswer reads the current attempt until the exchange can be committed to the client.
func (ex *exchange) awaitAnswer() error {
	switch {
	case ex.endpoint == openai.Embeddings:
		return ex.readWhole()
	case ex.sum.Stream:
		return ex.readUntilFirstContent()
	default:
		ex.asm.Reset(ex.endpoint)
		for {
			done, err := ex.next(nil)
			if err != nil {
				return err
			}
			if done {
				return nil
			}
			ex.countTokens()
		}
	}
}

// readWhole reads a non-streamed upstream body (embeddings) into ex.scratch.
func (ex *exchange) readWhole() error {
	rs := ex.uresp.BodyStream()
	if rs == nil {
		ex.scratch = append(ex.scratch[:0], ex.uresp.Body()...)
		return nil
	}
	buf := bytes.NewBuffer(ex.scratch[:0])
	if _, err := io.Copy(buf, io.LimitReader(rs, int64(ex.s.opts.MaxResponseBytes)+1)); err != nil {
		return ex.streamError(err)
	}
	if buf.Len() > ex.s.opts.MaxResponseBytes {
		return &upstreamError{kind: kindProtocol, backend: ex.target.Backend.Name(), err: errors.New("response larger than max_response_bytes")}
	}
	ex.scratch = buf.Bytes()
	ex.att.FirstToken()
	return nil
}

// readUntilFirstContent reads events, keeping them in ex.pending, until one carries content (or the stream
// ends: an answer with no tokens is still an answer).
func (ex *exchange) readUntilFirstContent() error {
	for !ex.gotFirst {
		done, err := ex.next(ex.appendPending)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
	return nil
}

func (ex *exchange) appendPending(raw []byte) error {
	ex.pending = append(ex.pending, raw...)
	return nil
}

// next reads one upstream event and handles it: forwards it through emit (streaming clients) or adds it to
// the assembler (others), records usage and token timings. It returns done at [DONE].
func (ex *exchange) next(emit func([]byte) error) (done bool, err error) {
	to := ex.s.timeouts(ex.target.Backend.Config())
	if c := ex.uconn; c != nil && ex.gotFirst {
		deadline := time.Time{}
		if to.Idle > 0 {
			deadline = time.Now().Add(to.Idle)
		}
		if to.Total > 0 {
			if end := ex.started.Add(to.Total); deadline.IsZero() || end.Before(deadline) {
				deadline = end
			}
		}
		_ = c.SetReadDeadline(deadline)
		// abort stores its reason before it moves the deadline to the past; checking after our own update
		// means an abort racing with it is never lost.
		if ex.cancelled() != nil {
			_ = c.SetReadDeadline(time.Unix(1, 0))
		}
	}
	ev, err := ex.events.Next()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // a stream must end with [DONE]
		}
		return false, ex.streamError(err)
	}
	if ev.Comment {
		if emit != nil && ex.gotFirst {
			return false, emit(ev.Raw)
		}
		return false, nil
	}
	data := ev.Data
	if bytes.Equal(data, []byte("[DONE]")) {
		ex.complete = true
		if emit != nil {
			return true, emit(ev.Raw)
		}
		return true, nil
	}
	if err := openai.InspectChunk(data, &ex.ci); err != nil {
		return false, &upstreamError{kind: kindProtocol, backend: ex.target.Backend.Name(), err: err}
	}
	if ex.ci.HasUsage {
		ex.usage, ex.hasUsage = ex.ci.Usage, true
		ex.att.ObserveUsage(routing.Usage{PromptTokens: ex.ci.Usage.PromptTokens, CompletionTokens: ex.ci.Usage.CompletionTokens,
			CachedTokens: ex.ci.Usage.CachedTokens, HasCached: ex.ci.Usage.HasCached})
	}
	if ex.ci.Error {
		ex.upstreamError = true
		if !ex.gotFirst {
			msg, typ := openai.ParseUpstreamError(data)
			return false, &upstreamError{kind: kindStatus, backend: ex.target.Backend.Name(), status: 502, message: msg, typ: typ}
		}
	}
	if ex.ci.Content && !ex.gotFirst {
		ex.gotFirst = true
		ex.att.FirstToken()
	}
	if emit == nil {
		if ex.ci.Error {
			msg, _ := openai.ParseUpstreamError(data)
			return false, &upstreamError{kind: kindStream, backend: ex.target.Backend.Name(), err: errors.New(msg)}
		}
		if err := ex.asm.Add(data); err != nil {
			return false, &upstreamError{kind: kindProtocol, backend: ex.target.Backend.Name(), err: err}
		}
		return false, nil
	}
	raw := ev.Raw
	switch {
	case ex.ci.UsageOnly && ex.injectedUsage:
		return false, nil // the client did not ask for the usage chunk
	case ex.injectedUsage && ex.ci.HasUsage:
		// The backend adds "usage":null to every chunk once include_usage is set (OpenAI does): drop it.
		ex.scratch = append(ex.scratch[:0], "data: "...)
		ex.scratch = openai.AppendWithoutNullUsage(ex.scratch, data)
		ex.scratch = append(ex.scratch, "\n\n"...)
		raw = ex.scratch
	}
	if up, pub := ex.target.Model, ex.model.Name; up != "" && up != pub {
		ex.modelBuf = rewriteModel(ex.modelBuf[:0], raw, up, pub)
		raw = ex.modelBuf
	}
	if err := emit(raw); err != nil {
		return false, err
	}
	return false, nil
}

// countTokens records the token timings of the chunk last inspected (ex.ci) if it carried content. For a
// streaming client the relay calls it right after writing the chunk, so the gaps are what the client sees.
func (ex *exchange) countTokens() {
	if !ex.ci.Content {
		return
	}
	now := time.Now()
	if ex.firstAt.IsZero() {
		ex.firstAt = now
		ex.s.m.TTFT.WithLabelValues(ex.model.Name).Observe(now.Sub(ex.arrival).Seconds())
		ex.tpot = ex.s.m.TPOT.WithLabelValues(ex.model.Name)
	} else if ex.tpot != nil {
		ex.tpot.Observe(now.Sub(ex.lastTokenAt).Seconds())
	}
	ex.lastTokenAt = now
	ex.tokens += max(ex.ci.Tokens, 1)
}

// streamError classifies a failed upstream read.
func (ex *exchange) streamError(err error) error {
	if why := ex.cancelled(); why != nil {
		return why
	}
	kind := kindStream
	if !ex.gotFirst {
		kind = kindProtocol // nothing reached the client: another backend may still answer
		if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) {
			kind = kindFirstByte
		}
	}
	return &upstreamError{kind: kind, backend: ex.target.Backend.Name(), err: err}
}

// closeAttempt ends the current attempt with outcome (nil: success): closes its body stream (a stream not read
// to its end closes the connection instead of pooling it, which is how the engine learns to abort), ends the
// accounting and tells the backend's circuit breaker.
func (ex *exchange) closeAttempt(outcome error) {
	if ex.target.Backend == nil {
		return
	}
	var ue *upstreamError
	backendFailed := errors.As(outcome, &ue) && ue.backendFault()
	if ex.brkDone != nil {
		ex.brkDone(outcome)
		ex.brkDone = nil
	}
	if ex.complete && !backendFailed && ex.cancelled() == nil {
		// The stream ended with [DONE]; read on to the end of the HTTP body (the chunked terminator) so that
		// fasthttp sees it fully read and pools the connection instead of closing it. A backend that keeps the
		// stream open after [DONE] loses its connection after a short wait.
		if c := ex.uconn; c != nil {
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
		}
		if _, err := ex.events.Next(); err != io.EOF {
			ex.uresp.SetConnectionClose()
		}
	}
	ex.complete = false
	ex.setConn(nil)
	_ = ex.uresp.CloseBodyStream()
	ex.uresp.Reset()
	ex.att.End(backendFailed)
	ex.s.m.Inflight.WithLabelValues(ex.target.Backend.Name()).Set(float64(ex.target.Backend.Inflight()))
	ex.target = routing.Target{}
}

// rewriteModel appends raw to dst with its first `"model":"up"` member changed to `"model":"pub"`.
func rewriteModel(dst, raw []byte, up, pub string) []byte {
	i := indexModel(raw, up)
	if i < 0 {
		return append(dst, raw...)
	}
	dst = append(dst, raw[:i]...)
	dst = append(append(append(dst, `"model":"`...), pub...), '"')
	return append(dst, raw[i+len(`"model":"`)+len(up)+1:]...)
}

func indexModel(raw []byte, model string) int {
	for off := 0; ; {
		i := bytes.Index(raw[off:], []byte(`"model":"`))
		if i < 0 {
			return -1
		}
		i += off
		rest := raw[i+len(`"model":"`):]
		if len(rest) > len(model) && string(rest[:len(model)]) == model && rest[len(model)] == '"' {
			return i
		}
		off = i + 1
	}
}
