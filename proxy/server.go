package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// Options are the gateway's static settings: they take effect at start and need a restart to change. Every
// zero field means its documented default.
type Options struct {
	// MaxBodyBytes bounds a client's request body; larger bodies get 413, refused from the Content-Length before
	// any of the body is read. Default 32 MiB: a chat request with a long context (a million tokens of text is
	// about 4 MB) and images inline as base64 (OpenAI takes images up to 20 MB, 27 MB as base64), or an audio
	// upload of the 25 MB OpenAI accepts, each fits; larger bodies are not requests any engine serves.
	MaxBodyBytes int
	// MaxConns bounds the client connections the gateway holds at once; beyond it new connections are closed
	// at once. Default 16384: far above what one replica serves (its streams are bounded by the fleet's seats),
	// far below what exhausts its memory (a connection costs about 20 KiB idle).
	MaxConns int
	// MaxConnsPerIP bounds the connections from one client address. Default 0, no bound: behind an ingress or a
	// NAT every client shares one address, and a bound would refuse them all together.
	MaxConnsPerIP int
	// WriteTimeout bounds how long a write to a client may block: a client that reads nothing for this long
	// while the gateway has an answer for it is gone, and the answer (and its upstream attempt) ends. Each
	// event of a stream gets a new bound, so a long stream read steadily is never cut. Default 30 s.
	WriteTimeout time.Duration
	// MaxPreFirstTokenBytes bounds what an engine may send before the first token (role chunks, comments,
	// events without content): past it the attempt fails as a protocol error (502, another backend may be
	// tried). Default 1 MiB: engines send a few hundred bytes before the first token.
	MaxPreFirstTokenBytes int
	// MaxResponseBytes bounds an upstream answer the gateway holds whole: one read whole (embeddings and
	// pass-through routes) and one assembled from a stream for a client that did not stream. Past it the
	// answer is a 502. Default 64 MiB.
	MaxResponseBytes int
	// HeaderTimeout bounds reading a client's request (headers and body), against slow clients, from the request's
	// first byte; a new connection's first byte must come within it of the accept. Default 30 s.
	HeaderTimeout time.Duration
	// IdleTimeout closes a client's keep-alive connection after this long without a request. Default 120 s.
	IdleTimeout time.Duration
	// CheckInterval is how often a request whose client the parker does not watch checks that its client is
	// still there (a peek system call) and that the drain has not ended: one waiting for admission or its
	// first token, or a stream that is not hijacked (HTTP/1.0, TLS). A hijacked stream's client connection is
	// watched by the parker, which reports its close at once (docs/design.md, "Parked streams"). Default
	// 250 ms: a vanished client is noticed, and its engine request cancelled, well within a second.
	CheckInterval time.Duration
	// KeepAliveInterval is how long a committed stream may be silent (its engine thinking, or a tool call
	// being built) before the client gets a ": ping" SSE comment, so that proxies and load balancers between
	// the client and the gateway do not take the connection for idle. Default 10 s: under the shortest idle
	// bound common intermediaries apply by default (20 s), and a comment of 8 bytes per 10 s of silence costs
	// nothing; a ping after every short silence would cost a system call per token gap.
	KeepAliveInterval time.Duration
	// Breakers tune every backend's circuit breaker.
	Breakers BreakerSettings
	// SharedBreakers, when set, shares breaker openings with the other replicas through Redis (start it after
	// New); nil keeps each replica's breakers its own.
	SharedBreakers *SharedBreakers
	// Timeouts are the defaults for backends that set none. Defaults: connect 3 s, first byte 60 s, idle 60 s,
	// total 30 min.
	Timeouts routing.Timeouts
	// Metrics receives the gateway's metrics; required.
	Metrics *metrics.Gateway
	// Logger receives the gateway's logs; default slog.Default().
	Logger *slog.Logger
	// Tracer receives a server span per request and a client span per attempt on a backend (trace.go), and the
	// attempts carry their span's W3C traceparent upstream; its scope should be TracerName. nil disables
	// tracing: no span is created and nothing is added per request, and the client's traceparent goes upstream
	// as it came.
	Tracer trace.Tracer
	// AccessLog receives one line per request, at info level (accesslog.go); nil disables the access log.
	AccessLog *slog.Logger
	// AccessLogSample is the share of successful requests the access log keeps, in (0, 1]; failed requests
	// (status 400 and above) are always logged. 0 means 1: every request.
	AccessLogSample float64
}

func (o *Options) setDefaults() {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 32 << 20
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 64 << 20
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 16384
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.MaxPreFirstTokenBytes <= 0 {
		o.MaxPreFirstTokenBytes = 1 << 20
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = 30 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 120 * time.Second
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = 250 * time.Millisecond
	}
	if o.KeepAliveInterval <= 0 {
		o.KeepAliveInterval = 10 * time.Second
	}
	def := routing.Timeouts{Connect: 3 * time.Second, FirstByte: 60 * time.Second, Idle: 60 * time.Second, Total: 30 * time.Minute}
	if o.Timeouts.Connect <= 0 {
		o.Timeouts.Connect = def.Connect
	}
	if o.Timeouts.FirstByte <= 0 {
		o.Timeouts.FirstByte = def.FirstByte
	}
	if o.Timeouts.Idle <= 0 {
		o.Timeouts.Idle = def.Idle
	}
	if o.Timeouts.Total <= 0 {
		o.Timeouts.Total = def.Total
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Server is the client-facing gateway: the OpenAI-compatible API on fasthttp and the request path behind it.
//
// Concurrency: one Server serves many connections; its state is atomics, pools and the snapshot Source.
type Server struct {
	src   Source
	opts  Options
	m     *metrics.Gateway
	log   *slog.Logger
	ups   *upstreams
	brk   *breakers
	srv   *fasthttp.Server
	conns *connLimits // the client connections held (linger.go)

	// Admission state that outlives policy reloads (admit.go).
	caps     *admission.Caps
	outliers *admission.OutlierDetector
	retries  *admission.RetryBudget
	brownout admission.Brownout
	queues   sync.Map  // model name -> *admission.Queue[*exchange]
	hedges   sync.Map  // model name -> *admission.HedgeBudget
	reserves sync.Map  // model name -> *admission.SeatReserve
	yields   sync.Map  // model name -> *yielders (yield.go)
	cals     sync.Map  // model name -> *admission.Calibration
	homes    *homes    // where each stored response lives (responses.go)
	orphans  orphanSet // hedges' losers reading on to their first token (exchange.abandon)
	followMu sync.Mutex
	followed atomic.Pointer[resolved] // the last snapshot installed, with its records (records.go)

	// panicAt, set by tests before serving, is called at the start of each stage of the request path, so that
	// tests can make a stage panic (recover.go); nil in production.
	panicAt func(stage string)
	// attemptHook, set by tests before serving, replaces the network part of every attempt (send and read to
	// the first content): the request path's decisions then run without backends; nil in production.
	attemptHook func(a *attempt) error
	// clock reads the time for the request path's decisions (clock.go); tests replace it before serving.
	clock clock
	// shutdownListener closes the listener and waits for its connections to end (fasthttp's
	// ShutdownWithContext); tests that drain a server without connections replace it before Shutdown.
	shutdownListener func(context.Context) error

	exchanges    sync.Pool
	active       sync.WaitGroup
	draining     atomic.Bool // set at Shutdown: /readyz fails, new requests are still served until the listener closes
	measured     atomic.Bool // every backend had its first measure, or measureWait passed (Ready)
	born         time.Time   // when New returned
	drainExpired atomic.Bool // set when the drain timeout ends: in-flight requests are ended
	watched      watchedSet  // the watchdogs of hijacked streams, whose client the parker watches (watchdog.go)

	rings statusRings // the status page's charts and recent decisions (decisions.go, timeseries.go)
}

// New returns a Server reading its routing policy from src. It does not listen; call Serve.
func New(src Source, opts Options) (*Server, error) {
	if src == nil {
		return nil, errors.New("proxy: nil Source")
	}
	if opts.Metrics == nil {
		return nil, errors.New("proxy: Options.Metrics is required")
	}
	opts.setDefaults()
	s := &Server{src: src, opts: opts, m: opts.Metrics, log: opts.Logger, ups: newUpstreams(), clock: systemClock{},
		homes: newHomes(defaultHomesMax, defaultHomesTTL, nil), conns: newConnLimits(opts.MaxConns, opts.MaxConnsPerIP)}
	s.born = time.Now()
	s.caps = admission.NewCaps(admission.DefaultCapParams(), opts.Metrics)
	s.outliers = admission.NewOutlierDetector(admission.DefaultOutlierParams(), nil, opts.Metrics, opts.Logger)
	s.retries = admission.NewRetryBudget(20, 3, opts.Metrics)
	s.brownout = admission.DefaultBrownout()
	s.brk = newBreakers(opts.Breakers, func(b *routing.Backend, st gobreaker.State) {
		s.m.BreakerState.WithLabelValues(b.Name()).Set(float64(breakerGauge(st)))
		if st != gobreaker.StateHalfOpen {
			// Opening, the breaker takes the hard failures over; closing, the backend has just answered its
			// probes: either way the outlier detector's window of the outage is stale (admission.Outlier.Reset).
			if o := s.outliers.Get(b.Name()); o != nil {
				o.Reset()
			}
		}
		s.log.Warn("circuit breaker", "backend", b.Name(), "state", st.String())
	})
	if sb := opts.SharedBreakers; sb != nil {
		s.brk.shared = sb
		sb.attach(s)
	}
	s.srv = &fasthttp.Server{
		Handler:            s.handle,
		ErrorHandler:       s.handleError,
		HeaderReceived:     s.headerReceived,
		ExpectHandler:      s.expect,
		Name:               "switchyard",
		MaxRequestBodySize: opts.MaxBodyBytes,
		ReadTimeout:        opts.HeaderTimeout,
		IdleTimeout:        opts.IdleTimeout,
		ReadBufferSize:     clientReadBuffer, // also the bound on request header size
		WriteBufferSize:    clientWriteBuffer,
		// A connection gives its read buffer back once a request is read, so that an open stream or an idle
		// keep-alive connection holds none; clientread.go keeps this from costing a read system call.
		ReduceMemoryUsage:     true,
		NoDefaultServerHeader: true,
		// The listener bounds connections (linger.go, connLimits), hijacked ones included; fasthttp counts only
		// those it serves, never more, so its bound is never reached.
		Concurrency: opts.MaxConns,
		// The write deadline fasthttp sets before it writes a response; a stream moves it forward at each
		// event (watchdog.write), so it bounds a stalled client, never a long stream.
		WriteTimeout:    opts.WriteTimeout,
		CloseOnShutdown: true,
		// A hijacked stream (hijack.go) keeps its connection and serves it on with ServeConn.
		KeepHijackedConns:             true,
		DisableHeaderNamesNormalizing: false,
		Logger:                        fasthttpLogger{opts.Logger},
	}
	s.shutdownListener = s.srv.ShutdownWithContext
	return s, nil
}

// Serve accepts connections on ln until Shutdown. It returns nil after a clean shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(lingerListener{ln, s.conns}); err != nil { // linger.go
		return fmt.Errorf("proxy: serve: %w", err)
	}
	return nil
}

// EngineBack is routing.MonitorOptions.OnBack: the Monitor found b's engine answering again after failed
// scrapes, or another process of it. An outlier ejection for the outage's errors ends, and the backend is probed
// (admission.Outlier.Back; docs/design.md, "Outlier detection"). Safe for concurrent use; it does not block.
func (s *Server) EngineBack(b *routing.Backend, restarted bool) {
	if o := s.outliers.Get(b.Name()); o != nil {
		o.Back(restarted)
	}
}

// Ready reports whether the gateway should receive traffic: not draining, past its first measure of the engines
// (at most measureWait after New), and at least one backend healthy.
func (s *Server) Ready() (bool, string) {
	if s.draining.Load() {
		return false, "draining"
	}
	snap := s.src.Snapshot()
	if snap == nil {
		return false, "no policy loaded"
	}
	if !s.measured.Load() {
		if slices.ContainsFunc(snap.Backends, (*routing.Backend).Measuring) && time.Since(s.born) < measureWait {
			return false, "measuring engines"
		}
		s.measured.Store(true) // once: an engine probed again later (a restart) is measured while serving
	}
	for _, b := range snap.Backends {
		if b.Healthy() {
			return true, "ok"
		}
	}
	return false, "no healthy backend"
}

// measureWait bounds how long a starting gateway stays unready while the Monitor takes its first measure of the
// engines (routing.Backend.Measuring): a scrape (at most a second) and, for an engine that states no seats, a
// seat probe (rounds of tens of milliseconds each, routing/seatprobe.go). An engine that takes longer is
// measured while the gateway serves.
const measureWait = 10 * time.Second

// BeginDrain makes /readyz fail with "draining" while the gateway goes on serving every request: the start of a
// shutdown grace (cmd/switchyard/serve.go), in which load balancers take the gateway out of rotation before
// Shutdown closes the listener. Safe from any goroutine; there is no way back.
func (s *Server) BeginDrain() { s.draining.Store(true) }

// Shutdown drains the gateway: /readyz fails at once, the listener closes, idle connections close, and
// in-flight requests may finish until ctx ends. Then the remaining streams get an SSE error event
// ("shutting_down") and [DONE] at their watchdog's next tick, queued requests get 503 shutting_down, and
// Shutdown waits for them to go at most drainGrace (three ticks and a second, on the server's clock, so that
// tests drive it on a virtual one), then at most another second for the listener's own shutdown.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	done := make(chan error, 1)
	go func() { done <- s.shutdownListener(ctx) }()
	var err error
	served := false // done has been read: the listener's connections are all closed
	select {
	case err = <-done:
		served = true
	case <-ctx.Done():
		err = ctx.Err()
	}
	ended := make(chan struct{}) // no request starts now (WaitGroup.Wait must not race with an Add from zero)
	go func() { s.active.Wait(); close(ended) }()
	if served {
		// Hijacked streams (hijack.go) are no longer the listener's: they too may finish until ctx ends.
		select {
		case <-ended:
		case <-ctx.Done():
		}
	}
	s.drainExpired.Store(true)
	s.watched.abortAll(errShutdown)
	s.orphans.close(errShutdown)
	s.closeQueues()
	grace := s.clock.NewTimer(s.drainGrace())
	select {
	case <-ended:
	case <-grace.C():
	}
	grace.Stop()
	if !served {
		last := s.clock.NewTimer(time.Second)
		select {
		case err2 := <-done:
			if err == nil {
				err = err2
			}
		case <-last.C():
		}
		last.Stop()
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("proxy: shutdown: %w", err)
	}
	return nil
}

// drainGrace is how long Shutdown waits, after the drain timeout, for the requests it ended to go: every
// watchdog ticks within one CheckInterval, or is aborted at once (a hijacked stream, watchdogs.abortAll), and
// then writes its error event and [DONE]; three ticks and a second leave room for a slow client's last write
// (bounded by the write timeout) without holding a stop for long.
func (s *Server) drainGrace() time.Duration { return 3*s.opts.CheckInterval + time.Second }

// timeouts returns the effective timeouts for a backend: its own, else the gateway's defaults.
func (s *Server) timeouts(c *routing.BackendConfig) routing.Timeouts {
	t := c.Timeouts
	d := s.opts.Timeouts
	if t.Connect <= 0 {
		t.Connect = d.Connect
	}
	if t.FirstByte <= 0 {
		t.FirstByte = d.FirstByte
	}
	if t.Idle <= 0 {
		t.Idle = d.Idle
	}
	if t.Total <= 0 {
		t.Total = d.Total
	}
	return t
}

var (
	pathModels      = []byte("/v1/models")
	pathModelsSlash = []byte("/v1/models/")
)

// maxEcho bounds how much of a client's input (a path, a model name) an error message repeats.
const maxEcho = 256

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	if rt, id := lookupRoute(ctx.Method(), path); rt != nil {
		s.serveProxy(ctx, rt, id)
		return
	}
	if bytes.Equal(path, pathModels) || bytes.HasPrefix(path, pathModelsSlash) {
		s.serveModels(ctx, path)
		return
	}
	s.plainError(ctx, fasthttp.StatusNotFound, "invalid_request_error", "not_found",
		"the gateway serves no endpoint "+string(truncate(path, maxEcho))+" (see the endpoint table in README.md)")
}

// truncate returns b cut to at most n bytes, with "..." when it was longer.
func truncate(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(b[:n:n], "..."...)
}

// refusedBodyBytes bounds the body the gateway reads of a request it refuses from its headers. Reading a small
// body whole lets the client, which may still be writing it, read the refusal on a connection that stays
// open; a larger one is not read: the refusal is sent and the connection closed, so a client still writing
// sees the connection reset (one that sends Expect: 100-continue gets the refusal before it sends the body).
// 64 KiB holds nearly every chat request, and costs at most that per connection (Options.MaxConns bounds them).
const refusedBodyBytes = 64 << 10

// headerReceived runs once a request's headers are in, before its body is read: a request the gateway will
// refuse anyway (a key that does not authenticate, an endpoint it does not serve) gets a body bound of
// refusedBodyBytes, so a large body is never read into memory; handleError then answers it with the real
// reason. A body longer than MaxBodyBytes is refused from its Content-Length by fasthttp itself.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if s.refuseEarly(h) != nil {
		return fasthttp.RequestConfig{MaxRequestBodySize: refusedBodyBytes}
	}
	return fasthttp.RequestConfig{}
}

// expect answers a request that sent "Expect: 100-continue": the status it will be refused with, judged from
// its headers (so the client never sends the body), or 100 Continue.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	h := &ctx.Request.Header
	if err := s.refuseEarly(h); err != nil {
		return status(err).status
	}
	if n := h.ContentLength(); n > s.opts.MaxBodyBytes {
		return fasthttp.StatusRequestEntityTooLarge
	}
	return fasthttp.StatusContinue
}

// refuseEarly returns why a request will be refused, judging from its headers alone, or nil.
func (s *Server) refuseEarly(h *fasthttp.RequestHeader) error {
	if snap := s.src.Snapshot(); snap != nil && snap.Keys != nil {
		if _, err := snap.Keys.Authenticate(h.Peek(fasthttp.HeaderAuthorization)); err != nil {
			return err
		}
	}
	path := h.RequestURI()
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if bytes.ContainsAny(path, "%.") || bytes.Contains(path, []byte("//")) || len(path) == 0 || path[0] != '/' {
		return nil // fasthttp normalises such paths: let the handler judge the normalised one
	}
	if rt, _ := lookupRoute(h.Method(), path); rt == nil && !bytes.HasPrefix(path, pathModels) {
		return &routeError{msg: "the gateway serves no endpoint " + string(truncate(path, maxEcho)) + " (see the endpoint table in README.md)"}
	}
	return nil
}

// handleError renders fasthttp's own request errors (body too large, bad request, timeouts) as OpenAI errors.
func (s *Server) handleError(ctx *fasthttp.RequestCtx, err error) {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		// A client that sent nothing (or too little) within the read timeout: typically an HTTP client's spare
		// connection that it never used. An answer would arrive unsolicited on its idle connection, so close
		// silently, as net/http does.
		_ = ctx.Conn().Close()
		return
	}
	ctx.Response.Header.SetBytesV(headerRequestID, appendRequestID(nil, ctx.Request.Header.Peek(headerRequestID)))
	ctx.Response.Header.Set(headerBackend, "none")
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		if why := s.refuseEarly(&ctx.Request.Header); why != nil {
			err = why // the body was not read because the request is refused for this
		}
		s.logRefused(ctx, writeError(ctx, err))
		ctx.SetConnectionClose() // the unread body is still on the connection
		return
	}
	s.plainError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "bad_request", "malformed HTTP request")
	ctx.SetConnectionClose()
}

func (s *Server) plainError(ctx *fasthttp.RequestCtx, code int, typ, ecode, msg string) {
	if len(ctx.Response.Header.Peek(headerRequestID)) == 0 {
		ctx.Response.Header.SetBytesV(headerRequestID, appendRequestID(nil, ctx.Request.Header.Peek(headerRequestID)))
	}
	ctx.Response.Header.Set(headerBackend, "none")
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(openai.AppendError(nil, msg, typ, ecode, ""))
}

// serveProxy is the request path (docs/design.md, "The request path") for one inference request. It owns the exchange
// until it hands a streaming answer to fasthttp (the relay then owns it, and Close releases it); every other answer
// is written and the exchange released here. A panic anywhere on the way is recovered (recover.go).
func (s *Server) serveProxy(ctx *fasthttp.RequestCtx, rt *route, id []byte) {
	if string(ctx.Method()) != rt.method {
		ctx.Response.Header.Set(fasthttp.HeaderAllow, rt.method)
		s.plainError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use "+rt.method)
		return
	}
	s.active.Add(1)
	ex := s.acquireExchange()
	const (
		owned = iota
		handedOff
		released
	)
	phase := owned
	defer func() {
		if r := recover(); r != nil {
			s.recovered(stageHandler, r)
			if phase == owned {
				s.discard(ex)
				s.active.Done()
				panicResponse(ctx)
			}
		}
	}()
	ex.respID = append(ex.respID[:0], id...)
	if s.serveExchange(ctx, ex, rt) {
		phase = handedOff
		return
	}
	phase = released
	s.active.Done()
	s.releaseExchange(ex)
}

// serveExchange runs one exchange and writes its answer. It returns true when the answer streams: fasthttp then
// owns ex through the response body stream. Otherwise ex is finished (recorded) but not released.
func (s *Server) serveExchange(ctx *fasthttp.RequestCtx, ex *exchange, rt *route) (streaming bool) {
	ex.arrival = s.clock.Now()
	ex.rt, ex.endpoint = rt, rt.api
	ex.path = append(ex.path[:0], ctx.Path()...)
	ex.reqID = appendRequestID(ex.reqID[:0], ctx.Request.Header.Peek(headerRequestID))
	ctx.Response.Header.SetBytesV(headerRequestID, ex.reqID)
	ex.client = ctx.Conn()
	ex.clientIP = ctx.RemoteIP()
	ex.body = append(ex.reqBuf(ex.body), ctx.PostBody()...)
	ex.ctype = append(ex.ctype[:0], ctx.Request.Header.ContentType()...)
	ex.query = append(ex.query[:0], ctx.URI().QueryString()...)

	err := ex.parse()
	if err == nil {
		err = ex.route(&ctx.Request.Header)
	}
	if err == nil {
		ex.wd = newWatchdog(s, ex.client)
		s.retries.Begin()
		ex.budgeted = true
		if err = ex.admit(&ctx.Request.Header); err == nil {
			err = ex.run()
		}
	}
	if ex.quoted {
		ex.quota.AppendHeaders(ex.scratch[:0], func(name string, value []byte) {
			ctx.Response.Header.SetBytesV(name, value)
		})
	}
	ex.costHeaders(&ctx.Response.Header) // cost.go
	if err == errCacheHit {
		s.serveCached(ctx, ex) // respcache.go
		return false
	}
	if err != nil {
		s.fail(ctx, ex, err)
		return false
	}
	if ex.rc.store {
		ctx.Response.Header.Set(headerCache, "miss") // respcache.go: kept once complete
	}
	if ex.model != ex.asked {
		ctx.Response.Header.Set(headerDegraded, ex.model.Name)
	}
	if ex.sse() && ex.sum.Stream {
		ctx.Response.Header.Set(headerBackend, ex.cur.name)
		ex.continuable = ex.mayYield() // yield.go: its seat may go to a critical request
		ex.startReplay()
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set(fasthttp.HeaderCacheControl, "no-cache")
		ctx.Response.Header.Set("X-Accel-Buffering", "no")
		ex.committed = true
		// The exchange holds its own copy of the request body (serveExchange): fasthttp's goes back to its pool
		// now (ReduceMemoryUsage), not when the stream ends, so that an open stream holds one copy less.
		ctx.Request.ResetBody()
		if ex.continuable {
			ex.rec.yield.add(ex) // it keeps its body, which a continuation is built from
		} else {
			ex.shedRequest() // nor its own copies: exchange.go
		}
		if s.parkable(ctx, ex) {
			ex.hijack(ctx) // hijack.go: the relay owns ex and the connection from here
			return true
		}
		ctx.SetBodyStream(streamBody{ex}, -1) // the relay owns ex from here; Close releases it
		return true
	}
	var body []byte
	contentType := "application/json"
	if !ex.sse() { // relayed as the engine sent it: status, content type and body
		body = ex.cur.body
		ctx.SetStatusCode(ex.cur.resp.StatusCode())
		if ct := ex.cur.resp.Header.ContentType(); len(ct) > 0 {
			contentType = string(ct)
		}
	} else {
		for body, err = ex.assemble(); err != nil; body, err = ex.assemble() {
			if err = ex.retryWhole(err); err != nil {
				s.fail(ctx, ex, err)
				return false
			}
		}
	}
	if up, pub := ex.cur.target.Model, ex.model.Name; up != "" && up != pub && strings.HasPrefix(contentType, "application/json") {
		ex.modelBuf = rewriteModel(ex.modelBuf[:0], body, up, pub)
		body = ex.modelBuf
	}
	ctx.Response.Header.Set(headerBackend, ex.cur.name) // the backend that gave the answer, after any retry
	if ex.sse() {
		ctx.SetStatusCode(fasthttp.StatusOK)
	}
	ex.rememberWhole(body) // responses.go: where a stored response lives, or that it is gone
	ctx.SetContentType(contentType)
	ctx.SetBody(body)
	ex.storeCache(body) // respcache.go, when the request is cached
	ex.finish(nil)
	return false
}

// fail answers a request that got no answer with its error, and records it.
func (s *Server) fail(ctx *fasthttp.RequestCtx, ex *exchange, err error) {
	backend := "none"
	if ex.cur != nil {
		backend = ex.cur.name
	} else if n := len(ex.tried); n > 0 {
		backend = ex.tried[n-1].Name()
	}
	ctx.Response.Header.Set(headerBackend, backend)
	var e apiError
	var ue *upstreamError
	if ex.rt != nil && ex.rt.intact() && errors.As(err, &ue) && ue.kind == kindStatus && ue.body != nil {
		// The engine's own answer to a pass-through request, status and body as they came.
		e.status = ue.status
		ctx.SetStatusCode(ue.status)
		if ue.contentType != "" {
			ctx.SetContentType(ue.contentType)
		}
		ctx.SetBody(ue.body)
	} else {
		e = writeErrorFor(ctx, ex.endpoint, err)
	}
	if errors.Is(err, errClientGone) {
		s.m.ClientDisconnects.WithLabelValues("waiting").Inc()
	}
	if ex.wd != nil {
		ex.wd.stop()
	}
	if ex.cur != nil {
		ex.endAttempt(ex.cur, err)
		ex.cur = nil
	}
	ex.done = true
	ex.noteFailure(err) // trace.go
	ex.note.failed(err) // decisions.go: the shed reason, for the status page
	ex.record(e.status, backend)
}

// headerDegraded names the model that served a request under brownout, when it is not the one asked for.
const headerDegraded = "X-Switchyard-Degraded-To"

// streamBody hands the exchange to fasthttp as the response body and marks the end of the request for
// Shutdown when fasthttp closes it.
type streamBody struct{ *exchange }

func (b streamBody) Close() error {
	s := b.s
	defer s.active.Done()
	defer func() {
		if r := recover(); r != nil {
			s.recovered(stageRelay, r)
		}
	}()
	return b.exchange.Close()
}

// route resolves the model and prepares what every attempt needs.
func (ex *exchange) route(h *fasthttp.RequestHeader) error {
	snap := ex.s.src.Snapshot()
	if snap == nil {
		return routing.ErrNoBackend
	}
	res := ex.s.follow(snap)
	if ex.rt.byID {
		if err := ex.locate(snap); err != nil { // responses.go: the model and backend of the stored response
			return err
		}
	}
	m := snap.Models[string(ex.sum.Model)]
	if m == nil {
		return fmt.Errorf("proxy: the model %q does not exist: %w", truncate(ex.sum.Model, maxEcho), errModelNotFound)
	}
	if !m.Endpoints.Has(ex.rt.group) {
		return notEnabled(ex.path, m.Name, ex.rt.group)
	}
	if err := ex.pinHome(m); err != nil { // responses.go: a stored response's follow-ups go to its backend
		return err
	}
	ex.snap, ex.asked, ex.model, ex.rec = snap, m, m, res.models[m]
	ex.rreq.Model = m.Name
	ex.rreq.PromptTokens = ex.sum.PromptTokens
	ex.rreq.MaxTokens = ex.sum.MaxTokens
	ex.rreq.Prompt = ex.sum.Prompt
	ex.rreq.PrevTurn = ex.sum.PrevTurn
	ex.rreq.ITLSLO = m.SLO.ITL
	ex.injectedUsage = (ex.endpoint == openai.Chat || ex.endpoint == openai.Completions) && !(ex.sum.Stream && ex.sum.IncludeUsage)
	copyRequestHeaders(&ex.fwd, h)
	return nil
}

// serveModels answers GET /v1/models and GET /v1/models/{id} from the policy: the models the gateway serves.
func (s *Server) serveModels(ctx *fasthttp.RequestCtx, path []byte) {
	if !ctx.IsGet() {
		ctx.Response.Header.Set(fasthttp.HeaderAllow, fasthttp.MethodGet)
		s.plainError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use GET")
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	snap := s.src.Snapshot()
	if snap == nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, "server_error", "overloaded", "no policy loaded")
		return
	}
	var out any
	if id := path[len(pathModels):]; len(id) > 1 {
		m := snap.Models[string(id[1:])]
		if m == nil {
			s.plainError(ctx, fasthttp.StatusNotFound, "invalid_request_error", "model_not_found",
				fmt.Sprintf("the model %q does not exist", truncate(id[1:], maxEcho)))
			return
		}
		out = model{ID: m.Name, Object: "model", Created: m.Created, OwnedBy: "switchyard"}
	} else {
		list := struct {
			Object string  `json:"object"`
			Data   []model `json:"data"`
		}{Object: "list", Data: make([]model, 0, len(snap.ModelNames))}
		for _, name := range snap.ModelNames {
			if m := snap.Models[name]; m != nil {
				list.Data = append(list.Data, model{ID: m.Name, Object: "model", Created: m.Created, OwnedBy: "switchyard"})
			}
		}
		out = list
	}
	body, _ := json.Marshal(out)
	ctx.Response.Header.SetBytesV(headerRequestID, appendRequestID(nil, ctx.Request.Header.Peek(headerRequestID)))
	ctx.Response.Header.Set(headerBackend, "none")
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// fasthttpLogger sends fasthttp's own messages to slog at debug level: they are about single connections
// (a client that left, a malformed request) and the request path already counts those in metrics.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	if f.l.Enabled(context.Background(), slog.LevelDebug) {
		// fasthttp's messages may quote a whole raw request, credentials included.
		f.l.Debug(redact(fmt.Sprintf(format, args...)), "component", "fasthttp")
	}
}

// Credentials that a raw request or header dump may carry: the value of a credential header, and any bearer
// token wherever it appears.
var (
	credentialHeader = regexp.MustCompile(`(?i)((?:proxy-)?authorization|api-key|x-api-key|cookie|set-cookie)(\s*[:=]\s*)[^\r\n\\"]*`)
	bearerToken      = regexp.MustCompile(`(?i)(bearer)(\s+)[^\s"',;]+`)
)

// redact returns s with every credential replaced by [redacted].
func redact(s string) string {
	s = credentialHeader.ReplaceAllString(s, "$1$2[redacted]")
	return bearerToken.ReplaceAllString(s, "$1$2[redacted]")
}

// breakerGauge is switchyard_breaker_state's value: 0 closed, 1 half-open, 2 open.
func breakerGauge(st gobreaker.State) int {
	switch st {
	case gobreaker.StateHalfOpen:
		return 1
	case gobreaker.StateOpen:
		return 2
	}
	return 0
}
