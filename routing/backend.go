package routing

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/cache"
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
	// Engine names the server software: a key of the policy's engines table (EngineVLLM, EngineOpenAIHosted,
	// or an operator's own), shown in /debug/backends.
	Engine string
	// EngineSpec is how the Monitor reads the engine's load (engines.go). nil means the built-in entry named
	// Engine (BuiltinEngine); a name without one has nothing to scrape and gets no idle probes.
	EngineSpec *EngineSpec
	// APIKey, when set, replaces the client's Authorization header upstream ("Bearer <APIKey>"), and is sent on
	// the Monitor's scrapes and probes too.
	APIKey string
	// Headers are extra headers sent on every upstream request (after the client's, so they win) and on the
	// Monitor's scrapes and probes: an API's own key header (Azure's api-key), an organisation header. Values may
	// be secrets. Never headers the gateway sets itself (the policy rejects them). nil: none.
	Headers []Header
	// Query is an encoded query string ("api-version=2024-10-21") added to every upstream inference URL; "" adds
	// none.
	Query string
	// Path, when set, replaces the client's path upstream (PathTemplate: /openai/deployments/{model}/{endpoint});
	// nil appends the client's path to URL.
	Path *PathTemplate
	// CA, when set, is the only set of authorities an https backend's certificate may chain to (proxy and
	// Monitor alike); nil means the system roots.
	CA *CABundle
	// ForwardAuthorization sends the client's own Authorization header upstream. Meaningful only without
	// APIKey (which replaces it); false, the default, drops the client's credentials.
	ForwardAuthorization bool
	// Models are the upstream model names this backend serves.
	Models []string
	// Weight is the backend's relative share for weighted strategies; 1 when unset.
	Weight float64
	// MaxConcurrency caps requests in flight to this backend; 0 means no fixed cap. The adaptive strategy counts
	// a backend at its cap as saturated.
	MaxConcurrency int
	// MaxNumSeqs is the most sequences the engine runs at once as the policy states it (vLLM's --max-num-seqs,
	// SGLang's --max-running-requests); 0 means not stated. The concurrency cap takes it as the engine's seats
	// unless the engine exports its own figure (SignalMaxSeqs).
	MaxNumSeqs int
	// PrefixCapacity is how many 64-byte prompt blocks the prefix index may believe the backend holds, before
	// calibration. 0 means "learn it": the engine's KV size when scraped (vllm:cache_config_info), else
	// cache.DefaultCapacity.
	PrefixCapacity int
	// Timeouts bound each attempt sent to this backend.
	Timeouts Timeouts
	// Tier is how the backend's capacity is paid for: TierDedicated (the zero value) is used first,
	// TierOverflow only when no dedicated backend has room (Regional).
	Tier Tier
	// Price is what the backend's tokens cost; the zero Price is free. It feeds the cost counter, budgets and
	// the cost objective.
	Price Price
}

// Spec returns the engine spec the backend is read with: EngineSpec, else the built-in entry named Engine, else
// an engine with nothing to scrape.
func (c *BackendConfig) Spec() *EngineSpec {
	if c.EngineSpec != nil {
		return c.EngineSpec
	}
	if e := BuiltinEngine(c.Engine); e != nil {
		return e
	}
	return unknownEngine
}

// HasHeader reports whether Headers sets name (case-insensitively).
func (c *BackendConfig) HasHeader(name string) bool {
	for _, h := range c.Headers {
		if strings.EqualFold(h.Name, name) {
			return true
		}
	}
	return false
}

// unknownEngine is the spec of an engine name routing does not know: nothing to scrape, no idle probes.
var unknownEngine = NewEngineSpec(EngineSpec{})

// bytesPerToken is the gateway's prompt-length estimate (openai.BytesPerToken): a 64-byte prefix block is 16
// tokens. Repeated here because routing does not import openai.
const bytesPerToken = 4

const blockTokens = cache.BlockBytes / bytesPerToken

// Backend is one upstream server and its live state. Backends outlive policy reloads: the Registry keeps the
// same *Backend for the same name and URL, so learned state survives an edit of unrelated fields.
//
// Live state, all read lock-free on the request path:
//   - the gateway's own accounting (atomics): requests in flight, requests and prefill tokens dispatched without
//     a first token yet, requests decoding;
//   - the engine's metrics (EngineStats), an immutable snapshot the Monitor publishes behind an atomic.Pointer;
//   - RTT (windowed minima of probe and connection timings);
//   - the latency models (see model.go), updated under a small mutex, read through atomics;
//   - its share of the prefix index (a *cache.Owner) when it belongs to a Registry.
//
// Concurrency: every method is safe for concurrent use. A Backend must not be copied.
type Backend struct {
	cfg      atomic.Pointer[BackendConfig]
	clock    Clock  // set before the Backend is shared
	nameHash uint64 // xxhash of the name, for rendezvous hashing

	inflight   atomic.Int64 // requests dispatched and not yet finished
	prefilling atomic.Int64 // requests dispatched without a first token yet
	prefillTok atomic.Int64 // uncached prompt tokens of the requests in prefilling (the prefill work queued there)
	heldTok    atomic.Int64 // prefill tokens of attempts claimed for b and not dispatched yet (Hold)
	peerDrain  atomic.Int64 // UnixNano when the other replicas' dispatches announced by their hints are done (drain.go)
	decoding   atomic.Int64 // requests streaming tokens
	warm       atomic.Int64 // requests in flight that were dispatched to a prefix believed held here (pickCold)
	healthy    atomic.Bool
	requests   atomic.Uint64 // requests dispatched in total
	ended      atomic.Uint64 // of which ended (engineOccupancy)
	failures   atomic.Uint64 // attempts that failed because of the backend

	engine     atomic.Pointer[EngineStats]
	info       atomic.Pointer[InfoStatus] // the last read of the engine's info document (the Monitor's)
	staleAfter atomic.Int64               // nanoseconds: engine metrics older than this are ignored
	rttProbe   minWindow                  // probe round trips, seconds
	rttConn    minWindow                  // connection-setup times, seconds

	lat       latency
	ttftCount atomic.Int64
	lastTTFT  atomic.Int64 // UnixNano (backend clock) of the last TTFT observation
	idle      idleState    // the traffic it gets and its idle probes (idleprobe.go)

	newTokAvg   afloat    // EWMA of uncached tokens per dispatched request: converts the engine queue to tokens
	hold        holdTime  // how long a request holds a seat on b (its prefill alone, then its decode)
	fleetHold   *holdTime // the same over every backend of b's Registry (nil outside one): b's until its own
	meter       atomic.Pointer[seatMeterRef]
	seatProbe   atomic.Pointer[SeatProbe] // what the Monitor's seat probe found (seatprobe.go)
	seatProbing atomic.Bool               // a seat probe runs
	probeGen    atomic.Uint64             // seat probes begun and ended: odd while one runs (perturbed)
	watched     atomic.Bool               // a Monitor scrapes b (Measuring)
	scrapedOnce atomic.Bool               // the Monitor's first scrape of b ended, well or not
	peers       *seatPeers                // the Registry's peer groups (nil outside one): seats from peers
	group       atomic.Pointer[seatGroup] // b's peer group, set at its first scrape
	hitScale    afloat                    // EWMA of (cached tokens the engine reported / cached tokens predicted), in [0, 1]
	spec        specShare                 // share of a prefix still being prefilled here that a request sent now finds cached (specHit)
	fleetSpec   *specShare                // the same over every backend of b's Registry (nil outside one): b's until its own
	hitRate     afloat                    // EWMA of cached/prompt tokens, from the engine's usage when reported
	predRate    afloat                    // EWMA of predicted cached/prompt tokens, when the engine never reports usage
	usageSeen   atomic.Bool
	alpha       afloat // share of the KV capacity the prefix index may assume (calibrated; starts at 0.8)
	kvBlocks    atomic.Int64

	owner atomic.Pointer[cache.Owner]
	obs   atomic.Pointer[backendMetrics]

	peer atomic.Pointer[PeerLoad] // the other gateway replicas' load on b (hints.go), until it goes stale
	// peerReqs are the other replicas' recent requests on b, from their records (turns.go).
	peerReqs peerReqs
	hints    *hintCell // where confirmed prefixes are published (the Registry's; nil outside one)
}

// backendMetrics are a backend's resolved metric children (label lookups done once, not per request).
type backendMetrics struct {
	ttftError  prometheus.Observer
	queueDepth prometheus.Gauge
	inflight   prometheus.Gauge
}

// NewBackend returns a healthy Backend with cfg, on the system clock. It has no prefix-index share until a
// Registry gives it one.
func NewBackend(cfg *BackendConfig) *Backend { return newBackend(cfg, SystemClock{}) }

func newBackend(cfg *BackendConfig, clk Clock) *Backend {
	b := &Backend{clock: clk, nameHash: xxhash.Sum64String(cfg.Name)}
	b.cfg.Store(cfg)
	b.healthy.Store(true)
	b.lat.init()
	b.newTokAvg.store(512)
	b.hitScale.store(1)
	b.alpha.store(initialAlpha)
	b.staleAfter.Store(int64(DefaultStaleAfter))
	return b
}

// Config returns the backend's current configuration. Callers must not modify it.
func (b *Backend) Config() *BackendConfig { return b.cfg.Load() }

// Name returns the backend's name.
func (b *Backend) Name() string { return b.cfg.Load().Name }

// Inflight returns the number of requests in flight to b: those this gateway dispatched and that have not
// finished, plus those the other gateway replicas reported (their load hints, while fresh: see Peers). Every
// strategy sees the fleet's load through it.
func (b *Backend) Inflight() int64 {
	n := b.inflight.Load()
	if p := b.peer.Load(); p != nil && p.Inflight != 0 && b.clock.Now().Before(p.Until) { // no clock read without peers
		n += p.Inflight
	}
	return n
}

// LocalInflight returns the number of requests this gateway dispatched to b that have not finished
// (switchyard_backend_inflight; what this replica reports to the others).
func (b *Backend) LocalInflight() int64 { return b.inflight.Load() }

// Prefilling returns the number of requests dispatched to b that have no first token yet, and their uncached
// prompt tokens (all prompt tokens for attempts begun with Begin).
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

// Engine returns the last engine-metrics snapshot, or nil if b was never scraped. Check Fresh before trusting it.
func (b *Backend) Engine() *EngineStats { return b.engine.Load() }

// Measuring reports whether a Monitor is still taking b's first measure: its first scrape has not ended, or
// a seat probe runs (seatprobe.go). A gateway is not ready for traffic before its first measure of every
// backend (proxy.Server.Ready): requests sent meanwhile would share the engines with the probe's, and the
// models would learn from them what the gateway itself caused. False for a backend no Monitor scrapes.
func (b *Backend) Measuring() bool {
	return b.watched.Load() && (!b.scrapedOnce.Load() || b.seatProbing.Load())
}

// EngineBatch returns what the engine's last successful scrape says of its batch: maxSeqs the most sequences it
// runs at once as it exports them (SignalMaxSeqs; 0 when it does not), running and waiting its batch and queue
// then (-1 when the engine does not export them), and at the scrape's time (zero before any scrape). A failed
// later scrape does not change at: each scrape is reported once, so a reader that remembers at consumes each
// exactly once. admission.Cap reads it through its admission.Engine interface. Lock-free.
func (b *Backend) EngineBatch() (maxSeqs, running, waiting int, at time.Time) {
	e := b.engine.Load()
	if e == nil {
		return 0, -1, -1, time.Time{}
	}
	running, waiting = -1, -1
	if e.Has&HasRunning != 0 {
		running = int(e.Running)
	}
	if e.Has&HasWaiting != 0 {
		waiting = int(e.Waiting)
	}
	if e.Has&HasMaxSeqs != 0 {
		maxSeqs = int(min(e.MaxSeqs, 1<<30))
	}
	return maxSeqs, running, waiting, e.At
}

// EngineCeiling returns the most requests the engine holds at once, running and queued, before it refuses new
// ones, as its info document states it (InfoSpec.MaxInflight, TGI's max_concurrent_requests), or 0 when it
// states none. admission.Cap never lets more than that through. Lock-free.
func (b *Backend) EngineCeiling() int {
	e := b.engine.Load()
	if e == nil || e.Has&HasMaxInflight == 0 {
		return 0
	}
	return int(min(e.MaxInflight, maxEngineLimit))
}

// RTT returns the round trip to b: the larger of the minimum of the last 8 probes and the minimum of the last 8
// connection setups. A minimum, not a mean, because delays on either end (a busy host, a scheduling hiccup)
// only ever add to a round trip; the larger of the two because a simulator's injected delay shows in probes but
// not in TCP handshakes (on real networks they agree). 0 until measured.
func (b *Backend) RTT() time.Duration { return duration(b.rtt()) }

func (b *Backend) rtt() float64 { return max(b.rttProbe.load(), b.rttConn.load()) }

// ObserveRTT records one connection-setup time for b's RTT: the proxy calls it when it opens a new upstream
// connection (the TCP connect; a TLS handshake takes further round trips).
func (b *Backend) ObserveRTT(d time.Duration) { b.rttConn.add(max(d.Seconds(), 0)) }

// observeProbe records one probe round trip (the Monitor calls it).
func (b *Backend) observeProbe(d time.Duration) { b.rttProbe.add(max(d.Seconds(), 0)) }

// minWindow is the minimum of the last len(buf) samples, readable lock-free.
type minWindow struct {
	mu  sync.Mutex
	buf [8]float64
	n   int
	i   int
	cur afloat
}

func (w *minWindow) add(x float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf[w.i] = x
	w.i = (w.i + 1) % len(w.buf)
	w.n = min(w.n+1, len(w.buf))
	m := w.buf[0]
	for _, v := range w.buf[1:w.n] {
		m = min(m, v)
	}
	w.cur.store(m)
}

func (w *minWindow) load() float64 { return w.cur.load() }

// prefixOwner returns b's share of the prefix index, or nil.
func (b *Backend) prefixOwner() *cache.Owner { return b.owner.Load() }

// load is a backend's state as the cost function sees it at one instant.
type load struct {
	queuedTok float64 // prefill tokens ahead of a new request
	running   float64 // sequences decoding
	waiting   float64 // engine queue (0 when unknown)
	kv        float64 // KV usage 0..1 (0 when unknown)
	seatWait  float64 // seconds a new request would wait for a seat (seatWait); 0 while one is free or unknown
	fresh     bool    // engine metrics are fresh
	full      bool    // every seat taken and a request waiting for one (seatsFull, or the gateway's own count)
	occupied  float64 // requests in the engine, running and waiting, brought up to now (engineOccupancy), or in flight
	inflight  int64   // requests in flight from every replica: this one's, and the others' reports brought up to now (turns.go)
	room      bool    // a seat free for one more request, no request waiting: seats known and occupied+1 <= seats
}

// SeatMeter measures the seats of an engine that states none: admission.Cap, which the proxy installs with
// SetSeatMeter. MeasuredSeats returns the most sequences the engine runs at once and whether that is its limit
// (stated, or measured at a queue) rather than a lower bound (the largest batch it has run); 0 while unknown. It
// must be safe for concurrent use and cheap, as routing reads it for every candidate of a pick.
type SeatMeter interface {
	MeasuredSeats() (seats int, exact bool)
}

// seatMeterRef boxes a SeatMeter for an atomic.Pointer.
type seatMeterRef struct{ m SeatMeter }

// SetSeatMeter installs what measures b's seats when neither its engine nor the policy states them; nil removes it.
func (b *Backend) SetSeatMeter(m SeatMeter) {
	if m == nil {
		b.meter.Store(nil)
		return
	}
	b.meter.Store(&seatMeterRef{m: m})
}

// seatsOf returns the most sequences b's engine runs at once: its own figure (ownSeats) when exact, else the
// figure its peers agree on (peerseats.go; none once b has run more than that at once), else its own lower bound;
// exact is false when that figure is only a lower bound (the largest batch the engine has run). 0 when none is
// known.
func (b *Backend) seatsOf(e *EngineStats, cfg *BackendConfig) (seats float64, exact bool) {
	seats, exact = b.ownSeats(e, cfg)
	if exact {
		return seats, true
	}
	if g := b.group.Load(); g != nil {
		if p := g.seats.Load(); p > 0 { // b's own lower bound is a member's: past p, the group has no figure
			return float64(p), true
		}
	}
	return seats, false
}

// ownSeats returns what b knows of its own seats: its engine's figure as last scraped (e, may be nil), else the
// policy's max_num_seqs, else the figure its SeatMeter measured (which takes the seat probe's as its own), else
// the seat probe's exact figure (a SeatMeter that does not measure: a static cap, or one not yet made), else the
// SeatMeter's or the probe's lower bound (exact false). 0 when none.
func (b *Backend) ownSeats(e *EngineStats, cfg *BackendConfig) (seats float64, exact bool) {
	if e != nil && e.Has&HasMaxSeqs != 0 && e.MaxSeqs > 0 {
		return e.MaxSeqs, true
	}
	if cfg.MaxNumSeqs > 0 {
		return float64(cfg.MaxNumSeqs), true
	}
	p, pexact, _ := b.ProbedSeats()
	if r := b.meter.Load(); r != nil {
		if n, exact := r.m.MeasuredSeats(); exact || !pexact {
			return float64(max(n, 0)), exact
		}
	}
	return float64(p), pexact
}

// seatsNow returns the seats to judge b's batch by at this instant: the exact figure (seatsOf); else, while a
// fresh scrape shows the engine running at least the largest batch it has run with requests waiting, its running
// count (it runs all it can now and queues the rest); else 0 (not known to be full).
func (b *Backend) seatsNow(e *EngineStats, cfg *BackendConfig, fresh bool) float64 {
	seats, exact := b.seatsOf(e, cfg)
	switch {
	case exact:
		return seats
	case fresh && seats > 0 && e.Has&HasRunning != 0 && e.Waiting > 0 && e.Running >= seats:
		return e.Running
	}
	return 0
}

// seatsFull reports whether an engine of the given seats whose scrape was e is full now, with requests waiting
// for a seat: more requests in it than seats (engineOccupancy). Such an engine starts a new request only when a
// running one finishes, a wait the TTFT model (which prices prefill and load) leaves to seatWait. False when the
// seats are not known or e does not export its running batch and queue.
func (b *Backend) seatsFull(e *EngineStats, seats float64) bool {
	occ, ok := b.engineOccupancy(e)
	return ok && seats > 0 && occ > seats
}

// engineOccupancy returns the requests in b's engine, running and waiting, as the scrape e counted them and
// brought up to now with what this gateway did since: plus the requests it dispatched to b after the scrape was
// sent, less those that ended after its answer came (EngineStats.begun, ended). It reports false when e does not
// export both counts.
//
// A scrape is up to a scrape interval old, and an engine's batch changes with every request that ends: a
// conversation's next turn, sent the moment its previous answer ended, found that answer still counted in the
// scrape, so an owner with a seat free looked full, with a seat's wait to pay, and the turn moved (multi-turn at
// 64 engines of 4 seats: 51 of adaptive's 54 moves left an owner with three requests in it). The other replicas'
// traffic is brought up to date from their records by loadAt (turns.go). Both corrections err towards more
// requests: one that ends while the scrape is on its way may or may not be in it and is not taken off, one
// dispatched then may or may not be in it and is added.
func (b *Backend) engineOccupancy(e *EngineStats) (float64, bool) {
	if e.Has&HasRunning == 0 || e.Has&HasWaiting == 0 {
		return 0, false
	}
	since := float64(b.requests.Load()-e.begun) - float64(b.ended.Load()-e.ended)
	return max(e.Running+e.Waiting+since, 0), true
}

// seatWait is how long a request sent to an engine with occupied requests in it (running and waiting) would wait
// for a seat: none while one of its seats is free; else, for itself and each request queued ahead of it, one
// release of a seat, which all seats together give at seats/hold a second (hold: how long a request holds one).
// 0 when the seats or the hold time are not known yet.
//
// Continuous batching starts a queued request only when a running one finishes: on an engine whose seats are few
// for its traffic (fixed-seat engines, small max_num_seqs), that wait is seconds, where a prefill is tens of
// milliseconds. Measured, not tuned: the seats are stated or measured (seatsOf), the hold time is each backend's
// own (End).
func seatWait(occupied, seats, hold float64) float64 {
	if seats <= 0 || hold <= 0 || occupied < seats {
		return 0
	}
	return (occupied - seats + 1) * hold / seats
}

// loadAt combines local accounting with the engine's view: the larger of the two
// (docs/design.md, "Routing and protection"), so traffic from other gateway replicas counts too. Engine metrics count
// only while fresh.
func (b *Backend) loadAt(now time.Time) load { return b.loadLess(now, turnLess{}) }

// loadLess is loadAt for a request whose previous turn, served through another replica on b, has ended (less;
// zero for none or another backend). Both bring the other replicas' reports and the scrape up to now with their
// dispatch and end records (turns.go).
func (b *Backend) loadLess(now time.Time, less turnLess) load {
	_, tok := b.Prefilling()
	l := load{queuedTok: float64(tok), running: float64(b.decoding.Load()), inflight: b.inflight.Load()}
	peerQ := b.peerDispatchedLeft(now)
	e := b.engine.Load()
	l.fresh = e.Fresh(now, time.Duration(b.staleAfter.Load()))
	p := b.peerLoad(now)
	adj := b.peerAdjustAt(p, e, l.fresh, less)
	if p != nil {
		// The other replicas' reports, brought up to now with their dispatch and end records (turns.go).
		l.inflight += max(p.Inflight+int64(adj.report), 0)
		// The other replicas' decoding sequences count, and their queued prefill as much of it as is left once
		// the report's age is drained at the learned prefill rate (drain.go): a prefill lasts about as long as a
		// report is old, so the raw figure is mostly stale (it taught the models a prefill rate several times
		// too fast), and leaving it out hid a neighbour's long prefill from the other replica, which then took
		// a conversation's owner for idle or, once the wait showed, for slow. This replica's own prefill counts
		// in full until its first token (drain.go says why).
		l.running += float64(p.Decoding)
		peerQ = max(peerQ, p.prefillLeft(now, b.lat.prefillPerToken()))
	}
	l.queuedTok += peerQ
	seats := b.seatsNow(e, b.Config(), l.fresh)
	occupied := float64(l.inflight)
	if l.fresh {
		l.waiting = e.Waiting
		l.kv = e.KVUsage
		l.running = max(l.running, e.Running)
		l.queuedTok = max(l.queuedTok, e.Waiting*b.newTokAvg.load())
		if occ, ok := b.engineOccupancy(e); ok {
			occupied = max(occupied, max(occ+adj.engine, 0))
		}
	}
	// Every seat taken and a request waiting for one: the engine's occupancy as the scrape left it, brought up to
	// now with this gateway's own dispatches and ends (engineOccupancy), or the gateway's own count, which shows a
	// full batch before a scrape does.
	l.full = seats > 0 && occupied > seats
	l.room = seats > 0 && occupied+1 <= seats
	l.occupied = occupied
	l.seatWait = seatWait(occupied, seats, b.seatHold())
	return l
}

// seatHold returns how long a request holds a seat on b, in seconds: b's own mean once a request has ended there,
// before that its fleet's (the backends of its Registry), 0 when none is known. A backend of a large fleet sees
// its first answer end seconds after its seats first fill: a fixed-seat engine's owner of a hot prefix, with its
// four seats taken, was sent a fifth request that waited 2-6 s for want of a hold time of its own.
func (b *Backend) seatHold() float64 {
	if h := b.hold.load(); h > 0 || b.fleetHold == nil {
		return h
	}
	return b.fleetHold.load()
}

// holdTime is a mean seat hold time, in seconds: the mean of the first answers, then an EWMA of weight holdAlpha.
// The first weigh 1/n each: an average seeded with the first answer to end, the shortest of those begun together
// (1.4 s against 6-12 s on a fixed-seat engine), stayed low through the few answers a backend of a large fleet
// sees. Lock-free.
type holdTime struct {
	v afloat
	n atomic.Int64
}

func (h *holdTime) add(x float64) { h.v.ewma(x, max(holdAlpha, 1/float64(h.n.Add(1)))) }

func (h *holdTime) load() float64 { return h.v.load() }

// Attempt is the accounting of one request sent to a backend, from dispatch to its end. The request path owns
// it; its methods must be called from one goroutine, in order: FirstToken at most once, ObserveUsage at most
// once, then End exactly once. An Attempt is a value: keep it where the request path keeps its state.
type Attempt struct {
	b          *Backend
	prefillTok int64 // added to b.prefillTok at dispatch
	first      bool
	ended      bool

	start, firstAt time.Time
	usageAt        time.Time // when ObserveUsage was called: the end of decoding
	// Features captured at dispatch for the TTFT model, and what was predicted from them.
	promptTok, hitTok        int
	uncached, queued, runAt0 float64
	rtt, predTTFT            float64 // seconds: RTT, and the engine's mean TTFT predicted at dispatch
	seatWait                 float64 // seconds: the wait for a seat predicted at dispatch (seatWait)
	probeGen                 uint64  // b.probeGen at dispatch (perturbed)
	idleProbe                bool    // the Monitor's idle probe, not traffic (idleprobe.go)
	turnKey                  uint64  // the prompt's turnKey, published at dispatch when turned (turns.go)
	turned                   bool
	revisedTTFT              float64 // seconds: predTTFT for the prefill the engine reported doing; 0 until then
	runAtFirst               float64
	ttft                     float64  // observed at FirstToken, seconds
	pendingTTFT              bool     // ttft awaits the usage's cached_tokens before training the model
	seen                     seen     // what the regime detector made of ttft while pendingTTFT
	hashes                   []uint64 // the request's prefix hashes until the first token (then nil; see Request.ReleaseHashes)
	indexed                  bool     // the prompt's blocks went into the prefix index at dispatch
	owner                    *cache.Owner
	confTok, specTok         int // the prefix believed held, confirmed and still being prefilled, in tokens (hitTok counts specShare of specTok)
	completionTok            int
	gotUsage                 bool
	warm                     bool // counted in b.warm
}

// Begin records a request with promptTokens of prefill work dispatched to b. It knows nothing of the prompt's
// prefix: prefer Dispatch, which also keeps the prefix index and the latency models exact.
func (b *Backend) Begin(promptTokens int) Attempt {
	now := b.clock.Now()
	l := b.loadAt(now)
	a := Attempt{b: b, start: now, promptTok: promptTokens, uncached: float64(promptTokens),
		queued: l.queuedTok, runAt0: l.running, rtt: b.rtt(), seatWait: l.seatWait}
	a.predTTFT = b.lat.ttftMean(a.uncached, a.queued, a.runAt0)
	b.begin(&a, int64(promptTokens))
	return a
}

// Dispatch begins an attempt for r on b: call it right before sending r upstream to b (after Pick chose b, and
// again for each retry or hedge on another backend). It records the request in b's accounting with the prefill
// work b must do (the prompt minus the prefix b is believed to hold), inserts r's prompt blocks into b's share of
// the prefix index speculatively (so a burst sharing a prefix follows it), and captures the features and the
// prediction that FirstToken will score. r's prefix hashes are kept by the Attempt until its first token: do not
// Reset r (nor ReleaseHashes) before every Attempt begun for it has had its first token or ended, or holds its
// own copy (KeepHashes).
func (b *Backend) Dispatch(r *Request) Attempt {
	now := b.clock.Now()
	l := b.loadAt(now)
	a := Attempt{b: b, start: now, queued: l.queuedTok, runAt0: l.running, rtt: b.rtt(), seatWait: l.seatWait}
	a.promptTok = r.promptTokens()
	a.owner = b.prefixOwner()
	if r.hb != nil && a.owner != nil && len(r.hb.Hashes) > 0 {
		a.hashes = r.hb.Hashes
		blocks := 0
		if r.dec.Backend == b {
			blocks = r.dec.blocks
		} else {
			var c [1]int
			a.owner.Index().Lookup(a.hashes, []*cache.Owner{a.owner}, c[:])
			blocks = c[0]
		}
		conf := blocks
		if blocks > 0 {
			conf = a.owner.Confirmed(a.hashes[:blocks])
		}
		a.hitTok, a.confTok, a.specTok = b.specHit(blocks, conf, a.promptTok, 1)
	}
	a.uncached = float64(uncachedTokens(a.promptTok, a.hitTok))
	a.predTTFT = b.lat.ttftMean(a.uncached, a.queued, a.runAt0)
	b.begin(&a, int64(a.uncached))
	if a.confTok+a.specTok > 0 {
		a.warm = true
		b.warm.Add(1)
	}
	b.newTokAvg.ewma(a.uncached, 0.1)
	if a.promptTok > 0 {
		b.predRate.ewma(float64(a.hitTok)/float64(a.promptTok), hitRateAlpha)
	}
	var peers *Peers
	if c := b.hints; c != nil {
		peers = c.p.Load()
	}
	if a.hashes != nil {
		a.indexed = true
		a.owner.Insert(a.hashes, now)
		if peers != nil {
			peers.routed(b, a.hashes, int64(a.uncached), now) // tell the other replicas at once (hints.go); copies, never blocks
		}
	}
	if peers != nil && len(r.Prompt) > 0 {
		// The other replicas learn when this request began and ended, so that its conversation's next turn, if it
		// reaches one of them, is judged without it (turns.go).
		if !r.keyed {
			r.key, r.keyed = turnKey(r.Model, r.Prompt), true
		}
		a.turnKey, a.turned = r.key, true
		peers.turns.local(r.key)
		peers.turn(b, r.key, turnDispatched, now)
	}
	return a
}

func (b *Backend) begin(a *Attempt, prefillTok int64) {
	a.prefillTok = prefillTok
	a.probeGen = b.probeGen.Load()
	b.inflight.Add(1)
	b.prefilling.Add(1)
	b.prefillTok.Add(prefillTok)
	b.requests.Add(1)
}

// hitTokens converts matched blocks to the cached tokens the engine should report, scaled by the backend's
// calibrated precision: never the whole prompt, since engines always compute the last token.
func hitTokens(blocks, promptTok int, scale float64) int {
	h := int(float64(blocks*blockTokens) * scale)
	return max(min(h, promptTok-1), 0)
}

// specPrior is specShare before any observation: even odds. Whether a request finds cached the prefix that an
// earlier one is still prefilling on the same engine depends on where the engine's step was when each arrived
// (one that joins the same step as the first finds nothing, vLLM and SGLang register blocks only once computed; one
// that arrives during the first's prefill waits for it and finds it all), which the gateway cannot see; the
// engine's cached_tokens then say which it was (ObserveUsage). Either way the prior is safe: such a request is
// placed by the cold rule (pickCold), where half a hit makes the backend the first went to about as dear as one
// that prefills the prompt alone, which is what waiting for the first's prefill costs on an engine that shares; so
// the most it loses there is one more prefill of the prefix on another backend, and an engine that does not share
// no longer gets two prefills in one step.
const specPrior = 0.5

// specMemory is how many observations specShare averages over once it has that many: the share follows the
// arrival spacing and step length of the current load within a couple of bursts of new prefixes.
const specMemory = 20

// specShare is the share of a prefix still being prefilled that a request sent to the same engine finds cached:
// specPrior before any observation, then the running mean of the observations with the prior weighing as one,
// then an EWMA over specMemory. The zero value is ready to use. Lock-free: concurrent updates may each miss the
// other's, as afloat.ewma says.
type specShare struct {
	v afloat
	n atomic.Int64
}

func (s *specShare) add(x float64) {
	n := s.n.Add(1)
	if n == 1 {
		s.v.store((specPrior + x) / 2)
		return
	}
	s.v.ewma(x, max(1/float64(n+1), 1/float64(specMemory)))
}

func (s *specShare) load() float64 {
	if s.n.Load() == 0 {
		return specPrior
	}
	return s.v.load()
}

// specShareNow is b's specShare, or its fleet's until b has an observation of its own.
func (b *Backend) specShareNow() float64 {
	if b.spec.n.Load() > 0 || b.fleetSpec == nil {
		return b.spec.load()
	}
	return b.fleetSpec.load()
}

// specHit converts the prefix b is believed to hold (blocks leading blocks, of which conf are confirmed by a
// first token) to the cached tokens expected (hit), scaled as hitTokens does: the confirmed tokens (confTok) and
// specShare of the ones an earlier request is still prefilling (specTok).
func (b *Backend) specHit(blocks, conf, promptTok int, scale float64) (hit, confTok, specTok int) {
	confTok = hitTokens(conf, promptTok, scale)
	specTok = hitTokens(blocks, promptTok, scale) - confTok
	return confTok + int(b.specShareNow()*float64(specTok)), confTok, specTok
}

// observeSpec folds into b's and its fleet's specShare the share of specTok speculative tokens the engine
// reported cached, beyond the confTok confirmed ones.
func (b *Backend) observeSpec(cached, confTok, specTok int) {
	x := min(max(float64(cached-confTok)/float64(specTok), 0), 1)
	b.spec.add(x)
	if b.fleetSpec != nil {
		b.fleetSpec.add(x)
	}
}

// uncachedTokens is the prefill work left: at least one block's worth (or the whole prompt if shorter).
func uncachedTokens(promptTok, hitTok int) int {
	return max(promptTok-hitTok, min(promptTok, blockTokens))
}

// Backend returns the backend the attempt went to.
func (a *Attempt) Backend() *Backend { return a.b }

// PredictedTTFT returns the TTFT predicted at dispatch (mean, RTT and the wait for a seat included).
func (a *Attempt) PredictedTTFT() time.Duration { return duration(a.predicted()) }

// predicted is PredictedTTFT in seconds.
func (a *Attempt) predicted() float64 { return a.rtt + a.seatWait + a.predTTFT }

// PredictedHit reports whether the prediction counted on a prefix-cache hit: the backend was believed to hold
// part of the prompt. When the engine has evicted it, the first token comes as late as a miss, which says nothing
// about the backend's speed; RevisedTTFT gives the prediction that judges it.
func (a *Attempt) PredictedHit() bool { return a.hitTok > 0 }

// RevisedTTFT returns the TTFT the model would have predicted at dispatch for the prefill the engine reported
// doing (the cached tokens of its usage), with the same load features and before this request trained the
// model; before ObserveUsage brought cached tokens, PredictedTTFT. RTT and the wait for a seat included.
func (a *Attempt) RevisedTTFT() time.Duration {
	if a.revisedTTFT > 0 {
		return duration(a.rtt + a.seatWait + a.revisedTTFT)
	}
	return a.PredictedTTFT()
}

// FirstToken records that the backend finished the request's prefill and started decoding: call it when the
// first token (the first SSE data chunk with content) arrives. The time since Dispatch is the observed TTFT: it
// trains b's TTFT model and feeds switchyard_ttft_prediction_error_ratio (at once, or, for an engine that
// reports cached_tokens, when ObserveUsage brings them), and the prefix blocks are confirmed.
func (a *Attempt) FirstToken() {
	if a.first || a.ended {
		return
	}
	b := a.b
	a.first = true
	b.prefilling.Add(-1)
	b.prefillTok.Add(-a.prefillTok)
	b.decoding.Add(1)
	now := b.clock.Now()
	a.firstAt = now
	a.runAtFirst = float64(b.decoding.Load())
	a.ttft = now.Sub(a.start).Seconds()
	if b.usageSeen.Load() {
		// The engine reports cached_tokens: fit the model when they come, on the prefill the engine really did
		// rather than on the index's guess (a guess wrong in either direction would teach it a wrong prefill
		// rate). The regime detector sees the observation now, so a sudden slowdown is caught at first tokens.
		a.pendingTTFT = true
		a.seen = b.lat.detectTTFT(a.uncached, a.queued, a.runAt0, a.engineTTFT(a.ttft))
	} else {
		b.observeTTFT(a, a.ttft, now)
	}
	if a.hashes != nil {
		a.owner.Confirm(a.hashes, now)
		a.hashes = nil // not read again: the request may give its buffer back (Request.ReleaseHashes)
	}
}

// KeepHashes makes a hold its own copy of its request's prefix hashes, for an attempt that outlives its
// request's accounting (a hedge that lost its race and reads on to its first token): the request's buffer goes
// back to its pool when the request ends, and a's first token or end still needs the hashes.
func (a *Attempt) KeepHashes() {
	if a.hashes != nil {
		a.hashes = slices.Clone(a.hashes)
	}
}

// engineTTFT is the engine's part of an observed TTFT, the part the TTFT model learns: what the gateway waited
// minus one round trip and the wait for a seat predicted at dispatch (seatWait, which is not prefill and would
// teach the model a slowdown whenever the batch was full), kept above a tenth of the whole so that an estimate
// larger than a fast answer cannot make it vanish.
func (a *Attempt) engineTTFT(ttft float64) float64 { return max(ttft-a.rtt-a.seatWait, ttft/10) }

// perturbed reports whether a seat probe of this gateway ran on b while a was in flight (seatprobe.go): the
// engine then also ran the probe's requests, which the scrapes the models read leave out (discount), so what a
// taught of b's speed would be a slowdown the models cannot place. Rare since a starting gateway is ready only
// after its probes (proxy.Server.Ready): a probe after an engine's restart, while the gateway serves.
func (b *Backend) perturbed(a *Attempt) bool {
	g := b.probeGen.Load()
	return g&1 == 1 || g != a.probeGen
}

// observeTTFT trains b's TTFT model on ttft, an observation of a made at now (b's clock).
func (b *Backend) observeTTFT(a *Attempt, ttft float64, now time.Time) {
	b.lastTTFT.Store(now.UnixNano())
	if !a.idleProbe {
		b.idle.firsts.Add(1)
	}
	if b.perturbed(a) {
		return
	}
	var s *seen
	if a.pendingTTFT {
		s = &a.seen
	}
	b.lat.fitTTFT(a.uncached, a.queued, a.runAt0, a.engineTTFT(ttft), s)
	b.ttftCount.Add(1)
	if m := b.obs.Load(); m != nil && m.ttftError != nil {
		if pred := a.predicted(); pred > 0 {
			m.ttftError.Observe(math.Abs(ttft-pred) / pred)
		}
	}
}

// Usage is what the backend reported in the response's usage object.
type Usage struct {
	// PromptTokens is usage.prompt_tokens.
	PromptTokens int
	// CompletionTokens is usage.completion_tokens (or, without usage, the number of content chunks relayed).
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; meaningful only when HasCached.
	CachedTokens int
	// HasCached says the backend reported cached_tokens (vLLM with --enable-prompt-tokens-details, SGLang).
	HasCached bool
}

const (
	initialAlpha = 0.8  // share of the engine's KV blocks the index may assume it holds (routing.md 4.4)
	minAlpha     = 0.1  // calibration never shrinks the index below this share
	hitRateAlpha = 0.05 // EWMA weight of the prefix hit rate shown in /debug/backends
	// holdAlpha is the EWMA weight of a request's seat hold time (seatWait): about the last ten requests, so
	// that the wait follows a change of workload (longer answers) within a few seconds of traffic, while one
	// long stream moves it by a tenth.
	holdAlpha = 0.1
)

// ObserveUsage records the usage the backend reported (call it when the final usage chunk arrives, before End;
// the gateway always asks for it upstream). Completion tokens and the time from the first token to this call
// give the request's mean inter-token latency, which End feeds to the ITL model. Cached tokens calibrate the prefix index against the engine's truth: when the engine
// holds less than predicted, b's index capacity shrinks by 5% and predicted hits are discounted; when it holds
// more, the capacity grows by 1% (AIMD, routing.md 4.4).
func (a *Attempt) ObserveUsage(u Usage) {
	if a.ended {
		return
	}
	a.gotUsage = true
	a.usageAt = a.b.clock.Now()
	a.completionTok = u.CompletionTokens
	if !u.HasCached {
		if a.pendingTTFT {
			a.b.observeTTFT(a, a.ttft, a.usageAt)
			a.pendingTTFT = false
		}
		return
	}
	b := a.b
	prompt := u.PromptTokens
	if prompt <= 0 {
		prompt = a.promptTok
	}
	if prompt > 0 {
		b.usageSeen.Store(true)
		frac := min(float64(u.CachedTokens)/float64(prompt), 1)
		b.hitRate.ewma(frac, hitRateAlpha)
		if a.first && a.revisedTTFT == 0 {
			a.revisedTTFT = b.lat.ttftMean(max(float64(a.promptTok)*(1-frac), 1), a.queued, a.runAt0)
		}
		if a.pendingTTFT {
			// Train on the prefill the engine did: its cached share applied to our token estimate, so that
			// training and prediction count tokens the same way whatever the engine's tokenizer.
			a.uncached = max(float64(a.promptTok)*(1-frac), 1)
		}
	}
	if a.pendingTTFT {
		b.observeTTFT(a, a.ttft, a.usageAt)
		a.pendingTTFT = false
	}
	if !a.indexed {
		return
	}
	if a.specTok > 0 {
		b.observeSpec(u.CachedTokens, a.confTok, a.specTok)
	}
	// The index's capacity is judged on the confirmed prefix alone below and the whole one above: a prefix still
	// being prefilled that the engine did not share is a matter of timing (specShare), not of blocks lost.
	switch lo, hi := a.confTok, a.confTok+a.specTok; {
	case lo-u.CachedTokens > blockTokens: // the engine lost blocks we thought it held
		b.alpha.store(max(b.alpha.load()*0.95, minAlpha))
		b.hitScale.ewma(float64(u.CachedTokens)/float64(lo), 0.1)
		b.applyCapacity()
	case u.CachedTokens-hi > blockTokens: // it kept more than we thought
		b.alpha.store(min(b.alpha.load()+0.01, 1))
		b.hitScale.ewma(1, 0.1)
		b.applyCapacity()
	case hi > 0:
		b.hitScale.ewma(1, 0.1)
	}
}

// End records the end of the attempt. backendFailed says the backend is to blame (a connect error, a 5xx, a
// broken stream, a timeout), not the client. Before a first token, the speculative prefix entries are dropped,
// and a failure that took longer than predicted (a first-byte timeout) counts as a TTFT of at least that long,
// so a stalled backend's model learns it. After a first token with usage reported, the request's mean
// inter-token latency trains the ITL model.
func (a *Attempt) End(backendFailed bool) {
	if a.ended {
		return
	}
	a.ended = true
	b := a.b
	now := b.clock.Now()
	if a.first {
		b.decoding.Add(-1)
	} else {
		b.prefilling.Add(-1)
		b.prefillTok.Add(-a.prefillTok)
	}
	b.inflight.Add(-1)
	b.ended.Add(1)
	if a.turned && b.hints != nil {
		if p := b.hints.p.Load(); p != nil {
			p.turn(b, a.turnKey, turnEnded, now)
		}
	}
	if a.warm {
		b.warm.Add(-1)
	}
	if backendFailed {
		b.failures.Add(1)
	}
	if a.pendingTTFT { // no usage came: train on the estimate
		b.observeTTFT(a, a.ttft, now)
		a.pendingTTFT = false
	}
	if !a.first {
		if a.hashes != nil {
			a.owner.Drop(a.hashes)
		}
		if backendFailed {
			if waited := now.Sub(a.start).Seconds(); waited > 2*a.predicted() {
				b.observeTTFT(a, waited, now)
			}
		}
		return
	}
	if !backendFailed {
		// The seat was held from the start of the prefill (the engine's part of the TTFT, past any wait for a
		// seat) to the end of the stream.
		hold := now.Sub(a.firstAt).Seconds() + a.engineTTFT(a.ttft)
		b.hold.add(hold)
		if b.fleetHold != nil {
			b.fleetHold.add(hold)
		}
	}
	if backendFailed || !a.gotUsage || a.completionTok < 2 {
		return
	}
	elapsed := a.usageAt.Sub(a.firstAt).Seconds()
	running := (a.runAtFirst + float64(b.decoding.Load()) + 1) / 2
	if e := b.engine.Load(); e.Fresh(now, time.Duration(b.staleAfter.Load())) {
		running = max(running, e.Running)
	}
	if !b.perturbed(a) {
		b.lat.observeITL(running, elapsed/float64(a.completionTok-1))
	}
}

// applyCapacity sets b's prefix-index capacity to its KV blocks (scraped, configured or default) times the
// calibrated share, when that moved by more than 2%.
func (b *Backend) applyCapacity() {
	o := b.prefixOwner()
	if o == nil {
		return
	}
	base := float64(b.kvBlocks.Load())
	if c := b.cfg.Load().PrefixCapacity; c > 0 {
		base = float64(c)
	}
	if base <= 0 {
		base = cache.DefaultCapacity
	}
	want := max(int(base*b.alpha.load()), 1)
	if cur := o.Capacity(); math.Abs(float64(want-cur)) > 0.02*float64(cur) {
		o.SetCapacity(want)
	}
}

// PredictTTFT returns b's predicted TTFT for a prompt of promptTokens of which cachedTokens are in its prefix
// cache, under its current load, RTT and the wait for a seat included: the mean and the p90. Lock-free.
func (b *Backend) PredictTTFT(promptTokens, cachedTokens int) (mean, p90 time.Duration) {
	l := b.loadAt(b.clock.Now())
	u := float64(uncachedTokens(promptTokens, cachedTokens))
	m := b.lat.ttftMean(u, l.queuedTok, l.running)
	base := b.rtt() + l.seatWait
	return duration(base + m), duration(base + m*b.lat.ttftSpread.load())
}

// PrefillAhead returns, from b's TTFT model, how much later than on an engine with nothing queued a request sent
// to b now would get its first token because of the prefill queued there (this replica's own in full, held
// included, the other replicas' as reported and drained, the engine's waiting requests) plus extra tokens more;
// idle is the first token of a prompt of extra tokens with nothing queued, and queued reports whether anything
// is. Lock-free.
//
// The delay is at least those tokens at the engine's own prefill cost per token (the model's coefficient of a
// prompt's uncached tokens): an engine computes the prefill queued before a request ahead of it, or in the same
// chunked steps, token for token. The model's queued-prefill term is a separate fit of the same cost and can
// come out lower: on the protect matrix's n1/s64 engine (10,000 prompt tokens/s, 0.1 ms a token) it learned
// 0.053-0.079 ms a queued token against 0.089-0.114 for the prompt's own, and let a third more prefill ahead of
// a critical request than pacing allows (admission/README.md, "Prefill pacing").
func (b *Backend) PrefillAhead(extra int) (ahead, idle time.Duration, queued bool) {
	l := b.loadAt(b.clock.Now())
	q := l.queuedTok + float64(max(b.heldTok.Load(), 0))
	x := float64(max(extra, 0))
	alone := b.lat.ttftMean(x, 0, l.running)
	ahead = duration(max(b.lat.ttftMean(x, q+x, l.running)-alone, (q+x)*b.lat.prefillPerToken(), 0))
	return ahead, duration(alone), q > 0
}

// Hold counts tokens of prefill that an attempt claimed for b will send it (at its Dispatch) as queued there for
// PrefillAhead, until Unhold gives them back: call Unhold right before the attempt's Dispatch, or when it is given
// up unsent. Between the pick that claims a backend and the Dispatch that counts its prefill, the request path
// does other work; requests picked in that gap did not see each other's prefill, and a gateway queue's waiters,
// which its dispatcher picks one after another before any of them is sent, went to an engine together (three
// sheddable prompts of 991 tokens released at once ahead of a critical request in the protect matrix's n1/s64
// cell; admission/README.md, "Prefill pacing"). Negative tokens count as none. Lock-free.
func (b *Backend) Hold(tokens int) {
	if tokens > 0 {
		b.heldTok.Add(int64(tokens))
	}
}

// Unhold gives back tokens a Hold counted.
func (b *Backend) Unhold(tokens int) {
	if tokens > 0 {
		b.heldTok.Add(-int64(tokens))
	}
}

// PredictITL returns b's predicted inter-token latency with one more sequence decoding: mean and p90.
func (b *Backend) PredictITL() (mean, p90 time.Duration) {
	l := b.loadAt(b.clock.Now())
	m := b.lat.itlMean(l.running + 1)
	return duration(m), duration(m * b.lat.itlSpread.load())
}
