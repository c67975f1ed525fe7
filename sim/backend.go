package sim

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard/switchyard/openai"
)

// maxBodyBytes bounds a request body. A prompt that long is far past any context the KV cache holds.
const maxBodyBytes = 64 << 20

// Backend is one simulated engine behind the OpenAI API, serving HTTP on its own listener with its own engine loop
// and metrics registry, in vLLM's surface or another dialect's (Config.Dialect).
//
// Endpoints: POST /v1/chat/completions and /v1/completions (streaming or not), GET /v1/models, GET /health,
// GET /metrics, GET/POST /sim/control (faults) and POST /sim/predict (an oracle's ground truth); and beyond chat (see the package doc): /v1/embeddings,
// /v2/embed, /rerank (also /v1/ and /v2/), /score (also /v1/), /v1/responses (with GET /v1/responses/{id} and
// POST .../cancel), /v1/messages, /tokenize, /detokenize, /v1/audio/transcriptions and /v1/audio/translations; under DialectSGLang GET /get_server_info and /server_info,
// under DialectTGI GET /info. Every response carries X-Sim-Backend: <Name>, and echoes
// X-Request-Id when the request has one.
//
// It is served with net/http rather than fasthttp, by measurement (bench/results/simulator-itl.md): net/http
// cancels a request's context as soon as the client hangs up, even while its sequence is still queued and
// nothing is being written, which fasthttp cannot notice until a write fails.
//
// A Backend is safe for concurrent use. It runs two goroutines of its own (the engine loop and the HTTP server),
// one per background response while it generates, plus net/http's per-connection ones, and Close stops all of
// them.
type Backend struct {
	cfg     Config
	eng     *engine
	srv     *http.Server
	url     string
	nameHdr []string

	responses *responseStore
	bg        sync.WaitGroup // background responses' goroutines (see runBackground)

	rngMu sync.Mutex
	rng   *rand.Rand
	ids   atomic.Uint64

	serveDone chan struct{}
	serveErr  error
	stopCtx   atomic.Pointer[func() bool] // unregisters the ctx hook; nil until Start has registered it
	closeOnce sync.Once
	closeErr  error
}

// Start validates cfg, listens on cfg.Listen and serves until Close is called or ctx is done (then it closes
// itself; call Close anyway to wait for it). The address is bound when Start returns, so URL is usable at once.
func Start(ctx context.Context, cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	addr := cfg.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sim: %s: listen: %w", cfg.Name, err)
	}
	b := newBackend(cfg, realClock{})
	b.url = "http://" + ln.Addr().String()
	b.srv = &http.Server{
		Handler:           b,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          nil,
	}
	go b.eng.run()
	go func() {
		defer close(b.serveDone)
		if err := b.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			b.serveErr = fmt.Errorf("sim: %s: serve: %w", cfg.Name, err)
		}
	}()
	stop := context.AfterFunc(ctx, func() { _ = b.Close() })
	b.stopCtx.Store(&stop)
	return b, nil
}

func newBackend(cfg Config, clock timeSource) *Backend {
	name := xxhash.Sum64String(cfg.Name)
	return &Backend{
		cfg:       cfg,
		eng:       newEngine(cfg, clock),
		nameHdr:   []string{cfg.Name},
		responses: newResponseStore(),
		rng:       rand.New(rand.NewPCG(cfg.Seed, name)),
		serveDone: make(chan struct{}),
	}
}

// URL is the backend's base URL, "http://127.0.0.1:PORT" (append /v1 for an OpenAI SDK's base URL).
func (b *Backend) URL() string { return b.url }

// Name is Config.Name.
func (b *Backend) Name() string { return b.cfg.Name }

// Region is Config.Region.
func (b *Backend) Region() string { return b.cfg.Region }

// Config returns the configuration the backend runs with.
func (b *Backend) Config() Config { return b.cfg }

// Close stops the backend: the engine ends every request in flight (their connections close without [DONE]),
// the listener closes, and Close waits for the engine loop, the server and its handlers to return. It is safe to
// call more than once and from several goroutines; each call returns the same error.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		if stop := b.stopCtx.Load(); stop != nil {
			(*stop)()
		}
		b.eng.close(true)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := b.srv.Shutdown(ctx); err != nil {
			_ = b.srv.Close()
		}
		<-b.serveDone
		b.bg.Wait() // the engine has killed their sequences
		b.closeErr = b.serveErr
	})
	return b.closeErr
}

// ServeHTTP is the backend's HTTP handler (see Backend for the endpoints).
func (b *Backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["X-Sim-Backend"] = b.nameHdr
	if id := r.Header.Get("X-Request-Id"); id != "" {
		h.Set("X-Request-Id", id)
	}
	switch r.URL.Path {
	case "/sim/control":
		b.serveControl(w, r)
		return
	case "/sim/predict":
		b.servePredict(w, r)
		return
	}
	if b.cfg.RTT > 0 {
		t := time.NewTimer(b.cfg.RTT)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	switch r.URL.Path {
	case "/v1/chat/completions":
		b.serveCompletion(w, r, openai.Chat)
	case "/v1/completions":
		b.serveCompletion(w, r, openai.Completions)
	case "/v1/embeddings":
		b.serveEmbeddings(w, r)
	case "/v2/embed":
		b.serveCohereEmbed(w, r)
	case "/v1/responses":
		b.serveResponses(w, r)
	case "/v1/messages":
		b.serveMessages(w, r)
	case "/tokenize":
		b.serveTokenize(w, r)
	case "/detokenize":
		b.serveDetokenize(w, r)
	case "/rerank", "/v1/rerank", "/v2/rerank":
		b.serveRerank(w, r)
	case "/score", "/v1/score":
		b.serveScore(w, r)
	case "/v1/audio/transcriptions":
		b.serveAudio(w, r, false)
	case "/v1/audio/translations":
		b.serveAudio(w, r, true)
	case "/v1/models":
		b.serveGet(w, r, b.serveModels)
	case "/health":
		b.serveGet(w, r, func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) })
	case "/metrics":
		b.serveGet(w, r, func(w http.ResponseWriter) {
			promhttp.HandlerFor(b.eng.metrics().reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
		})
	default:
		if strings.HasPrefix(r.URL.Path, "/v1/responses/") {
			b.serveResponses(w, r)
			return
		}
		if serve := b.infoHandler(r.URL.Path); serve != nil {
			b.serveGet(w, r, serve)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"detail":"Not Found"}`+"\n")
	}
}

func (b *Backend) serveGet(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "Method Not Allowed")
		return
	}
	if b.eng.getFaults().Down {
		writeError(w, http.StatusServiceUnavailable, "The engine is down.")
		return
	}
	serve(w)
}

func (b *Backend) serveModels(w http.ResponseWriter) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	body, _ := json.Marshal(struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{
		ID: b.cfg.Model, Object: "model", Created: b.eng.startTime().Unix(), OwnedBy: "vllm", Root: b.cfg.Model,
		MaxModelLen: b.cfg.maxContextTokens(),
	}}})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n'))
}

// failDraw reports whether this request is one of the FailRate share answered with a 500.
func (b *Backend) failDraw(rate float64) bool {
	if rate <= 0 {
		return false
	}
	b.rngMu.Lock()
	defer b.rngMu.Unlock()
	return b.rng.Float64() < rate
}

// requestID is the response id's suffix: the client's X-Request-Id if it sent one (as vLLM does), else a fresh
// one.
func (b *Backend) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], b.ids.Add(1))
	binary.LittleEndian.PutUint64(buf[8:], uint64(time.Now().UnixNano()))
	return strconv.FormatUint(xxhash.Sum64(buf[:]), 16) + strconv.FormatUint(xxhash.Sum64String(b.cfg.Name), 16)
}

func (b *Backend) serveCompletion(w http.ResponseWriter, r *http.Request, ep openai.Endpoint) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "Method Not Allowed")
		return
	}
	faults := b.eng.getFaults()
	if faults.Down {
		writeError(w, http.StatusServiceUnavailable, "The engine is down.")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Request body larger than %d bytes.", tooBig.Limit))
			return
		}
		return // the client went away while sending
	}
	req, maxTokens, err := parseRequest(ep, body)
	if err != nil {
		writeParseError(w, err)
		return
	}
	if req.Model != "" && req.Model != b.cfg.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	if req.Priority != 0 && b.cfg.SchedulingPolicy != PolicyPriority {
		// As vLLM's engine client: a priority needs --scheduling-policy priority.
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Got priority %d but Priority scheduling is not enabled.",
			req.Priority))
		return
	}
	prompt, err := openai.AppendPrompt(nil, ep, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	promptTokens := max(openai.EstimateTokens(len(prompt)), 1)
	maxCtx := b.cfg.maxContextTokens()
	if maxTokens == 0 {
		maxTokens = min(b.cfg.DefaultMaxTokens, maxCtx-promptTokens)
	}
	if maxTokens > maxCtx-promptTokens || maxTokens < 1 { // (not prompt+max > ctx: max may be near MaxInt)
		writeError(w, http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. "+
			"However, you requested %d tokens (%d in the messages, %d in the completion). "+
			"Please reduce the length of the messages or completion.",
			maxCtx, promptTokens+maxTokens, promptTokens, maxTokens))
		return
	}
	if b.failDraw(faults.FailRate) {
		writeError(w, http.StatusInternalServerError, "Simulated engine failure (fail_rate).")
		return
	}
	s := newSeq(promptTokens, maxTokens, b.blockHashes(prompt))
	s.priority = req.Priority
	s.stalled = faults.StallRate > 0 && b.failDraw(faults.StallRate)
	seed := textSeed(b.cfg.Seed, prompt)
	if err := b.eng.submit(s); err != nil {
		writeSubmitError(w, err, writeError)
		return
	}
	prefix := "cmpl-"
	if ep == openai.Chat {
		prefix = "chatcmpl-"
	}
	enc := newEncoder(ep == openai.Chat, prefix+b.requestID(r), time.Now().Unix(), b.cfg.Model)
	if req.Stream {
		b.stream(w, r, s, enc, seed, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	} else {
		b.complete(w, r, s, enc, seed)
	}
}

func writeParseError(w http.ResponseWriter, err error) {
	var br *badRequest
	if errors.As(err, &br) {
		writeError(w, br.status, br.msg)
		return
	}
	writeError(w, http.StatusBadRequest, err.Error())
}

// stream relays s as SSE: on each wake-up it writes every token the engine produced since the last one, in one
// write and one flush. A client that hangs up aborts s at once; a killed sequence (down, restart, Close) drops
// the connection without [DONE], as a crashed engine would.
func (b *Backend) stream(w http.ResponseWriter, r *http.Request, s *seq, enc *encoder, seed uint64, usage bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		b.eng.abort(s)
		return
	}
	buf := make([]byte, 0, 4096)
	sent := 0
	done := r.Context().Done()
	for {
		select {
		case <-s.notify:
		case <-done:
			b.eng.abort(s)
			return
		}
		end := s.end.Load() // before emitted: the engine stores emitted first, so a final end sees every token
		if end == endKilled {
			panic(http.ErrAbortHandler)
		}
		n := int(s.emitted.Load())
		buf = buf[:0]
		for ; sent < n; sent++ {
			if sent == 0 && enc.chat {
				buf = enc.appendRole(buf)
			}
			buf = enc.appendToken(buf, word(seed, sent), sent+1 == s.maxTokens)
		}
		finished := end == endLength
		if finished {
			if usage {
				buf = enc.appendUsageChunk(buf, s.prompt, sent, s.cachedTokens())
			}
			buf = append(buf, doneEvent...)
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				b.eng.abort(s)
				return
			}
			if err := rc.Flush(); err != nil {
				b.eng.abort(s)
				return
			}
		}
		if finished || end == endAbort {
			return
		}
	}
}

// complete waits for s to finish and answers the whole completion at once.
func (b *Backend) complete(w http.ResponseWriter, r *http.Request, s *seq, enc *encoder, seed uint64) {
	done := r.Context().Done()
wait:
	for {
		select {
		case <-s.notify:
		case <-done:
			b.eng.abort(s)
			return
		}
		switch s.end.Load() {
		case endLength:
			break wait
		case endKilled:
			panic(http.ErrAbortHandler)
		case endAbort:
			return
		}
	}
	text := make([]byte, 0, 8*s.maxTokens)
	for i := range s.maxTokens {
		text = append(text, word(seed, i)...)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(enc.appendBody(nil, text, s.prompt, s.maxTokens, s.cachedTokens()))
}
