package proxy

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// A committed streaming answer is relayed by pump, through a writer that frames every Write as one HTTP chunk
// and writes it to the socket at once: the relay's own on a hijacked connection (hijack.go, where pump parks
// between events), else fasthttp's, which calls WriteTo once in the connection's own goroutine
// (fasthttp.BodyWriterTo): the exchange is then the response body stream. So each SSE event reaches the client
// as soon as it is written (with the events of its burst, emitBatched), a vanished client shows up as a write
// error, and no extra goroutine or pipe sits between upstream and client.
var _ fasthttp.BodyWriterTo = (*exchange)(nil)

// SupportsBodyWriteTo tells fasthttp to consume the body with WriteTo.
func (ex *exchange) SupportsBodyWriteTo() bool { return true }

// Read exists because fasthttp takes the body as an io.Reader; with SupportsBodyWriteTo it never calls it.
func (ex *exchange) Read([]byte) (int, error) {
	return 0, errors.New("proxy: the relay is consumed with WriteTo")
}

// WriteTo relays the stream (relay), with its panics recovered (recover.go, safePump).
func (ex *exchange) WriteTo(w io.Writer) (int64, error) { return ex.relay(w) }

// relay relays the stream: the events the winning attempt read before the commit (ending with the first
// content), then every further event as it arrives. When the upstream breaks, the client gets an SSE error
// event and [DONE], never a silent end. It returns an error only when the client is gone, so fasthttp drops the
// connection.
func (ex *exchange) relay(w io.Writer) (int64, error) {
	_ = ex.wd.commit(w, nil)
	if _, fail := ex.safePump(); errors.Is(fail, errClientGone) {
		return 0, fail
	}
	return 0, nil
}

// pump relays events until the stream ends, records how it ended (finish) and returns what failed it: nil for
// a complete stream or one whose failure the client was told of, errClientGone when the client is gone. A
// hijacked stream (hijack.go) returns parked instead whenever the next event must be waited for: its
// watchdog then resumes it in another goroutine, and this one must not touch the exchange any more.
func (ex *exchange) pump() (parked bool, fail error) {
	for {
		var err error
		if ex.woke {
			ex.woke = false // resumed: read now, under the deadline set when it parked
		} else if ex.parking && ex.mustWait() {
			var parked bool
			if parked, err = ex.park(); parked {
				return true, nil
			}
		}
		done := false
		if err == nil {
			done, err = ex.step(ex.emitBatched)
		}
		if err == nil && !done {
			err = ex.endBurst()
		}
		if errors.Is(err, errYield) {
			// Its seat went to a critical request: it waits for another and goes on as a continuation (yield.go).
			if err = ex.resumeYielded(); err == nil {
				continue
			}
		}
		if err != nil {
			fail = err
			break
		}
		ex.countTokens()
		if done {
			break
		}
		ex.s.testPanic(stageRelay)
	}
	if err := ex.flush(); err != nil && fail == nil {
		fail = err // the client left before the last events reached it
	}
	ex.noteEnd(fail) // streamend.go: before endStream, whose own write may fail after the real cause
	if fail != nil && !errors.Is(fail, errClientGone) {
		fail = ex.endStream(fail)
	}
	ex.finish(fail)
	if !errors.Is(fail, errClientGone) {
		fail = nil
	}
	return false, fail
}

// mustWait reports whether the answer's next event must be read from the engine: the replay of the pending
// events is done and no whole event is buffered.
func (ex *exchange) mustWait() bool {
	if ex.replaying && ex.replay.Ready() {
		return false
	}
	return ex.cur.events.WouldRead()
}

// emit writes b to the client now, after the events batched before it (in the same write).
func (ex *exchange) emit(b []byte) error {
	if ex.batch != nil {
		if len(*ex.batch)+len(b) <= maxBatch {
			*ex.batch = append(*ex.batch, b...)
			return ex.flush()
		}
		if err := ex.flush(); err != nil {
			return err
		}
	}
	return ex.write(b)
}

// Events that are already read when the relay writes one go to the client in the same write: an engine's
// burst, or a read that brought several events, costs one system call instead of one per event, and no event
// waits for anything but the events before it. An event is batched only when the next one is ready without a
// read (nextReady); the last one of a burst is written with the batch at once, and the relay flushes before it
// ends. The batch buffer is pooled and taken only for a burst, so a stream that waits holds none.

// maxBatch bounds the bytes of events written in one write.
const maxBatch = 16 << 10

var batchBufs = sync.Pool{New: func() any { b := make([]byte, 0, maxBatch); return &b }}

// emitBatched relays one event of the answer (step's emit for a streaming client): batched when the next event
// is ready, else written with the batch before it.
func (ex *exchange) emitBatched(b []byte) error {
	if len(b) >= maxBatch || !ex.nextReady() {
		return ex.emit(b)
	}
	if ex.batch != nil && len(*ex.batch)+len(b) > maxBatch {
		if err := ex.flush(); err != nil {
			return err
		}
	}
	if ex.batch == nil {
		ex.batch = batchBufs.Get().(*[]byte)
	}
	*ex.batch = append(*ex.batch, b...)
	return nil
}

// nextReady reports whether the answer's next event is read already: in the replay of the pending events, or
// buffered from upstream.
func (ex *exchange) nextReady() bool {
	if ex.replaying {
		return ex.replay.Ready()
	}
	return ex.cur != nil && ex.cur.events.Ready()
}

// endBurst writes the batch when the next event is not read yet: step relays some events with no write of
// their own (the usage chunk the client did not ask for), and one of them may end a burst.
func (ex *exchange) endBurst() error {
	if ex.batch == nil || ex.nextReady() {
		return nil
	}
	return ex.flush()
}

// flush writes the batched events, if any, and gives the batch buffer back.
func (ex *exchange) flush() error {
	bp := ex.batch
	if bp == nil {
		return nil
	}
	ex.batch = nil
	err := ex.write(*bp)
	*bp = (*bp)[:0]
	batchBufs.Put(bp)
	return err
}

// write writes b to the client (serialised with the watchdog's pings) and counts it.
func (ex *exchange) write(b []byte) error {
	if err := ex.wd.write(b); err != nil {
		return err
	}
	ex.sent += int64(len(b))
	return nil
}

// startReplay makes step read the winning attempt's pending events first.
func (ex *exchange) startReplay() {
	if (ex.rc.store || ex.continuable) && ex.sum.Stream {
		// A streamed answer is also assembled, for the response cache or for a continuation should the stream
		// yield its seat (yield.go).
		ex.asm.Reset(ex.endpoint)
		// For the cache, bounded by the largest entry the cache keeps, not by MaxResponseBytes: an open stream
		// must not hold more of its answer than can be kept. The assembler counts less than the body it makes,
		// so no answer the cache would keep is lost to the bound; past it, step stops assembling (rc.store goes
		// false, and the stream may no longer yield).
		ex.asm.Limit = ex.s.opts.MaxResponseBytes
		if rc := ex.asked.Cache; ex.rc.store && rc != nil && rc.MaxEntryBytes > 0 {
			ex.asm.Limit = min(ex.asm.Limit, rc.MaxEntryBytes)
		}
	}
	ex.replay.ResetBytes(ex.cur.pending)
	ex.replaying = true
}

// nextEvent returns the next event of the answer: from the replay of the pending events, then from upstream.
func (ex *exchange) nextEvent() (openai.Event, error) {
	if ex.replaying {
		ev, err := ex.replay.Next()
		if err != io.EOF {
			return ev, err
		}
		ex.replaying = false
	}
	a := ex.cur
	if !a.events.Ready() {
		// Only a read waits: an event already buffered (engines often send several in one segment) needs no
		// new deadline, which spares a clock read and a timer update per event. A stream that parked set it
		// before it did.
		if ex.deadlineSet {
			ex.deadlineSet = false
		} else {
			a.idleDeadline()
		}
	}
	ev, err := a.events.Next()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // a stream must end with [DONE]
		}
		return ev, a.streamError(err)
	}
	return ev, nil
}

// step reads one event of the answer and handles it: forwards it through emit (streaming clients) or adds it
// to the assembler (others), and records usage. It returns done at [DONE].
func (ex *exchange) step(emit func([]byte) error) (done bool, err error) {
	ev, err := ex.nextEvent()
	if err != nil {
		return false, err
	}
	a := ex.cur
	if ev.Comment {
		if emit != nil {
			return false, emit(ev.Raw)
		}
		return false, nil
	}
	raw, data := ev.Raw, ev.Data
	if ex.yields > 0 {
		raw, data = ex.resumedEvent(raw, data) // yield.go: the first answer's id and usage
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		a.complete = true
		a.engineDone()
		if emit != nil {
			return true, emit(raw)
		}
		return true, nil
	}
	ex.ci = openai.ChunkInfo{}
	// A chat or completions answer for a client that does not stream is inspected by the assembler as it is
	// merged, in one scan of the chunk (openai.Assembler.AddInspect); the merge's own verdict waits below.
	merged := emit == nil && (ex.endpoint == openai.Chat || ex.endpoint == openai.Completions)
	var addErr error
	if merged {
		addErr = ex.asm.AddInspect(data, &ex.ci)
		if addErr != nil && isSyntaxError(addErr) {
			return false, &upstreamError{kind: kindStream, backend: a.name, err: addErr, cause: endUpstreamInvalid}
		}
	} else if err := openai.InspectEvent(ex.endpoint, data, &ex.ci); err != nil {
		return false, &upstreamError{kind: kindStream, backend: a.name, err: err, cause: endUpstreamInvalid}
	}
	if ex.resumeSkip {
		if !ex.ci.Content && !ex.ci.Error {
			return false, nil // a resumed answer's opening (its role): the client has had the first answer's
		}
		ex.resumeSkip = false
	}
	if ex.ci.HasUsage {
		// Merged: an Anthropic stream reports the prompt's usage first and the output's last.
		ex.usage.Merge(ex.ci.Usage)
		ex.hasUsage = true
		a.acct.ObserveUsage(routing.Usage{PromptTokens: ex.usage.PromptTokens, CompletionTokens: ex.usage.CompletionTokens,
			CachedTokens: ex.usage.CachedTokens, HasCached: ex.usage.HasCached})
		if ex.usage.HasCached && a.permit.Pending() {
			a.permit.Revised(a.acct.RevisedTTFT())
		}
	}
	if ex.ci.Error {
		ex.upstreamError = true
	}
	if len(ex.ci.ID) > 0 && len(a.respID) == 0 {
		a.respID = append(a.respID, ex.ci.ID...)
		ex.rememberID(a)
	}
	if ex.ci.Terminal { // Responses and Messages streams end with their terminal event, not [DONE]
		a.complete = true
		a.engineDone()
		if emit == nil {
			if ex.endpoint == openai.Responses {
				ex.out = append(ex.out[:0], ex.ci.Body...) // the whole response: a non-streaming client's body
			}
			return true, nil
		}
		return true, emit(ex.renamed(raw, data))
	}
	if emit == nil {
		if ex.ci.Error {
			msg, _ := openai.ParseUpstreamError(data)
			return false, &upstreamError{kind: kindStream, backend: a.name, err: errors.New(msg), cause: endUpstreamErrorEvent}
		}
		if ex.endpoint == openai.Responses {
			return false, nil // only the terminal event's response object is kept
		}
		err := addErr
		if !merged {
			err = ex.asm.Add(data)
		}
		if err != nil {
			if errors.Is(err, openai.ErrTooLarge) {
				return false, a.overLimit(limitAnswer, kindStream)
			}
			return false, &upstreamError{kind: kindStream, backend: a.name, err: err}
		}
		return false, nil
	}
	if (ex.rc.store || ex.continuable) && ex.endpoint != openai.Responses {
		if ex.asm.Add(data) != nil {
			ex.rc.store = false // an answer the assembler cannot take is not kept
			ex.stopYielding()
		} else if ex.continuable {
			if _, _, ok := ex.asm.Partial(); !ok {
				ex.stopYielding() // a tool call, say: a continuation cannot carry it
			}
		}
	}
	switch {
	case ex.ci.UsageOnly && ex.injectedUsage:
		return false, nil // the client did not ask for the usage chunk
	case ex.injectedUsage && bytes.Contains(data, []byte(`"usage":null`)):
		// A backend that adds "usage":null to every chunk once include_usage is set (OpenAI does): drop it.
		ex.scratch = append(ex.scratch[:0], "data: "...)
		ex.scratch = openai.AppendWithoutNullUsage(ex.scratch, data)
		ex.scratch = append(ex.scratch, "\n\n"...)
		raw, data = ex.scratch, ex.scratch[len("data: "):len(ex.scratch)-len("\n\n")]
	}
	return false, emit(ex.renamed(raw, data))
}

// isSyntaxError reports a chunk that is not well-formed JSON (an *openai.SyntaxError). A function of its own, so
// that the target of errors.As is allocated only for an error.
func isSyntaxError(err error) bool {
	var se *openai.SyntaxError
	return errors.As(err, &se)
}

// renamed returns an event with the upstream model name changed back to the public one, when they differ.
// data is a subslice of raw for a single-line data event (openai.Event); an event of several data lines (no
// engine sends one) is relayed with the upstream name.
func (ex *exchange) renamed(raw, data []byte) []byte {
	if up, pub := ex.cur.target.Model, ex.model.Name; up != "" && up != pub {
		ex.modelBuf = openai.AppendRenamedModel(ex.modelBuf[:0], raw, data, up, pub)
		return ex.modelBuf
	}
	return raw
}

// assemble reads the whole answer into the non-streaming body a client that did not stream expects.
func (ex *exchange) assemble() ([]byte, error) {
	ex.asm.Reset(ex.endpoint)
	ex.asm.Limit = ex.s.opts.MaxResponseBytes
	ex.startReplay()
	for {
		done, err := ex.step(nil)
		if err != nil {
			return nil, err
		}
		if done {
			break
		}
		ex.countTokens()
	}
	if ex.endpoint == openai.Responses {
		if !ex.cur.complete || len(ex.out) == 0 {
			return nil, &upstreamError{kind: kindStream, backend: ex.cur.name, err: errors.New("the stream ended without its response")}
		}
		return ex.out, nil
	}
	ex.out = ex.asm.AppendBody(ex.out[:0])
	if u, ok := ex.asm.Usage(); ok {
		ex.usage, ex.hasUsage = u, true
	}
	return ex.out, nil
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
		if a := ex.cur; a != nil && a.end != nil {
			a.end.backend.ttft.Observe(now.Sub(a.started).Seconds())
			ex.itl = a.end.backend.itl
			sr := ex.childrenOf(a)
			sr.ttft.Observe(now.Sub(ex.arrival).Seconds())
			ex.tpot = sr.tpot
		} else {
			op, provider := ex.operation(), metrics.ProviderGateway
			if a != nil {
				provider = providerOf(a.target.Backend)
				ex.s.m.BackendTTFT.WithLabelValues(a.name).Observe(now.Sub(a.started).Seconds())
				ex.itl = ex.s.m.BackendITL.WithLabelValues(a.name)
			}
			asked, served := ex.models()
			ex.s.m.TTFT.WithLabelValues(op, provider, asked, served).Observe(now.Sub(ex.arrival).Seconds())
			ex.tpot = ex.s.m.TPOT.WithLabelValues(op, provider, asked, served)
		}
	} else if ex.tpot != nil {
		gap := now.Sub(ex.lastTokenAt).Seconds()
		ex.tpot.Observe(gap)
		if ex.itl != nil {
			ex.itl.Observe(gap)
		}
		ex.noteGap(now) // observe.go
	}
	ex.lastTokenAt = now
	ex.tokens += max(ex.ci.Tokens, 1)
}

// endStream tells the client that the stream failed: an SSE error event (unless the backend already sent
// one) and [DONE]. It returns the failure to record, errClientGone if even that write failed.
func (ex *exchange) endStream(fail error) error {
	buf := ex.scratch[:0]
	if !ex.upstreamError {
		e := status(fail)
		buf = appendStreamError(buf, ex.endpoint, ex.endMessage(ex.cur), e.typ, e.code) // streamend.go
	}
	if ex.endpoint != openai.Responses && ex.endpoint != openai.Messages { // their streams have no [DONE]
		buf = openai.AppendDone(buf)
	}
	ex.scratch = buf
	if err := ex.emit(buf); err != nil {
		return errClientGone
	}
	return fail
}

// Close releases the exchange once fasthttp is done with the response body (also when WriteTo never ran).
func (ex *exchange) Close() error {
	if ex.poisoned { // the relay panicked: the exchange is not reused (recover.go)
		ex.s.discard(ex)
		return nil
	}
	if !ex.done {
		ex.finish(errClientGone)
	}
	ex.s.releaseExchange(ex)
	return nil
}

// finish records the outcome of the exchange and ends its attempt and its admission (the key's token quota is
// settled with the usage). fail is nil for a complete answer.
func (ex *exchange) finish(fail error) {
	if ex.done {
		return
	}
	ex.done = true
	asked := ex.unregister() // yield.go: before the attempt ends, which a critical request's yield may kill
	if ex.wd != nil {
		ex.wd.stop()
	}
	code := fasthttp.StatusOK
	if fail != nil {
		code = status(fail).status
		if errors.Is(fail, errClientGone) {
			ex.s.m.ClientDisconnects.WithLabelValues("streaming").Inc()
		}
	} else if ex.upstreamError {
		code = fasthttp.StatusBadGateway
	}
	if fail == nil && !ex.upstreamError && ex.sum.Stream {
		ex.storeStreamed() // respcache.go, when the request is cached
	}
	ex.noteEnd(fail)
	ex.countEnd(ex.cur) // streamend.go: the metric and, for a broken stream, its warn line
	backend := "none"
	if a := ex.cur; a != nil {
		backend = a.name
		ex.charge(a) // cost.go
		ex.endAttempt(a, fail)
		ex.cur = nil
	}
	if asked {
		ex.rec.yield.freed() // the seat asked for is free
	}
	ex.noteFailure(fail) // trace.go
	ex.record(code, backend)
}

// record counts a finished request and settles its admission.
func (ex *exchange) record(code int, backend string) {
	ex.code = code
	model := ""
	if ex.model != nil {
		model = ex.model.Name
	}
	m := ex.s.m
	op, asked := ex.operation(), ""
	if ex.asked != nil {
		asked = ex.asked.Name
	}
	var sr *children // the answering backend's series, when the request's labels are theirs (children.go)
	if s := ex.sr; s != nil && ex.srEnd.b.Name() == backend && s.op == op && s.asked == asked && s.served == model {
		sr = s
	}
	provider := ""
	if sr == nil || code != 200 {
		provider = ex.provider(backend)
	}
	if sr != nil && code == 200 {
		sr.requestsOK.Inc()
	} else {
		m.Requests.WithLabelValues(model, backend, codeLabel(code)).Inc()
	}
	now := time.Now()
	if et := metrics.ErrorType(code); sr != nil && et == "" {
		sr.duration.Observe(now.Sub(ex.arrival).Seconds())
	} else {
		m.Duration.WithLabelValues(op, provider, asked, model, et).Observe(now.Sub(ex.arrival).Seconds())
	}
	ex.settleCost()                           // cost.go
	ex.s.rings.record(ex, code, backend, now) // decisions.go: the status page's charts and decisions
	if ex.hasUsage && model != "" {
		if sr != nil {
			sr.tokensIn.Observe(float64(ex.usage.PromptTokens))
			sr.tokensOut.Observe(float64(ex.usage.CompletionTokens))
		} else {
			m.Tokens.WithLabelValues(op, provider, asked, model, "input").Observe(float64(ex.usage.PromptTokens))
			m.Tokens.WithLabelValues(op, provider, asked, model, "output").Observe(float64(ex.usage.CompletionTokens))
		}
	}
	if ex.limited {
		used := int64(ex.usage.PromptTokens + ex.usage.CompletionTokens)
		if !ex.hasUsage {
			used = int64(ex.sum.PromptTokens + ex.tokens)
		}
		ex.snap.Limiter.Settle(ex.key, &ex.quota, used)
		ex.limited = false
	}
	ex.observe(code, backend) // observe.go: the span's end and the access log line
}

// codeLabels are the status codes as label values: strconv.Itoa allocates for every code above 99, once per
// request on the counter of requests.
var codeLabels = func() (l [600]string) {
	for i := range l {
		l[i] = strconv.Itoa(i)
	}
	return l
}()

// codeLabel returns code as a label value, without allocating for a valid HTTP status.
func codeLabel(code int) string {
	if code >= 0 && code < len(codeLabels) {
		return codeLabels[code]
	}
	return strconv.Itoa(code)
}

// rewriteModel appends body, a whole JSON answer, to dst with its model renamed from up to pub: a route that
// maps a public model name to another upstream name gives the client back the name it asked for. Only the
// answer's own model member changes (openai.AppendRenamedModel), never content that mentions a model.
func rewriteModel(dst, body []byte, up, pub string) []byte {
	return openai.AppendRenamedModel(dst, body, body, up, pub)
}
