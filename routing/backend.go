package routing

import (
	"sync/atomic"
	"time"
)

// Engine names the kind of server behind a backend, which decides how its metrics are scraped.
const (
	EngineVLLM   = "vllm"   // vLLM: scrape vllm:* metrics
	EngineSGLang = "sglang" // SGLang: scrape sglang:* metrics
	EngineOpenAI = "openai" // a hosted OpenAI-compatible API: nothing to scrape
)

// Timeouts bound one upstream attempt. Zero means "no bound" for that phase; policy fills the defaults.
type Timeouts struct {
	// Connect bounds dialing the backend (TCP, and TLS when the URL is https).
	Connect time.Duration
	// FirstByte bounds the wait from sending the request to the first byte of the response headers: the
	// engine's queue plus prefill. An attempt that times out here has sent nothing to the client and is retried.
	FirstByte time.Duration
	// Idle bounds the silence between two chunks of a streaming response (a stalled decode).
	Idle time.Duration
	// Total bounds the whole attempt, streaming included. Long generations take minutes: keep it generous.
	Total time.Duration
}

// BackendConfig is a backend's static description, as the policy declares it. It is immutable once built: a
// reload that changes it installs a new BackendConfig on the same Backend.
type BackendConfig struct {
	// Name identifies the backend in metrics, headers (X-Switchyard-Backend) and logs. Unique.
	Name string
	// URL is the base URL without a trailing slash (scheme://host:port[/prefix]); request paths such as
	// /v1/chat/completions are appended to it. Only the policy sets it: nothing a client sends can choose it.
	URL string
	// Region is where the backend runs, compared with the gateway's own region for RTT and failover.
	Region string
	// Engine is EngineVLLM, EngineSGLang or EngineOpenAI.
	Engine string
	// APIKey, when set, replaces the client's Authorization header upstream ("Bearer <APIKey>").
	APIKey string
	// Models are the upstream model names this backend serves.
	Models []string
	// Weight is the backend's relative share for weighted strategies; 1 when unset.
	Weight float64
	// MaxConcurrency caps requests in flight to this backend; 0 means no fixed cap.
	MaxConcurrency int
	// Timeouts bound each attempt sent to this backend.
	Timeouts Timeouts
}

// Backend is one upstream server and its live state. Backends outlive policy reloads: the Registry keeps the
// same *Backend for the same name and URL, so learned state survives an edit of unrelated fields.
//
// Concurrency: every method is safe for concurrent use; the request path reads atomics and never locks.
// A Backend must not be copied.
type Backend struct {
	cfg atomic.Pointer[BackendConfig]

	inflight   atomic.Int64 // requests dispatched and not yet finished
	prefilling atomic.Int64 // requests dispatched without a first token yet
	prefillTok atomic.Int64 // prompt tokens of the requests in prefilling (the prefill work queued there)
	decoding   atomic.Int64 // requests streaming tokens
	healthy    atomic.Bool
	requests   atomic.Uint64 // requests dispatched in total
	failures   atomic.Uint64 // attempts that failed because of the backend
}

// NewBackend returns a healthy Backend with cfg.
func NewBackend(cfg *BackendConfig) *Backend {
	b := &Backend{}
	b.cfg.Store(cfg)
	b.healthy.Store(true)
	return b
}

// Config returns the backend's current configuration. Callers must not modify it.
func (b *Backend) Config() *BackendConfig { return b.cfg.Load() }

// Name returns the backend's name.
func (b *Backend) Name() string { return b.cfg.Load().Name }

// Inflight returns the number of requests dispatched to b and not yet finished.
func (b *Backend) Inflight() int64 { return b.inflight.Load() }

// Prefilling returns the number of requests dispatched to b that have no first token yet, and their prompt tokens.
func (b *Backend) Prefilling() (requests, tokens int64) {
	return b.prefilling.Load(), b.prefillTok.Load()
}

// Decoding returns the number of requests streaming tokens from b.
func (b *Backend) Decoding() int64 { return b.decoding.Load() }

// Healthy reports whether b may receive traffic.
func (b *Backend) Healthy() bool { return b.healthy.Load() }

// SetHealthy marks b healthy or not (health probes and breakers call it).
func (b *Backend) SetHealthy(ok bool) { b.healthy.Store(ok) }

// Requests returns the number of requests dispatched to b since it was created.
func (b *Backend) Requests() uint64 { return b.requests.Load() }

// Failures returns the number of attempts that failed because of b.
func (b *Backend) Failures() uint64 { return b.failures.Load() }

// Attempt is the accounting of one request sent to a backend, from dispatch to its end. The request path owns
// it; its methods must be called in order: FirstToken at most once, then End exactly once.
type Attempt struct {
	b          *Backend
	prefillTok int64
	first      bool
	ended      bool
}

// Begin records a request with promptTokens of prefill work dispatched to b.
func (b *Backend) Begin(promptTokens int) Attempt {
	b.inflight.Add(1)
	b.prefilling.Add(1)
	b.prefillTok.Add(int64(promptTokens))
	b.requests.Add(1)
	return Attempt{b: b, prefillTok: int64(promptTokens)}
}

// Backend returns the backend the attempt went to.
func (a *Attempt) Backend() *Backend { return a.b }

// FirstToken records that the backend finished the request's prefill and started decoding.
func (a *Attempt) FirstToken() {
	if a.first || a.ended {
		return
	}
	a.first = true
	a.b.prefilling.Add(-1)
	a.b.prefillTok.Add(-a.prefillTok)
	a.b.decoding.Add(1)
}

// End records the end of the attempt. backendFailed says the backend is to blame (a connect error, a 5xx, a
// broken stream), not the client.
func (a *Attempt) End(backendFailed bool) {
	if a.ended {
		return
	}
	a.ended = true
	if a.first {
		a.b.decoding.Add(-1)
	} else {
		a.b.prefilling.Add(-1)
		a.b.prefillTok.Add(-a.prefillTok)
	}
	a.b.inflight.Add(-1)
	if backendFailed {
		a.b.failures.Add(1)
	}
}
