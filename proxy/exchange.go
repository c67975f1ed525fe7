package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// maxEventBytes bounds one upstream SSE event; maxErrorBody bounds an upstream error body we read.
const (
	maxEventBytes = 4 << 20
	maxErrorBody  = 64 << 10
)

// errNoCapacity: every candidate backend is at its concurrency cap or out of service (the request can wait).
var errNoCapacity = errors.New("proxy: no backend has capacity")

// errNoCapacityForClass is errNoCapacity for a critical request when a backend's cap still has the probe seat
// that only standard and sheddable requests may take (admission.ErrNoCapacityForClass).
var errNoCapacityForClass = fmt.Errorf("%w for this class", errNoCapacity)

// hedgeMaxPromptTokens bounds the prompts that may be hedged: a hedge repeats the prefill on a second backend,
// which is cheap for a short prompt and a real cost for a long one (routing.md 4.7: hedge cheap prefills only).
const hedgeMaxPromptTokens = 2048

// errHedgeLost ends the attempt that lost a hedged race; it never counts against the backend.
var errHedgeLost = errors.New("proxy: hedge race lost")

// exchange is one client request on its way through the gateway: the client's body and its summary, its
// admission (key, class, quota), the attempts on backends, and the relay of the answer. Exchanges are pooled.
//
// Ownership: the handler acquires it; for a streaming answer it hands it, with the connection, to the relay of a
// hijacked stream (hijack.go: the relay releases it at the stream's end), or to fasthttp as the response body
// stream (WriteTo relays, Close releases); otherwise the handler releases it before returning. Nothing in it
// refers to the fasthttp.RequestCtx after the handler returns (hctx only until the hijack handler starts), except
// the client net.Conn (in the watchdog), which lives as long as the connection and is only used while the
// exchange's stream or request is on it.
type exchange struct {
	s       *Server
	fwd     fasthttp.RequestHeader // the client's headers passed on; kept across uses (reset in place)
	results chan *attempt          // hedged attempts report here; kept across uses

	hijackFn func(net.Conn) // hijacked, bound once per exchange so that a hijack allocates nothing
	resumeFn func()         // resumed, bound once

	clientRequest // what the client sent
	routed        // its admission and its attempts
	relayed       // what the relay learned
	yieldState    // a stream that may yield its seat (yield.go)

	wd       *watchdog
	code     int // the status the client got (499 when it left)
	done     bool
	poisoned bool // code on this exchange panicked: it is discarded, never pooled (recover.go)

	rc   respCacheState // the response cache's part (respcache.go)
	cost costState      // prices, budget and objective (cost.go)

	obs  observation  // traces and the access log (observe.go)
	note decisionNote // what the status page keeps of routing and admission (decisions.go)
}

// clientRequest is the part of an exchange that holds what the client sent: where, when, and its body.
type clientRequest struct {
	rt       *route          // the endpoint the client called
	endpoint openai.Endpoint // rt.api
	path     []byte
	arrival  time.Time
	reqID    []byte
	client   net.Conn
	clientIP net.IP

	body   []byte         // the client's body, copied
	ctype  []byte         // the client's Content-Type, for bodies that are not JSON (forms)
	query  []byte         // the client's query string, passed on
	sum    openai.Summary // what routing needs from body (parse overwrites it, keeping its buffers)
	gen    openai.Generic // what a pass-through route reads of body (rt.api == 0)
	upBody []byte         // body as sent upstream
	upFor  string         // the upstream model name upBody was built for ("" = not built)
	priBuf []byte         // upBody with the engine's priority field (withPriority)
	spare  []*[]byte      // empty holders of reqBufs (shedRequest), room for the four buffers above
}

// reset empties r for the next request, keeping its buffers unless the body made them larger than 1 MiB (one
// huge prompt must not pin memory in the pool).
func (r *clientRequest) reset() {
	body, upBody, priBuf := r.body[:0], r.upBody[:0], r.priBuf[:0]
	if cap(body) > 1<<20 {
		body, upBody, priBuf = nil, nil, nil
	}
	spare := r.spare
	if spare == nil {
		spare = make([]*[]byte, 0, 4)
	}
	*r = clientRequest{path: r.path[:0], reqID: r.reqID[:0], body: body, ctype: r.ctype[:0], query: r.query[:0],
		sum: r.sum, gen: r.gen, upBody: upBody, priBuf: priBuf, spare: spare}
}

// The byte buffers of a request (the client's body, the body sent upstream with and without the priority
// field, the canonical prompt) are each as large as its prompt. A streamed answer does not read them once it is
// committed, and a stream spends nearly all its life waiting for tokens, so at the commit they go to reqBufs,
// shared by every exchange, rather than stay with the pooled exchange (shedRequest): an open stream holds none
// of its prompt (docs/design.md, "Pooling"). A buffer travels in a holder (a *[]byte, which a sync.Pool stores
// without allocating); an exchange keeps the holders it emptied (spare) for the buffers it gives back, so that
// neither direction allocates once the pools are warm.
var reqBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxReqBuf is the largest buffer reqBufs keeps, as clientRequest.reset keeps none larger.
const maxReqBuf = 1 << 20

// reqBuf returns b emptied, or, when b went to reqBufs, an empty buffer from it.
func (r *clientRequest) reqBuf(b []byte) []byte {
	if b != nil {
		return b[:0]
	}
	h := reqBufs.Get().(*[]byte)
	b = (*h)[:0]
	*h = nil
	if len(r.spare) < cap(r.spare) {
		r.spare = append(r.spare, h)
	}
	return b
}

// putReqBuf gives b to reqBufs.
func (r *clientRequest) putReqBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxReqBuf {
		return
	}
	var h *[]byte
	if n := len(r.spare); n > 0 {
		h, r.spare = r.spare[n-1], r.spare[:n-1]
	} else {
		h = new([]byte)
	}
	*h = b[:0]
	reqBufs.Put(h)
}

// shedRequest gives the request's buffers to reqBufs once its streamed answer is committed. Nothing reads them
// after that: a committed stream is never retried, the response cache's key was made at the lookup, and the
// summary's scalar fields stay; its slices that alias the body (the model, the previous response's id) are
// cleared. (The attempt's upstream request, which held the body sent upstream, went back to fasthttp's pool once
// it was written: attempt.send.) The routing request's prompt and prefix hashes go when the attempt had its first
// token, their last use (routing.Request.ReleaseHashes).
func (ex *exchange) shedRequest() {
	ex.putReqBuf(ex.body)
	ex.putReqBuf(ex.upBody)
	ex.putReqBuf(ex.priBuf)
	ex.putReqBuf(ex.sum.Prompt)
	ex.body, ex.upBody, ex.priBuf, ex.upFor = nil, nil, nil, ""
	ex.sum.Prompt, ex.sum.Model, ex.sum.PreviousResponseID, ex.gen.Model = nil, nil, nil, nil
	ex.rreq.Prompt = nil
	if a := ex.cur; a != nil && a.gotFirst {
		ex.rreq.ReleaseHashes()
	}
}

// routed is the part of an exchange that holds the request's admission (model, key, class, quota) and its
// attempts on backends.
type routed struct {
	snap     *Snapshot
	asked    *Model    // the model the client asked for
	model    *Model    // the model that serves it (asked, or its degrade_to under brownout)
	rec      *modelRec // model's record: its backends' protections, queue, reserve, budgets (records.go)
	key      *admission.Key
	class    admission.Class
	guard    bool // the model has critical demand to keep engine seats for (set by each pick)
	reserved bool // the last pick passed the seat reserve's count (chooseFrom): take counts again once claimed
	quota    admission.Quota
	limited  bool // quota holds a reservation to settle
	quoted   bool // quota holds the x-ratelimit-* headers to send
	rreq     routing.Request
	respID   []byte           // the stored response the path names (/v1/responses/{id}...), or the one created
	pin      *routing.Backend // the only backend that may serve the request: where its stored response lives
	tried    []*routing.Backend
	cands    []routing.Target
	queued   *attempt // filled by the queue's Dispatch
	cur      *attempt // the attempt that answers, once run returned nil
	attempts int
	budgeted bool // counted in the retry budget's live requests
	fleeing  bool // a retry already moved this request off a backend that died: its later retries are not budgeted

	judged    bool          // the shedder judged the request on its TTFT prediction (its errors are measured)
	wait      time.Duration // the expected gateway wait it was judged on (0: none)
	queueWait time.Duration // how long it waited in the gateway's queue for a backend (0: it did not)
}

// reset empties r for the next request. Its attempts must have ended and its retry budget been given back.
func (r *routed) reset() {
	r.rreq.Reset()
	clear(r.tried)
	clear(r.cands)
	*r = routed{rreq: r.rreq, respID: r.respID[:0], tried: r.tried[:0], cands: r.cands[:0]}
}

// relayed is the part of an exchange that holds what the relay learned of the answer, and its buffers.
type relayed struct {
	injectedUsage bool // the gateway asked upstream for usage; the client did not
	firstAt       time.Time
	lastTokenAt   time.Time
	tokens        int
	usage         openai.Usage
	hasUsage      bool
	upstreamError bool     // the upstream sent an error event mid-stream
	committed     bool     // the answer streams to the client: its headers are handed to fasthttp
	end           endCause // how the committed stream ended (streamend.go), once it did
	sent          int64    // bytes of events written to a streaming client
	batch         *[]byte  // events read in a burst, not yet written (relay.go); pooled, nil between bursts
	replaying     bool
	replay        *openai.EventReader
	scratch       []byte
	modelBuf      []byte
	out           []byte
	asm           openai.Assembler // reset where it is used; kept with its buffers
	ci            openai.ChunkInfo
	tpot          prometheus.Observer
	itl           prometheus.Observer
	sr            *children // the metric children of srEnd for this request's labels (children.go), once needed
	srEnd         *endpoint // whose children sr are

	// A hijacked stream (hijack.go).
	parking     bool                 // the stream is hijacked: it parks while it waits for the engine
	woke        bool                 // resumed after a park: the next read is not parked again
	deadlineSet bool                 // the read deadline was set when the stream parked
	closeAfter  bool                 // the connection closes after the stream (Connection: close)
	hctx        *fasthttp.RequestCtx // fasthttp's context, from the handler to hijacked only
	cw          clientStream         // the client's body writer
	keep        net.Conn             // the connection to serve on after the stream
}

// reset empties r for the next request, keeping its reader and buffers.
func (r *relayed) reset() {
	r.replay.Reset(nil)
	*r = relayed{replay: r.replay, scratch: r.scratch[:0], modelBuf: r.modelBuf[:0],
		out: r.out[:0], asm: r.asm, ci: r.ci}
}

func (s *Server) acquireExchange() *exchange {
	ex, _ := s.exchanges.Get().(*exchange)
	if ex == nil {
		ex = &exchange{s: s, results: make(chan *attempt, 2)}
		ex.replay = openai.NewEventReader(nil, maxEventBytes)
		ex.hijackFn, ex.resumeFn = ex.hijacked, ex.resumed
	}
	return ex
}

func (s *Server) releaseExchange(ex *exchange) {
	if ex.wd != nil {
		ex.wd.stop()
		ex.wd = nil
	}
	if ex.cur != nil {
		ex.endAttempt(ex.cur, errNotSent)
		ex.cur = nil
	}
	if ex.queued != nil {
		ex.queued.free()
		ex.queued = nil
	}
	if ex.budgeted {
		s.retries.End()
	}
	ex.fwd.Reset()
	ex.clientRequest.reset()
	ex.routed.reset()
	ex.relayed.reset()
	ex.yieldState.reset()
	ex.code = 0
	ex.done, ex.poisoned = false, false
	ex.rc = respCacheState{}
	ex.cost = costState{}
	ex.resetObservation()
	s.exchanges.Put(ex)
}

// cancelled returns why the exchange was aborted from outside (client gone, shutdown), or nil.
func (ex *exchange) cancelled() error {
	if ex.wd == nil {
		return nil
	}
	return ex.wd.reason()
}

// admit is the admission step of docs/design.md, "The request path": the API key and its model permission, the
// priority class, the key's rate limits, brownout, and the shedding decision, which admits the request, queues
// it until a backend has capacity, or refuses it. On success the first attempt may already hold its backend.
func (ex *exchange) admit(h *fasthttp.RequestHeader) error {
	snap := ex.snap
	key, err := snap.Keys.Authenticate(h.Peek(fasthttp.HeaderAuthorization))
	if err != nil {
		return err
	}
	if err := admission.Authorize(key, ex.asked.Name); err != nil {
		return err
	}
	ex.key = key
	ex.class = snap.Priorities.Class(key, h.Peek(snap.Priorities.Header))
	if snap.Limiter != nil && key != nil {
		ex.quota = snap.Limiter.Take(key, admission.EstimateTokens(ex.sum.PromptTokens, ex.sum.MaxTokens, ex.sum.Sequences()))
		ex.quoted = true
		if ex.quota.Err != nil {
			return shedError{ex.quota.Err, ex.quota.RetryAfter}
		}
		ex.limited = true
	}
	if err := ex.admitCost(h); err != nil { // cost.go: the key's budget, the request's objective
		return err
	}
	if ex.lookupCache(h) { // respcache.go: an answer kept for this exact request needs no backend
		return errCacheHit
	}
	if snap.Shedder == nil {
		return nil // nothing to decide: every request goes
	}
	ex.rec.reserve.Arrive(ex.class) // every class: the reserve measures the critical share of arrivals

	t, err := ex.choose()
	if d := ex.model.DegradeTo; d != nil && ex.class != admission.Critical {
		primary := pool(ex.rec, ex.rreq.Decision().Saturated || errors.Is(err, errNoCapacity))
		degraded := pool(ex.rec.degrade, false)
		if ex.s.brownout.Degrade(ex.class, primary, degraded) {
			ex.s.m.Degraded.WithLabelValues(ex.model.Name, d.Name).Inc()
			ex.degrade(d)
			t, err = ex.choose()
		}
	}
	if err != nil && !errors.Is(err, errNoCapacity) {
		return err // no healthy backend at all
	}
	dec := ex.rreq.Decision()
	q := ex.rec.queue
	pool := pool(ex.rec, dec.Saturated || err != nil)
	in := admission.ShedInput{
		Class:       ex.class,
		SLO:         ex.model.SLO.TTFT,
		TTFT:        dec.TTFT,
		Wait:        q.ExpectedWait(ex.class),
		Saturation:  pool.Saturation,
		Saturated:   pool.Saturated,
		Queued:      q.Len(),
		Idle:        err == nil && t.Backend.Inflight() == 0,
		Calibration: ex.rec.fleet.Calibration,
	}
	d := snap.Shedder.Decide(&in)
	ex.judged, ex.wait = in.SLO > 0 && in.TTFT > 0 && ex.class != admission.Critical, d.Wait
	switch d.Verdict {
	case admission.Shed:
		return shedError{d.Err, d.RetryAfter}
	case admission.Admit:
		if err == nil {
			a := newAttempt(ex.s, ex.wd)
			if ex.take(a, t, false) == nil {
				ex.cur = a
				return nil
			}
			a.free()
		}
	}
	// Enqueue: wait for capacity; the queue's Dispatch picks again when a backend frees (late binding).
	ex.queued = newAttempt(ex.s, ex.wd)
	ctx, cancel := ex.wd.queueContext()
	deadline := snap.Shedder.Deadline(ex.arrival, &in, snap.Queue.Timeout)
	enqueued := ex.s.clock.Now()
	// yield.go: a critical request that waits asks a sheddable stream for its seat
	err = ex.waitForSeat(ctx, deadline)
	ex.queueWait = max(ex.s.clock.Now().Sub(enqueued), time.Nanosecond) // nonzero: it was queued
	cancel()
	if err != nil {
		if why := ex.cancelled(); why != nil {
			return why
		}
		if errors.Is(err, admission.ErrQueueTimeout) {
			ex.refusedLate() // admit.go
		}
		return err
	}
	ex.cur, ex.queued = ex.queued, nil
	return nil
}

// degrade moves the request to model d (brownout): routing starts over on d's backends.
func (ex *exchange) degrade(d *Model) {
	ex.model, ex.rec = d, ex.rec.degrade
	ex.rreq.Reset()
	ex.rreq.Model = d.Name
	ex.rreq.PromptTokens = ex.sum.PromptTokens
	ex.rreq.MaxTokens = ex.sum.MaxTokens
	ex.rreq.Prompt = ex.sum.Prompt
	ex.rreq.PrevTurn = ex.sum.PrevTurn
	ex.rreq.ITLSLO = d.SLO.ITL
	ex.routeObjective() // cost.go
	clear(ex.tried)
	ex.tried = ex.tried[:0]
}

// dispatchQueued is the queue's Dispatch: late binding, it picks among the backends that have capacity now.
// It runs on the queue's goroutine with the queue's lock held while the handler waits, so it only fills
// ex.queued and routing state; it does not block.
func dispatchQueued(ex *exchange) (err error) {
	defer func() {
		if r := recover(); r != nil {
			ex.s.recovered(stageDispatch, r)
			err = errPanic
		}
	}()
	ex.s.testPanic(stageDispatch)
	if err := ex.pick(ex.queued, true); err != nil {
		if errors.Is(err, errNoCapacityForClass) {
			return admission.ErrNoCapacityForClass
		}
		if errors.Is(err, errNoCapacity) {
			return admission.ErrNoCapacity
		}
		return err
	}
	return ex.tooLate(ex.queued) // admit.go: its chance to meet the objective may have passed while it waited
}

// choose filters the model's targets (not tried yet, concurrency cap not full, not ejected, and for standard and
// sheddable requests not down to the engine seats kept for critical ones; a backend whose breaker is open is unhealthy,
// which strategies skip) and asks the model's strategy to pick one. chooseFrom is the one place that filters backends
// by capacity; the permit (take) then claims what the filter saw, and counts the reserve again once claimed. It returns
// errNoCapacity when healthy backends exist but none can take more now, routing.ErrNoBackend when none is healthy.
func (ex *exchange) choose() (routing.Target, error) {
	return ex.chooseFrom(true)
}

func (ex *exchange) chooseFrom(respectCaps bool) (routing.Target, error) {
	ex.cands = ex.cands[:0]
	full := false
	free, seats := 0, 0 // engine seats free and in all, over the available backends whose batch size is known
	lower := false      // a full backend has a slot a less important class may take (the probe)
	counted := 0        // backends whose free seats are counted
	probing := false    // past the reserve only on a probe: the backend picked claims it (admission.Cap.ClaimProbe)
	rec := ex.rec
	reserve := rec.reserve
	ex.guard = ex.class == admission.Critical || reserve.Active()
	ex.reserved = false
	if respectCaps {
		free, seats, counted = rec.fleetSeats()
	}
	for i, t := range rec.m.Targets {
		var c *admission.Cap
		if respectCaps {
			g := &rec.ends[i].guards
			if o := g.Outlier; o != nil && !o.Available() {
				continue
			}
			c = g.Cap
		}
		if ex.triedContains(t.Backend) {
			continue
		}
		if ex.pin != nil && t.Backend != ex.pin {
			continue // a stored response's follow-up goes to the backend that holds it (responses.go)
		}
		if c != nil && c.FullFor(ex.class, ex.guard) && t.Backend.Healthy() {
			full = true
			lower = lower || (ex.class == admission.Critical && !c.FullFor(admission.Standard, ex.guard))
			continue
		}
		if respectCaps && ex.guard && ex.class != admission.Critical {
			if ahead, idle, queued := t.Backend.PrefillAhead(ex.rreq.PromptTokens); admission.PrefillPaced(ex.class,
				ex.guard, ahead, idle, queued) {
				full = true // its prefill waits until the engine has taken what it was sent (admission.PrefillPaced)
				continue
			}
		}
		ex.cands = append(ex.cands, t)
	}
	gated := seats > 0 && ex.guard && ex.class != admission.Critical
	if gated && !reserve.Admits(ex.class, free, seats) {
		// The fleet's free seats are down to those kept for critical requests (admission.SeatReserve.Admits):
		// standard and sheddable ones wait for a seat beyond them. Backends whose batch size is not known are
		// gated by their caps alone. A probe of seats the engine has not proved (admission.Cap.Probe) is not
		// one of the free seats counted: it may be taken past the reserve while a counted seat is free
		// elsewhere, so that a critical request need not wait for this engine, or when there is no elsewhere
		// (a lone engine's probe waited for a seat that never came, and its seats were never found). Probes
		// taken with none free found seats fast, but each seat found was born taken by the standard request
		// that found it while critical requests waited in the gateway queue for completions (n4/s16 at 2x:
		// critical p99 11-13x unloaded, against 3-4x). The cost of the rule: a cold fleet whose critical
		// stream alone fills the provisional seats finds its seats by the creep only (protect-overload, 6-10 s;
		// bench/results/protect-2026-11-29-overload.md).
		n := 0
		for _, t := range ex.cands {
			if c := rec.endpointOf(t.Backend).guards.Cap; c != nil {
				if _, known := c.Free(); known && !((free > 0 || counted == 1) && c.Probe()) {
					full = true
					continue
				}
			}
			ex.cands[n] = t
			n++
		}
		ex.cands = ex.cands[:n]
		probing = true
	} else if gated {
		ex.reserved = true
	}
	t, err := ex.model.Strategy.Pick(&ex.rreq, ex.cands)
	if err != nil && full {
		if lower {
			return t, errNoCapacityForClass
		}
		return t, errNoCapacity
	}
	if err == nil && probing {
		if c := rec.endpointOf(t.Backend).guards.Cap; c != nil {
			if _, known := c.Free(); known && !c.ClaimProbe() {
				return t, errNoCapacity // another request claimed the probe first: wait for capacity
			}
		}
	}
	return t, err
}

// take claims t's permit for attempt a (admission.Permit: breaker, concurrency slot, outlier probe). It returns
// errNoCapacity when one is refused, and excludes t from this request's picks unless only its concurrency cap
// refused (capacity may free). With force (hedges of an admitted request, and retries with admission off), a
// full cap does not refuse: the attempt takes a slot past the limit (admission.Cap.AcquirePast), so that
// the cap still counts what its engine was sent.
func (ex *exchange) take(a *attempt, t routing.Target, force bool) error {
	b := t.Backend
	c := admission.Claim{Class: ex.class, Guard: ex.guard, Force: force}
	if a.retry {
		c.Retries = ex.s.retries
	}
	if !force {
		ex.measure(&c) // admit.go
	}
	e := ex.rec.endpointOf(b)
	switch err := a.permit.Acquire(&e.guards, &ex.rec.fleet, c); err {
	case nil:
	case admission.ErrCapFull:
		return errNoCapacity
	default:
		ex.tried = append(ex.tried, b) // open, half-open with its probes taken, or ejected
		return errNoCapacity
	}
	if ex.reserved && !force {
		// The reserve admitted the pick on the free seats it counted then; requests picked at the same moment
		// counted the same seats, and each cap's claim bounds its own backend, not the fleet's reserve. Counted
		// again with this claim's seat taken (and any other's claimed meanwhile), the fleet must still keep its
		// reserve, or the claim is given back and the request waits in the queue, which dispatches one request
		// at a time. Without it, three standard requests sent at once to a fleet of two seats took both, and a
		// critical request arriving next waited for a standard one to finish (TestReserveHoldsUnderConcurrentPicks).
		if free, seats, _ := ex.rec.fleetSeats(); seats > 0 && !ex.rec.reserve.Admits(ex.class, free+1, seats) {
			a.permit.Cancel()
			return errNoCapacity
		}
	}
	a.target, a.name, a.end = t, b.Name(), e
	// Its prefill counts as queued on b from now (prefill pacing), not only from its dispatch: the next request
	// picked meanwhile, a queue's next waiter above all, must see it.
	a.held = max(ex.rreq.PromptTokens, 0)
	if d := ex.rreq.Decision(); d.Backend == b {
		a.held = max(a.held-d.CachedTokens, 0)
	}
	b.Hold(a.held)
	return nil
}

// pick chooses a backend for a and claims its slots, trying the next best when a claim is refused. With
// respectCaps false (hedges, and gateways without admission control) full concurrency caps neither
// filter the candidates nor refuse the claim.
func (ex *exchange) pick(a *attempt, respectCaps bool) error {
	for range len(ex.model.Targets) + 1 {
		t, err := ex.chooseFrom(respectCaps)
		if err != nil {
			return err
		}
		if err := ex.take(a, t, !respectCaps); err == nil {
			return nil
		}
		if respectCaps && !ex.triedContains(t.Backend) {
			return errNoCapacity // its cap is full: wait for capacity rather than take a worse backend
		}
	}
	return routing.ErrNoBackend
}

func (ex *exchange) triedContains(b *routing.Backend) bool {
	for _, x := range ex.tried {
		if x == b {
			return true
		}
	}
	return false
}

// prepare readies a picked attempt to be sent: the upstream pool, timeouts, the request (headers, URI and the
// body rewritten for the backend), and the routing accounting. copyBody makes the request own its body, for an
// attempt that may outlive the exchange (hedging).
func (ex *exchange) prepare(a *attempt, copyBody bool) error {
	t := a.target
	cfg := t.Backend.Config()
	a.to = ex.s.timeouts(cfg)
	up, err := ex.s.ups.get(cfg, a.to.Connect)
	if err != nil {
		return &upstreamError{kind: kindConnect, backend: cfg.Name, err: err}
	}
	a.up = up
	if ex.upFor != t.Model || len(ex.upBody) == 0 {
		ex.buildUpstreamBody(t.Model)
	}
	if a.req == nil {
		a.req = fasthttp.AcquireRequest()
	}
	req := a.req
	req.Reset()
	ex.fwd.CopyTo(&req.Header)
	req.Header.SetMethod(ex.rt.method)
	ex.scratch = up.prepareRequest(req, cfg, ex.path, t.Model, ex.scratch) // upstream.go: Host, URI, headers, credentials
	if len(ex.query) > 0 {
		// The client's query parameters go after the backend's own (api-version and the like), which servers
		// that read the first value of a repeated parameter keep.
		ex.scratch = append(ex.scratch[:0], req.URI().QueryString()...)
		if len(ex.scratch) > 0 {
			ex.scratch = append(ex.scratch, '&')
		}
		req.URI().SetQueryStringBytes(append(ex.scratch, ex.query...))
	}
	if len(ex.ctype) > 0 && ex.rt.multipart {
		req.Header.SetContentTypeBytes(ex.ctype)
	} else {
		req.Header.SetContentType("application/json")
	}
	req.Header.SetBytesV(headerRequestID, ex.reqID)
	if ip, ok := netip.AddrFromSlice(ex.clientIP); ok {
		ex.scratch = ip.Unmap().AppendTo(ex.scratch[:0]) // net.IP.String allocates; the header copies the bytes
		req.Header.SetBytesV("X-Forwarded-For", ex.scratch)
	}
	body := ex.withPriority(cfg.Spec())
	if copyBody {
		req.SetBody(body)
	} else {
		req.SetBodyRaw(body)
	}
	ex.attempts++
	ex.tried = append(ex.tried, t.Backend)
	a.unhold() // Dispatch counts the prefill from here
	a.acct = t.Backend.Dispatch(&ex.rreq)
	a.began = true
	a.streamed, a.intact, a.endpoint = ex.sse(), ex.rt.intact(), ex.endpoint
	a.started = ex.s.clock.Now()
	// The concurrency cap judges first tokens against the p90 prediction: against the mean, half of all first
	// tokens look slow and the noise alone would keep the cap down.
	a.predP90 = a.acct.PredictedTTFT()
	if mean, p90 := t.Backend.PredictTTFT(ex.sum.PromptTokens, 0); mean > 0 && p90 > mean {
		a.predP90 = time.Duration(float64(a.predP90) * float64(p90) / float64(mean))
	}
	ex.note.dispatched(ex, a) // decisions.go: the status page's table of recent decisions
	if ex.attempts == 1 {
		ex.s.m.Overhead.Observe(a.started.Sub(ex.arrival).Seconds()) // arrival to dispatch
	}
	ex.wd.track(a)
	ex.traceAttempt(a) // trace.go: the attempt's span, and its traceparent upstream
	return nil
}

// buildUpstreamBody rewrites the client's body for a backend that knows the model as upstreamModel: the model
// name when it differs, and, for measured routes (chat and completions), stream:true with include_usage so
// that the gateway always streams from upstream and always learns the usage. Pass-through bodies change only
// in their model.
func (ex *exchange) buildUpstreamBody(upstreamModel string) {
	ex.upBody = ex.reqBuf(ex.upBody)
	var model []byte
	if upstreamModel != "" && upstreamModel != string(ex.sum.Model) {
		model = []byte(upstreamModel)
	}
	streamUsage := ex.forceStream()
	streaming := ex.sum.Stream && (ex.sum.IncludeUsage || ex.endpoint == openai.Responses) // has what it needs
	switch {
	case model == nil && (!streamUsage || streaming):
		ex.upBody = append(ex.upBody[:0], ex.body...)
	case ex.rt.api != 0:
		ex.upBody = openai.AppendUpstreamBody(ex.upBody[:0], ex.body, &ex.sum, model, streamUsage)
	case ex.rt.multipart:
		b, err := appendFormRenamed(ex.upBody[:0], ex.body, ex.ctype, upstreamModel)
		if err != nil { // parseForm read this body: it cannot fail here; keep the client's body if it does
			b = append(ex.upBody[:0], ex.body...)
		}
		ex.upBody = b
	default:
		ex.upBody = openai.AppendReplaced(ex.upBody[:0], ex.body, ex.gen.ModelSpan, upstreamModel)
	}
	ex.upFor = upstreamModel
}

// withPriority returns the upstream body for an engine that schedules by priority (routing.EngineSpec.Priority):
// upBody with the "priority" field set from the request's class, so that a critical request waiting in the
// engine's queue runs first. For other engines, and endpoints other than chat and completions, upBody itself.
func (ex *exchange) withPriority(spec *routing.EngineSpec) []byte {
	p, ok := spec.PriorityValue(ex.class.Index())
	if !ok || ex.endpoint != openai.Chat && ex.endpoint != openai.Completions {
		return ex.upBody
	}
	ex.priBuf = openai.AppendPriority(ex.reqBuf(ex.priBuf), ex.upBody, p)
	return ex.priBuf
}

// forceStream reports whether the gateway asks the engine for a stream whatever the client asked, so that it
// sees every token (TTFT, each gap, the usage) and assembles the answer for a client that did not stream:
// chat, completions, and Responses requests that are not background ones (which answer at once).
func (ex *exchange) forceStream() bool {
	switch ex.endpoint {
	case openai.Chat, openai.Completions:
		return true
	case openai.Responses:
		return !ex.sum.Background
	}
	return false
}

// sse reports whether the answer comes as an SSE stream the gateway reads event by event: when it asks for
// one (forceStream), and when the client asked for one (Messages, pass-through routes).
func (ex *exchange) sse() bool {
	return ex.forceStream() || (ex.sum.Stream && ex.endpoint != openai.Embeddings && !ex.rt.byID)
}

// attemptOnce runs an attempt's network part on the calling goroutine: send, then read until the first content
// (or the whole answer when it does not stream). It reads only the attempt (prepare copied what it needs of the
// exchange), so that a hedged attempt can run on after its exchange moved on (abandon).
func (a *attempt) attemptOnce() error {
	a.s.testPanic(stageAttempt)
	if h := a.s.attemptHook; h != nil {
		return h(a)
	}
	if err := a.send(a.streamed, a.intact); err != nil {
		return err
	}
	if !a.streamed {
		return a.readWhole()
	}
	return a.readFirst(a.endpoint)
}

// run tries backends until one answers (its first content is in hand, see attempt.readFirst): failures before
// that point are retried on another backend, up to the model's retries and within the retry budget; with
// hedging, a second backend races the first when it is slow to start. The attempt that answers is ex.cur.
func (ex *exchange) run() error {
	if ex.model.Hedge.After > 0 && ex.sse() {
		return ex.runHedged()
	}
	return ex.runFrom(nil)
}

// runFrom is run's sequential loop, entered after last failed (nil for a fresh request).
func (ex *exchange) runFrom(last error) error {
	a := ex.cur
	ex.cur = nil
	for {
		if a == nil {
			var err error
			if a, err = ex.next(last); err != nil {
				return err
			}
		}
		err := ex.prepare(a, false)
		if err == nil {
			err = a.safeAttemptOnce()
		}
		if err == nil {
			ex.won(a)
			return nil
		}
		ex.endAttempt(a, err)
		a = nil
		if why := ex.cancelled(); why != nil {
			return why
		}
		last = err
	}
}

// next decides whether a failed attempt (last; nil for the first) may be retried and picks the backend for the
// next one. It returns last itself when no retry is allowed.
func (ex *exchange) next(last error) (*attempt, error) {
	retry := last != nil
	if retry {
		var ue *upstreamError
		if !errors.As(last, &ue) {
			return nil, last
		}
		ex.s.m.UpstreamErrors.WithLabelValues(ue.backend, ue.kind.String()).Inc()
		// A broken stream is retryable only for a client that does not stream: it has received nothing yet.
		wholeAnswer := ue.kind == kindStream && !ex.sum.Stream
		if !(ue.retryable() || wholeAnswer) || ex.attempts > ex.model.Retries {
			return nil, last
		}
		// The retry budget bounds how much retries can multiply the load of backends that are struggling: a
		// timeout or an error status from a live backend. A backend that refused the connection, dropped it or
		// answered garbage is gone rather than busy (as is one whose breaker has opened): moving its requests
		// elsewhere adds nothing to it, and must not fail requests in a burst (a region goes down with many
		// requests in flight).
		budgeted := ue.kind == kindFirstByte || ue.kind == kindStatus
		if n := len(ex.tried); n > 0 && !ex.tried[n-1].Healthy() {
			budgeted = false
		}
		// A request moving off a backend that died keeps moving outside the budget: when a whole region dies,
		// its retry may meet the region's other backend before that one's breaker opens, and its 503 is not
		// a busy backend's (one request in 24 of a region's failed that way, refused by the budget along with
		// every other request of the region retrying at once). Retries stays the per-request bound.
		if !budgeted {
			ex.fleeing = true
		} else if ex.fleeing {
			budgeted = false
		}
		if budgeted && !ex.s.retries.Allow() {
			return nil, last
		}
		retry = budgeted
		ex.s.m.Retries.WithLabelValues(ex.model.Name, ue.kind.String()).Inc()
	}
	a := newAttempt(ex.s, ex.wd)
	a.retry = retry
	var err error
	if last != nil && ex.snap.Shedder != nil {
		err = ex.requeue(a)
	} else {
		err = ex.pick(a, !retry && ex.attempts == 0 && ex.snap.Shedder != nil)
	}
	if err != nil {
		if retry {
			ex.s.retries.Done()
		}
		if ex.queued == a {
			ex.queued = nil
		}
		a.free()
		if why := ex.cancelled(); why != nil {
			return nil, why
		}
		if last != nil && (errors.Is(err, routing.ErrNoBackend) || errors.Is(err, errNoCapacity)) {
			return nil, last // every backend was tried: the last failure says more
		}
		if errors.Is(err, errNoCapacity) {
			return nil, routing.ErrNoBackend
		}
		return nil, err
	}
	return a, nil
}

// requeue claims a backend for a retry under the rules a new request of its class meets: a seat its class may take
// now (for standard and sheddable requests, past the seats kept free for critical ones), else a place in the
// model's queue, ahead of later arrivals of its class (earliest deadline first), until a seat frees on any
// backend. The deadline is the request's own, from its arrival (admission.Shedder.Deadline), and a standard or
// sheddable retry that could no longer meet its objective is refused there (ErrQueueTimeout, 503), as a queued
// request is.
//
// Why not past a full cap, as retries went before: a retry moving off a backend that died in a spike went
// into the full engine routing liked best, where it waited for a completion inside the engine, and took the seats
// kept for critical requests; with the engine's seats all taken, the next critical requests waited there too. In
// the protect matrix's one-down cell the forced retries held 17-19 requests on 16-seat engines and critical p99
// first tokens were 6-8x unloaded (bench/results/protect-2026-12-02-matrix.md).
func (ex *exchange) requeue(a *attempt) error {
	err := ex.pick(a, true)
	if !errors.Is(err, errNoCapacity) {
		return err
	}
	snap := ex.snap
	in := admission.ShedInput{Class: ex.class, SLO: ex.model.SLO.TTFT, TTFT: ex.rreq.Decision().TTFT,
		Calibration: ex.rec.fleet.Calibration}
	ex.queued = a
	ctx, cancel := ex.wd.queueContext()
	enqueued := ex.s.clock.Now()
	err = ex.waitForSeat(ctx, snap.Shedder.Deadline(ex.arrival, &in, snap.Queue.Timeout))
	ex.queueWait += max(ex.s.clock.Now().Sub(enqueued), time.Nanosecond)
	cancel()
	if err != nil {
		return err
	}
	ex.queued = nil
	return nil
}

// retryWhole restarts a non-streaming request whose answer broke off after its first token: the client has
// received nothing, so another backend may still give it the whole answer (within the model's retries and the
// retry budget). It returns failed itself when no retry is allowed.
func (ex *exchange) retryWhole(failed error) error {
	var ue *upstreamError
	if ex.sum.Stream || !errors.As(failed, &ue) || ex.cancelled() != nil {
		return failed
	}
	a := ex.cur
	ex.cur = nil
	ex.endAttempt(a, failed)
	ex.hasUsage, ex.upstreamError = false, false
	ex.usage = openai.Usage{}
	ex.tpot = nil // the first attempt's TTFT stands; the retry's gaps are not the client's
	ex.itl = nil
	return ex.runFrom(failed)
}

// runHedged is run with hedging (The Tail at Scale): attempts run on goroutines of their own and report to
// ex.results; when the first has produced no token after the model's hedge delay, a copy goes to the next best
// backend (within the hedge budget); the first token wins and the other attempt is aborted (its connection
// closes, so its engine stops). A failure before any token is retried as without hedging.
func (ex *exchange) runHedged() error {
	budget := ex.rec.hedges
	budget.Request()
	live, hedged := 0, false
	var racers [2]*attempt
	launch := func(a *attempt) error {
		if err := ex.prepare(a, true); err != nil {
			return err
		}
		for i := range racers {
			if racers[i] == nil {
				racers[i] = a
				break
			}
		}
		live++
		go ex.race(a)
		return nil
	}
	a := ex.cur
	ex.cur = nil
	var last error
	if a == nil {
		var err error
		if a, err = ex.next(nil); err != nil {
			return err
		}
	}
	if err := launch(a); err != nil {
		ex.endAttempt(a, err)
		return err
	}
	timer := ex.s.clock.NewTimer(ex.model.Hedge.After)
	defer timer.Stop()
	for {
		select {
		case a := <-ex.results:
			live--
			for i := range racers {
				if racers[i] == a {
					racers[i] = nil
				}
			}
			if a.err == nil {
				for _, o := range racers {
					if o != nil {
						ex.abandon(o, true)
					}
				}
				if hedged {
					outcome := "primary_won"
					if a.hedge {
						outcome = "hedge_won"
					}
					ex.s.m.Hedges.WithLabelValues(outcome).Inc()
				}
				ex.won(a)
				return nil
			}
			ex.endAttempt(a, a.err)
			if why := ex.cancelled(); why != nil {
				for _, o := range racers {
					if o != nil {
						ex.abandon(o, false)
					}
				}
				return why
			}
			last = a.err
			if live > 0 {
				continue // the other attempt may still answer
			}
			next, err := ex.next(last)
			if err != nil {
				return err
			}
			if err := launch(next); err != nil {
				ex.endAttempt(next, err)
				return err
			}
		case <-timer.C():
			if live != 1 || hedged || ex.cancelled() != nil || ex.sum.PromptTokens > hedgeMaxPromptTokens {
				continue
			}
			if !budget.Allow() {
				continue
			}
			h := newAttempt(ex.s, ex.wd)
			h.hedge = true
			if err := ex.pick(h, false); err != nil {
				h.free()
				continue
			}
			if err := launch(h); err != nil {
				ex.endAttempt(h, err)
				continue
			}
			hedged = true
			ex.s.m.Hedges.WithLabelValues("sent").Inc()
		}
	}
}

// race runs a hedged attempt's network part on its own goroutine and reports it, unless the exchange gave it up
// meanwhile: then the attempt ends itself (abandon) and frees itself. After a give-up it touches only the attempt.
func (ex *exchange) race(a *attempt) {
	a.err = a.safeAttemptOnce()
	if a.state.CompareAndSwap(raceRunning, raceReported) {
		ex.results <- a
		return
	}
	if a.state.Load() == raceOrphaned {
		a.endLost()
		a.s.orphans.remove(a)
	}
	a.closeStream(false)
	a.free()
}

// abandon gives up a racing attempt, because the other attempt won (learn) or the exchange is being aborted.
//
// Losing the race is not the backend's failure, but the loser's first token is the evidence of its speed that
// routing, the concurrency cap and the outlier detector learn from: cancelled at the moment the winner's first
// token came, a backend that stalls its first tokens would only ever teach them "at least the hedge delay", and
// keep its traffic with hedging on while it loses it with hedging off. So with learn the loser reads on, on its
// own goroutine, to its first token or its failure, bounded as any attempt by its first-byte timeout (and ended
// at shutdown: orphans), and then reports what really happened (endLost); its answer goes nowhere and its
// connection is closed at that point, which aborts the generation. Hedges are rare (the hedge budget), so the
// engine work this keeps is small. Without learn (the exchange is aborted: client gone, shutdown) it is killed
// now, and its wait teaches the lower bound alone.
func (ex *exchange) abandon(a *attempt, learn bool) {
	if learn && ex.s.orphans.add(a) {
		ex.wd.untrack(a) // the exchange's aborts no longer reach it; its own deadline and shutdown do
		ex.traceAttemptEnd(a, errHedgeLost)
		a.acct.KeepHashes() // its first token or end comes after the request gave its hashes back
		if a.state.CompareAndSwap(raceRunning, raceOrphaned) {
			return // its goroutine ends and frees it
		}
		ex.s.orphans.remove(a)
		<-ex.results // it reported meanwhile: it is this one, and its answer has begun or failed
		a.endLost()
		a.closeStream(false)
		a.free()
		return
	}
	ex.wd.kill(a, errHedgeLost)
	lost := admission.Outcome{Err: errHedgeLost, Lost: true, Waited: ex.s.clock.Now().Sub(a.started), Predicted: a.acct.PredictedTTFT()}
	if a.began {
		a.acct.Abandon()
		a.began = false
	}
	ex.settle(a, lost)
	if a.state.CompareAndSwap(raceRunning, raceAbandoned) {
		return // its goroutine closes and frees it
	}
	<-ex.results // it reported meanwhile: it is this one
	a.closeStream(false)
	a.free()
}

// endLost ends the accounting of an attempt that lost a hedged race (abandon with learn), once its own answer
// began or failed: routing learns its real TTFT, its permit's First and End judge it as any attempt's, and a
// failure counts as the backend's as it would without hedging. It touches only the attempt, so it runs on the
// attempt's goroutine after its exchange moved on.
func (a *attempt) endLost() {
	o := admission.Outcome{Err: a.err, Reached: a.err == nil && a.gotFirst}
	if o.Reached {
		a.first()
	} else if a.err == nil {
		o.Err = errHedgeLost // an answer without content: nothing to learn, nothing to blame
	}
	a.endAccounting(&o)
}

// first records that a's answer began with routing (its TTFT, when it has content) and with its permit (the
// concurrency cap's and the outlier detector's observations, the breaker's success, the queue's signal).
func (a *attempt) first() {
	f := admission.First{Content: a.gotFirst}
	if a.gotFirst {
		a.acct.FirstToken()
		f.TTFT = a.s.clock.Now().Sub(a.started)
		f.Predicted, f.P90, f.Hit = a.acct.PredictedTTFT(), a.predP90, a.acct.PredictedHit()
		if es := a.target.Backend.Engine(); es != nil && !es.Stale {
			f.Waiting, f.Running = int(es.Waiting), int(es.Running)
		}
	}
	a.permit.First(&f)
}

// engineDone ends a's routing accounting when its engine sent the end of the answer, before the client reads that
// end: the engine's seat is free, and a client that sends its next request the moment an answer ends (the next
// turn of a conversation) must find it free, not counted until the exchange is settled.
// docs/design.md, "How a stream ends". The permit and the metrics are settled with the exchange, as before;
// routing.Attempt.End runs once.
func (a *attempt) engineDone() {
	if a.began {
		a.acct.End(false)
	}
}

// endAccounting ends a's routing accounting and its permit with o, filling o.Fault (the failure was the
// backend's). It reports whether the routing accounting was still open.
func (a *attempt) endAccounting(o *admission.Outcome) bool {
	ue := asUpstream(o.Err)
	o.Fault = ue != nil && ue.backendFault()
	began := a.began
	if began {
		a.acct.End(o.Fault)
		a.began = false
	}
	a.permit.End(o)
	return began
}

// won records that a reached its first content: the routing model's TTFT, and the first token for its permit
// (the concurrency cap's and the outlier detector's observations, the breaker's success, the queue's signal).
func (ex *exchange) won(a *attempt) {
	ex.cur = a
	a.first()
	ex.rememberID(a) // responses.go
	ex.traceWon(a)   // trace.go
}

// endAttempt ends an attempt the exchange owns: releases its stream, its slots and its accounting.
func (ex *exchange) endAttempt(a *attempt, outcome error) {
	ex.settle(a, admission.Outcome{Err: outcome, Reached: a.gotFirst})
	a.closeStream(outcome == nil)
	a.free()
}

// settle ends an attempt's accounting with o (o.Err nil: success; settle fills o.Fault): routing, metrics, and
// the attempt's permit (breaker, concurrency cap, outlier detector, retry budget, seat reserve, queue). It runs
// on the handler goroutine and touches only what the handler owns (an abandoned attempt's goroutine may still be
// reading).
func (ex *exchange) settle(a *attempt, o admission.Outcome) {
	ex.wd.untrack(a)
	ex.traceAttemptEnd(a, o.Err)
	if a.endAccounting(&o) {
		d := ex.s.clock.Now().Sub(a.started).Seconds()
		if et := attemptErrorType(o.Err); et != "" || a.end == nil {
			asked, served := ex.models()
			ex.s.m.ClientDuration.WithLabelValues(ex.operation(), providerOf(a.target.Backend), asked, served, et).Observe(d)
		} else {
			ex.childrenOf(a).clientDuration.Observe(d)
		}
	}
}

// shedError is a shedding refusal with the Retry-After its decision computed.
type shedError struct {
	err        error
	retryAfter time.Duration
}

func (e shedError) Error() string { return e.err.Error() }
func (e shedError) Unwrap() error { return e.err }

// parse reads what the gateway needs of the client's body: the summary for the APIs it understands, the model
// and stream flag for the routes it passes through.
func (ex *exchange) parse() error {
	rt := ex.rt
	ex.sum.Prompt = ex.reqBuf(ex.sum.Prompt)
	if rt.api != 0 {
		return ex.sum.Parse(rt.api, ex.body)
	}
	none := openai.Span{Start: -1, End: -1}
	sum := openai.Summary{N: 1, Prompts: 1, Prompt: ex.sum.Prompt[:0], ModelSpan: none, StreamSpan: none,
		StreamOptionsSpan: none, IncludeUsageSpan: none}
	if rt.byID { // no body to read: the stored response says the model (responses.go, in route)
		ex.sum = sum
		return nil
	}
	switch {
	case rt.multipart:
		// A form's parts are files (audio), whose size says nothing of tokens: PromptTokens stays 0.
		model, stream, err := parseForm(ex.body, ex.ctype)
		if err != nil {
			return err
		}
		sum.Model, sum.Stream = model, stream
	case isMultipart(ex.ctype):
		return &openai.RequestError{Message: "this endpoint takes a JSON body"}
	default:
		if err := ex.gen.ParseGeneric(ex.body); err != nil {
			return err
		}
		// A JSON body's length stands for its tokens (openai.EstimateTokens), for rate limits and routing.
		sum.Model, sum.Stream, sum.ModelSpan = ex.gen.Model, ex.gen.Stream, ex.gen.ModelSpan
		sum.PromptTokens = openai.EstimateTokens(len(ex.body))
	}
	if len(sum.Model) == 0 {
		return &openai.RequestError{Param: "model", Message: "you must provide a model parameter: the gateway routes by it"}
	}
	ex.sum = sum
	return nil
}
