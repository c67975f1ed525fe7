package admission

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// CapParams tune the adaptive concurrency caps. DefaultCapParams gives the defaults.
//
// The rule (AIMD, routing.md 4.6.4), applied on each first-token observation of a backend with an adaptive cap:
//
//	decrease: waiting > TargetWaiting, or observed/predicted TTFT > HighRatio
//	          => limit *= Backoff, at most once per min(limit, inflight) observations (one "round trip": the
//	             requests already in flight when the cap shrank do not shrink it again)
//	increase: waiting == 0 and observed/predicted < LowRatio and inflight >= limit/2
//	          => limit += 1/limit (one more slot per limit good observations), or += 1 in slow start (before
//	             the first decrease: the cap doubles per round trip until the engine first pushes back)
//	otherwise hold; limit stays within [Min, Max]
//
// The engine's queue (waiting) is the main signal: a cap above the engine's batch capacity shows as requests
// waiting inside the engine, where the gateway can no longer reorder them or pick another backend for them. The
// TTFT ratio catches a backend that slows without queueing (a noisy neighbour, thermal throttling) before the
// latency model has re-learned it. "inflight >= limit/2" keeps an underused cap from growing without bound
// (Netflix Gradient2's app-limited rule).
type CapParams struct {
	// Initial is an adaptive cap's starting limit while the engine's seats are not stated (Cap.SeatsSource).
	// Default 8: start low and let slow start (doubling per scrape that shows the engine running all it is sent,
	// +1 per good first token) find the engine's batch, as TCP does, rather than flood a small engine's queue at startup, where
	// the gateway can no longer order the requests (a cap of 32 against engines running 16 put the first seconds
	// of an overload in the engines' queues, and critical requests behind standard ones).
	Initial float64
	// Min and Max bound an adaptive cap. Defaults 2 and 1024. Max bounds the growth on first tokens only: seats
	// the engine or the policy states, and the doubling while the scrapes show the engine running all it is
	// sent (Cap.ObserveBatch), may take the limit past it.
	Min, Max float64
	// TargetWaiting is the engine queue above which the cap shrinks. Default 2 (routing.md: waiting ~1-2).
	TargetWaiting int
	// HighRatio and LowRatio are the observed/predicted TTFT ratios above which the cap shrinks and below which
	// it may grow. Defaults 1.5 and 1.1.
	HighRatio, LowRatio float64
	// Backoff is the multiplicative decrease. Default 0.9.
	Backoff float64
	// Slack is how late a first token must also be, beyond HighRatio times its prediction, to count as slow.
	// Default 25 ms.
	Slack time.Duration
}

// DefaultCapParams returns the defaults listed on CapParams.
func DefaultCapParams() CapParams {
	return CapParams{Initial: 8, Min: 2, Max: 1024, TargetWaiting: 2, HighRatio: 1.5, LowRatio: 1.1, Backoff: 0.9,
		Slack: 25 * time.Millisecond}
}

func (p CapParams) withDefaults() CapParams {
	d := DefaultCapParams()
	if p.Min <= 0 {
		p.Min = d.Min
	}
	if p.Max <= 0 {
		p.Max = d.Max
	}
	p.Max = max(p.Max, p.Min)
	if p.Initial <= 0 {
		p.Initial = d.Initial
	}
	p.Initial = min(max(p.Initial, p.Min), p.Max)
	if p.TargetWaiting <= 0 {
		p.TargetWaiting = d.TargetWaiting
	}
	if p.HighRatio <= 0 {
		p.HighRatio = d.HighRatio
	}
	if p.LowRatio <= 0 {
		p.LowRatio = d.LowRatio
	}
	if p.Backoff <= 0 || p.Backoff >= 1 {
		p.Backoff = d.Backoff
	}
	if p.Slack <= 0 {
		p.Slack = d.Slack
	}
	return p
}

// Cap is one backend's concurrency cap: requests in flight through the gateway are at most Limit. The cap is
// static when the backend's max_concurrency > 0, and adaptive otherwise (CapParams). Keeping engine queues
// shallow moves the queue into the gateway, where it is ordered by priority and deadline and bound late to
// whichever backend frees first.
//
// The request path uses it twice: as a saturation filter before routing (skip backends that are Full), and as
// the gate of every attempt (TryAcquire after the pick; Release when the attempt ends). Every method is
// lock-free and allocation-free. A Cap must not be copied.
type Cap struct {
	name      string
	p         CapParams
	static    atomic.Int64 // > 0: a fixed limit
	limit     afloat       // the adaptive limit
	inflight  atomic.Int64
	since     atomic.Int64 // observations since the last decrease
	steady    atomic.Bool  // past slow start: a decrease happened
	seats     atomic.Int64 // the engine's batch size as last learned (0: unknown)
	fromPeers atomic.Bool  // seats is what the backend's peers agree on, not its own measure (adoptPeers)
	seatsAge  atomic.Int64 // observations since the last evidence of seats (>= SeatsTTL: probing)
	seatsLow  atomic.Int64 // evidence of fewer seats than the estimate since the last that confirmed it
	stated    atomic.Int64 // seats the engine or the policy states (0: neither); wins over seats
	statedBy  atomic.Int32 // a SeatSource: SeatsEngine or SeatsPolicy
	policy    atomic.Int64 // the policy's max_num_seqs (0: none), stated when the engine states nothing
	floor     atomic.Int64 // the largest batch the engine ever ran: it has at least these seats
	peerFloor atomic.Int64 // the largest batch any of its peers ran (PeerEngine; 0: none)
	queued    atomic.Int32 // scrapes in a row that showed a queue with floor running, no more (ObserveBatch)
	batchSeen atomic.Bool  // a scrape exported the engine's batch and queue (provisional seats apply)
	engine    atomic.Pointer[engineRef]
	scrapeAt  atomic.Int64 // UnixNano of the last scrape the cap consumed (engineRef)
	probedAt  atomic.Int64 // UnixNano of the end of the last seat probe the cap took (ProbedEngine)
	idle      atomic.Bool  // that scrape showed nothing waiting
	sole      atomic.Bool  // the only backend of every model it serves (CapConfig.Sole)
	crept     atomic.Int64 // scrapeAt of the last request let past the fleet's reserve below the proven batch (Probe)
	refuseAt  atomic.Int64 // the most requests the engine holds before it refuses (Engine.EngineCeiling; 0: none)
	gauge     prometheus.Gauge
}

// Name returns the backend's name.
func (c *Cap) Name() string { return c.name }

// TryAcquire takes a slot if fewer than LimitFor(Critical) requests are in flight (the limit, or the engine's
// seats when known), and reports whether it did. Call it for every attempt (first try, retry, hedge) on the
// backend the attempt goes to, after the pick and before sending; on false, pick another backend or queue.
// Every true must be matched by exactly one Release. TryAcquireFor applies a class's limit.
func (c *Cap) TryAcquire() bool { return c.tryAcquire(int64(c.LimitFor(Critical, true))) }

// tryAcquire takes a slot if fewer than limit requests are in flight. Lock-free.
func (c *Cap) tryAcquire(limit int64) bool {
	for {
		n := c.inflight.Load()
		if n >= limit {
			return false
		}
		if c.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// AcquirePast takes a slot whatever the limit: for an attempt that goes to this backend although the cap is full
// (a hedge of an admitted request, or a retry with admission off: Claim.Force), so that Inflight stays what the
// engine was sent and the seats it leaves free (Free) are real. Matched by one Release, as a slot from
// TryAcquire.
func (c *Cap) AcquirePast() { c.inflight.Add(1) }

// Release gives back a slot taken by TryAcquire or AcquirePast: call it when the attempt ends (completed, failed,
// cancelled or lost a hedge), then Signal the queue.
func (c *Cap) Release() { c.inflight.Add(-1) }

// Limit returns the current cap: the static or adaptive limit, and never more than the engine's ceiling
// (Ceiling), past which it would refuse the requests.
func (c *Cap) Limit() int {
	c.poll()
	l := int(c.limit.load())
	if s := c.static.Load(); s > 0 {
		l = int(s)
	}
	if m := c.refuseAt.Load(); m > 0 {
		l = min(l, int(m))
	}
	return l
}

// Ceiling returns the most requests the engine says it holds at once before it refuses new ones (TGI's
// max_concurrent_requests, read by the Monitor from its info document), or 0 when it states none. Limit never
// exceeds it: requests past it would come back 429 and be retried elsewhere or fail, where the gateway's queue
// holds them in order and binds them to the first seat that frees.
func (c *Cap) Ceiling() int {
	c.poll()
	return int(c.refuseAt.Load())
}

// Inflight returns the slots taken.
func (c *Cap) Inflight() int { return int(c.inflight.Load()) }

// Full reports whether TryAcquire would fail now: no request of any class fits.
func (c *Cap) Full() bool { return c.inflight.Load() >= int64(c.LimitFor(Critical, true)) }

// CriticalReserve is the share of every cap held back for critical requests while the model has critical demand
// and the engine's batch size is not known (see LimitFor): standard and sheddable requests may fill a backend
// only up to its limit less this reserve (at least one slot when the limit allows two), critical ones up to the
// whole limit.
const CriticalReserve = 0.15

// SeatsTTL is how many first-token observations a learned engine batch size (Seats) stays confirmed without new
// evidence. Requests filling exactly the batch never make the engine queue, so the estimate must be tested now
// and then: once it lapses, standard and sheddable requests may fill one seat more (a probe). If the engine
// keeps the probe waiting, the batch is confirmed; if it runs it, the batch grew (a restart with a larger
// --max-num-seqs, shorter sequences under a KV-cache or token-budget limit, an estimate taken while a long
// prefill held the engine) and the estimate follows, a seat per scrape while the demand lasts. Critical requests
// never take the probe's seat, so they do not wait inside an engine for it.
const SeatsTTL = 256

// seatsLowEvidence is how many first tokens must bring evidence of a smaller batch than the estimate, with none
// confirming it in between, to lower it: one scrape may catch a seat freed between two steps.
const seatsLowEvidence = 4

// Seats returns the engine's batch size as last learned, or 0 when unknown. The batch size is the engine's
// running count while it also keeps requests waiting (vllm:num_requests_running while
// vllm:num_requests_waiting > 0, judged by ObserveScrape): it runs all it can and queues the rest.
//
// Seats stated by the engine (Engine's maxSeqs) or the policy (CapConfig.MaxNumSeqs) win over the learned ones:
// see SeatsSource.
func (c *Cap) Seats() int {
	c.poll()
	if s := c.stated.Load(); s > 0 {
		return int(s)
	}
	return int(c.seats.Load())
}

// LimitFor returns the slots a request of class c may fill. guard says whether the request's model has critical
// demand to keep engine seats for (SeatReserve.Seats > 0); critical requests are always guarded.
//
// Guarded, with the engine's batch size known (Seats), no request is sent to wait inside the engine: every class
// may fill the batch, and the seats kept free for critical requests are the fleet's business (SeatReserve);
// while the estimate is being tested (SeatsTTL), standard and sheddable requests may fill one seat more. The
// cap's limit alone (up to Seats + TargetWaiting, which keeps an engine busy between completions) let a critical
// request queue inside one engine behind that engine's next completion: in protect-overload a quarter of the
// critical requests went as a seventeenth to 16-seat engines, with a p99 TTFT of 995 ms against 116 ms for
// those that found a seat.
//
// Guarded without a known batch size, a cap that reads its engine's batch and queue works with the
// provisional seats (Batch: the largest batch the engine ever ran, or Initial if that is more):
// critical requests fill at most those, the others a probe more (probeMargin: one seat for small engines, an
// eighth of the proven batch for large ones), the probe that grows them per scrape that shows the engine ran
// them all (ObserveBatch), so that few requests wait inside the engine while the seats are found; the limit's
// doubling by the scrapes would put up to a limit's worth there, and the critical requests sent next behind
// them. A critical request held in the gateway goes to the first seat that frees on any backend, where sent
// past a proven batch that was the whole batch it would wait for this engine's. On the only backend of its
// models (CapConfig.Sole) there is no other seat to wait for: critical requests fill the limit while the last
// scrape showed nothing waiting (a seat, or a place in the engine's queue behind only what was sent before
// them, as in the gateway's queue) and take the probe too once it shows a queue. Held to the proven batch there while
// standard requests took the probe, critical requests waited 3-4 s in the gateway through a 2x spike on one
// 64-seat engine, and up to 0.6 s at half its load (bench/results/protect-2026-12-02-matrix.md). The fleet's
// reserve counts free seats over the provisional ones (Free); what lets the probe past it is Probe.
// A cap without such scrapes lets critical requests fill the limit, the others the limit less
// CriticalReserve. Unguarded (no critical demand), every class may fill the limit: the cap's AIMD alone keeps the
// engine's queue short, nothing is held back for requests that do not come (protect-region-down, which has no
// critical traffic, shed 13-21 requests while the failover region's caps, less 15%, grew), and a batch size
// learned from a passing queue (a long prompt's prefill step holding a 64-seat engine) cannot throttle it.
func (c *Cap) LimitFor(class Class, guard bool) int {
	limit := c.Limit()
	if s := c.Seats(); s > 0 && c.static.Load() <= 0 && (guard || class == Critical) {
		if class != Critical && c.stated.Load() <= 0 && c.seatsAge.Load() >= SeatsTTL {
			s++ // the probe (stated seats are not tested: the engine or its operator said so)
		}
		return min(limit, s)
	}
	if s := c.provisional(); s > 0 && guard {
		switch {
		case class != Critical:
			return min(limit, s+probeMargin(s)) // the probe, past what the engine proved it runs
		case !c.sole.Load():
			return min(limit, s)
		case c.idle.Load():
			return limit // nothing waited at the last scrape: a seat now, or a place behind what was sent before
		}
		return min(limit, s+probeMargin(s))
	}
	if class == Critical || !guard || limit < 2 {
		return limit
	}
	return limit - max(1, int(math.Ceil(CriticalReserve*float64(limit))))
}

// Free returns the engine seats free on this backend, and whether that is known: the engine's batch size is
// known or provisional (Batch), and the cap adapts.
func (c *Cap) Free() (int, bool) {
	b := c.Batch()
	if b <= 0 || c.static.Load() > 0 {
		return 0, false
	}
	return max(min(c.Limit(), b)-c.Inflight(), 0), true
}

// Probe reports whether a standard or sheddable request may take a slot here past the fleet's reserve
// (SeatReserve.Admits) because it probes seats the engine has not proved: the engine's seats are provisional,
// and either the proven ones are all taken (the probe past them, probeMargin), or the last scrape showed nothing
// waiting and no request has crept past the reserve since that scrape. Probe only looks: the request path
// filters its candidates with it, and the request sent claims the slot with ClaimProbe on the backend routing
// picked.
//
// The probe's slots are not among the free seats the reserve counts (Free). The creep, one request a scrape,
// is what lets provisional seats grow while the reserve holds part of them: counted over a lower bound, half of
// a fresh cap's 8, the reserve kept standard requests from ever filling the rest, so the probe past them never
// ran, and 75 of 106 requests were refused at half the capacity of a 64-seat engine that ran 5.
func (c *Cap) Probe() bool {
	open, _ := c.probe()
	return open
}

// probe reports whether a probe slot is open here (Probe), and whether it is the creep below the proven batch,
// which a request must claim (ClaimProbe).
func (c *Cap) probe() (open, creep bool) {
	s := c.provisional()
	if s <= 0 {
		return false, false
	}
	n, lim := c.Inflight(), min(c.Limit(), s+probeMargin(s))
	if n >= lim {
		return false, false
	}
	if n >= s {
		return true, false
	}
	return c.idle.Load() && c.crept.Load() != c.scrapeAt.Load(), true
}

// ClaimProbe claims the slot Probe offered for a request about to be sent here, and reports whether it got it:
// the probe past the proven batch is open to every request while it lasts (TryAcquireFor bounds it), the creep
// below it to one request per idle scrape, which the first to claim it gets. Claimed by the backend picked, not
// by every candidate the filter looked at: when the filter claimed it, one request spent the creep of every
// candidate and went to one of them, so a fleet of n engines crept n times slower than its scrapes allow.
func (c *Cap) ClaimProbe() bool {
	open, creep := c.probe()
	if !open || !creep {
		return open
	}
	at, last := c.scrapeAt.Load(), c.crept.Load()
	return c.idle.Load() && last != at && c.crept.CompareAndSwap(last, at)
}

// Batch returns the engine seats the cap works with while the model has critical demand: the known seats
// (Seats), else, for an adaptive cap that reads its engine's scrapes, the provisional figure (the largest
// batch the engine ran without a queue, SeatsFloor, or CapParams.Initial if that is more), else 0. The fleet's
// reserve counts free seats over known seats only (Cap.Free).
func (c *Cap) Batch() int {
	if s := c.Seats(); s > 0 {
		return s
	}
	return c.provisional()
}

// FullFor reports whether TryAcquireFor(class, guard) would fail now.
func (c *Cap) FullFor(class Class, guard bool) bool {
	return c.inflight.Load() >= int64(c.LimitFor(class, guard))
}

// TryAcquireFor takes a slot for a request of class c, within LimitFor(c, guard). Lock-free.
func (c *Cap) TryAcquireFor(class Class, guard bool) bool {
	return c.tryAcquire(int64(c.LimitFor(class, guard)))
}

// Adaptive reports whether the cap adapts (max_concurrency 0).
func (c *Cap) Adaptive() bool { return c.static.Load() <= 0 }

// Observe feeds one first-token observation of an attempt on the backend: ttft the observed time to first
// token, predicted what routing predicted for it at dispatch (Decision.TTFT, RTT included in both; 0 when
// unknown, then only waiting counts), waiting the engine's queue as last scraped (vllm:num_requests_waiting;
// 0 when stale or unknown). Call it when the attempt's first token arrives; a first-byte timeout may be fed as
// an observation with ttft the time waited. Static caps ignore it.
func (c *Cap) Observe(ttft, predicted time.Duration, waiting int) {
	c.ObserveEngine(ttft, predicted, waiting, 0)
}

// ObserveEngine is Observe with the engine's running batch as last scraped (vllm:num_requests_running; 0 when
// unknown). When requests wait inside the engine, the engine is telling how many sequences it really runs: the
// cap then drops at once to running + TargetWaiting (if that is below the usual backoff) instead of creeping
// down by Backoff once per round of first tokens, which from a limit of 32 took the better part of a minute
// against an engine running 16 while the queue, and the order of its requests, sat in the engine.
func (c *Cap) ObserveEngine(ttft, predicted time.Duration, waiting, running int) {
	if !c.Adaptive() {
		return
	}
	p := &c.p
	// The TTFT ratio is judged with an absolute slack on the way down: for a backend that answers in
	// milliseconds, scheduler jitter alone puts observed/predicted above 1.5 (the cap of a 2 ms backend collapsed
	// to its minimum and queued a thousand requests a second), so a first token is slow only if it is also Slack
	// late. Not on the way up: counting a first token within the slack as good let the caps of a failover region
	// grow into engine queues during an outage (protect-region-down: 24-51 requests shed with 503 instead of 0).
	slow, good := false, true
	if predicted > 0 && ttft > 0 {
		excess := ttft - predicted
		slow = float64(ttft) > p.HighRatio*float64(predicted) && excess > p.Slack
		good = float64(ttft) < p.LowRatio*float64(predicted)
	}
	since := c.since.Add(1)
	// Requests waiting in the engine shrink the cap unless the first token came within the slack: an engine that
	// steps every few milliseconds always has a few requests waiting for the next step, which is not a queue.
	queued := waiting > p.TargetWaiting && (ttft <= 0 || ttft > p.Slack)
	switch {
	case queued || slow:
		if c.steady.Load() && float64(since) < min(c.limit.load(), float64(c.inflight.Load())) {
			return // the cap already shrank for the requests in flight (before the first decrease, none did)
		}
		if c.since.CompareAndSwap(since, 0) {
			c.steady.Store(true)
			c.set(c.limit.update(func(l float64) float64 {
				next := l * p.Backoff
				if running > 0 && queued {
					next = min(next, float64(running+p.TargetWaiting))
				}
				return max(next, p.Min)
			}))
		}
	case waiting == 0 && good:
		if float64(c.inflight.Load()) < c.limit.load()/2 {
			return // app-limited: the cap is not what holds traffic back
		}
		if !c.steady.Load() {
			c.set(c.limit.update(func(l float64) float64 { return min(l+1, c.ceiling()) }))
			return
		}
		c.set(c.limit.update(func(l float64) float64 { return min(l+1/l, c.ceiling()) }))
	}
}

// ceiling is how far the limit may grow: Max, or Seats + TargetWaiting while the engine's batch size is known.
// Requests fill at most Seats (and a probe) then, so the limit is not what holds them back, and without the
// ceiling it would creep up on every good first token.
//
// Stated seats are not bounded by Max (the engine or its operator said so), nor is a limit the scrapes grew
// past Max (ObserveBatch): a good first token never lowers the limit.
func (c *Cap) ceiling() float64 {
	tw := float64(c.p.TargetWaiting)
	if s := c.stated.Load(); s > 0 {
		return float64(s) + tw
	}
	if s := c.seats.Load(); s > 0 {
		return min(float64(s)+tw, max(c.p.Max, c.limit.load()))
	}
	return max(c.p.Max, c.limit.load())
}

// ObserveScrape feeds an attempt's first token with the engine metrics the gateway held then, to learn the
// engine's batch size (Seats): ttft the observed time to first token, waiting and running as scraped
// (vllm:num_requests_waiting and vllm:num_requests_running; 0 when stale or unknown). Call it with ObserveEngine;
// static caps ignore it.
//
// Evidence of a full batch is a scrape showing requests waiting, seen by a first token that took longer than
// Slack (a fast engine always has a few requests waiting for its next step, and answers them within it), with
// at least nearLimit running (an engine running far fewer than the gateway may send it is held by something
// else for a moment, a long prompt's prefill step, not by its batch). Such a scrape confirms or raises the
// estimate to its running count; seatsLowEvidence of them below it lower it. While the estimate is tested
// (SeatsTTL), the probe waiting with the estimate running confirms it, and a scrape without a queue that finds
// more running (the probe ran) raises it. Lock-free.
func (c *Cap) ObserveScrape(ttft time.Duration, waiting, running int) {
	if !c.Adaptive() || c.stated.Load() > 0 {
		return // stated seats are not learned
	}
	age := c.seatsAge.Add(1)
	if running <= 0 {
		return
	}
	r, cur := int64(running), c.seats.Load()
	late := ttft > c.p.Slack
	switch {
	case waiting > 0 && late && float64(r) >= c.nearLimit():
		if r < cur && c.seatsLow.Add(1) < seatsLowEvidence {
			return
		}
		c.seats.Store(r)
		c.fromPeers.Store(false)
		c.seatsAge.Store(0)
		c.seatsLow.Store(0)
	case cur > 0 && age > SeatsTTL && waiting > 0 && r == cur:
		c.seatsAge.Store(0) // the probe waits: confirmed
	case cur > 0 && waiting == 0 && r > cur:
		c.seats.Store(r) // the probe ran
		c.fromPeers.Store(false)
	}
}

// nearLimit is how many must run, with requests waiting, for the scrape to show the engine's batch: the cap's
// limit less TargetWaiting + 1, or three quarters of the limit if that is less. An engine running far fewer
// than the gateway may send it is held by something else for a moment (a long prompt's prefill step); but an
// engine at its batch with a queue of one or two does not shrink the cap, which may sit a few above it
// (protect-overload: a backend with a limit of 20-21 and 16 running never learned its batch when only limit - 3
// counted, and a critical request waited there up to a second).
func (c *Cap) nearLimit() float64 {
	l := c.limit.load()
	return min(l-float64(c.p.TargetWaiting+1), 0.75*l)
}

func (c *Cap) set(limit float64) {
	if c.gauge != nil {
		c.gauge.Set(float64(int(limit)))
	}
}

// setStatic installs max_concurrency (0: adaptive).
func (c *Cap) setStatic(maxConcurrency int) {
	c.static.Store(int64(max(maxConcurrency, 0)))
	if c.gauge != nil {
		c.gauge.Set(float64(c.Limit()))
	}
}

// CapConfig is one backend's cap setting.
type CapConfig struct {
	// Name is the backend's name.
	Name string
	// MaxConcurrency is the backend's max_concurrency: > 0 a static cap, 0 adaptive.
	MaxConcurrency int
	// MaxNumSeqs is the backend's max_num_seqs, the engine's seats as the policy states them; 0: not stated.
	MaxNumSeqs int
	// Engine, when not nil, is read for what the engine says of its batch (Cap.ObserveBatch); nil: the cap
	// learns from first tokens alone.
	Engine Engine
	// Sole says the backend is the only one of every model it serves: a request held in the gateway for it can
	// only ever go to it (Cap.LimitFor).
	Sole bool
}

// Caps holds the Cap of every backend. Caps keep their state (the learned limit, the slots taken) across policy
// reloads: Update changes settings in place. Get is lock-free; Update serialises with itself.
type Caps struct {
	p  CapParams
	m  *metrics.Gateway
	mu sync.Mutex
	by atomic.Pointer[map[string]*Cap]
}

// NewCaps returns an empty set; zero fields of p take their defaults. m (nil: none) receives
// switchyard_backend_concurrency_limit.
func NewCaps(p CapParams, m *metrics.Gateway) *Caps {
	cs := &Caps{p: p.withDefaults(), m: m}
	empty := map[string]*Cap{}
	cs.by.Store(&empty)
	return cs
}

// Update installs the backends of a new policy: new names get a Cap (adaptive ones start at Initial),
// existing ones keep theirs with the new max_concurrency, and names not in backends are dropped (a request
// still holding a dropped Cap releases into it harmlessly). Call it when a policy snapshot is built; resolve
// each backend's *Cap then (Get) so that the request path does no lookup.
func (cs *Caps) Update(backends []CapConfig) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	old := *cs.by.Load()
	next := make(map[string]*Cap, len(backends))
	for _, b := range backends {
		c := old[b.Name]
		if c == nil {
			c = &Cap{name: b.Name, p: cs.p}
			c.limit.store(cs.p.Initial)
			c.since.Store(1 << 40) // the first decrease need not wait for a round trip
			c.seatsAge.Store(SeatsTTL)
			if cs.m != nil {
				c.gauge = cs.m.ConcurrencyLimit.WithLabelValues(b.Name)
			}
		}
		c.setStatic(b.MaxConcurrency)
		c.setEngine(b.Engine, b.MaxNumSeqs)
		c.sole.Store(b.Sole)
		next[b.Name] = c
	}
	for name := range old {
		if next[name] == nil && cs.m != nil {
			cs.m.ConcurrencyLimit.DeleteLabelValues(name)
		}
	}
	cs.by.Store(&next)
}

// Get returns the backend's Cap, or nil for a name Update did not install. Lock-free.
func (cs *Caps) Get(name string) *Cap { return (*cs.by.Load())[name] }
