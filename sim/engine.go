package sim

import (
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// timeSource is the engine's injectable clock. The real loop reads it after every wake-up and sleeps on real timers in
// between; the engine's unit tests instead set a virtual clock and call engine.advance at each event, so the model
// is tested exactly and without sleeping.
type timeSource interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// maxLag bounds how far behind its own schedule the real loop may fall. The loop runs steps on their nominal
// times: a late wake-up (a busy machine) does not stretch the next step, the tokens due meanwhile go out together,
// and mean ITL stays what the model promises. Only a pause longer than this (a suspended process) makes the
// engine resync to the wall clock instead of replaying it as a burst.
const maxLag = 2 * time.Second

// jitterStream, with the backend's name, is the second word of the jitter generator's seed, so that it draws
// apart from the fault draws and from other backends of the same Seed.
const jitterStream = 0x6a6974746572 // "jitter"

// errDown is returned by submit while the engine is down (a control fault) or closed.
var errDown = errors.New("sim: engine is down")

// errOverloaded is returned by submit when Config.MaxConcurrentRequests requests are already held (TGI's 429).
var errOverloaded = errors.New("sim: engine is overloaded")

// Sequence states.
const (
	statePending = iota // submitted, in the API server's overhead (or a stall) before the queue
	stateWaiting        // in the engine's waiting queue (new, or preempted for recompute)
	stateRunning        // holds KV blocks, scheduled every step
	stateDone           // finished, aborted or killed
)

// How a sequence ended, published in seq.end for its HTTP handler.
const (
	endNone   = iota
	endLength // reached max_tokens (a stop sequence too); a pooling sequence: its prefill is done
	endAbort  // the client left (set by the handler's own abort)
	endKilled // the engine went down, restarted or closed: the handler drops the connection
)

// seq is one request inside the engine.
//
// Ownership: the fields above the delivery block are written before submit or under engine.mu only. The HTTP
// handler reads emitted and end (atomics) without the lock, and after end != endNone it may read cached.
// notify (capacity 1) gets a non-blocking send each step that changes emitted or end, so one engine step wakes
// each of its sequences at most once and a slow handler sees several tokens per wake-up.
type seq struct {
	prompt    int      // prompt tokens
	maxTokens int      // completion tokens to generate
	hashes    []uint64 // chained hashes of the prompt's full blocks

	arrival, ready time.Time
	// priority is the request's "priority" (lower runs first under the priority policy; set before submit),
	// order its arrival rank in the engine, which breaks ties as vLLM's arrival_time does.
	priority   int
	order      uint64
	state      int
	computed   int     // tokens whose KV is computed (prompt, then fed-back output)
	output     int     // tokens generated
	blocks     []int32 // KV blocks held, in token order
	registered int     // leading prompt blocks whose hash has been registered in the cache
	decoding   bool    // prefill (or recompute) done: each step feeds back the last token
	stepTokens int     // tokens scheduled for this sequence in the current step
	cached     int     // prefix-cache hit in tokens at first scheduling; -1 before
	lastAt     time.Time
	nextAt     time.Time // under BatchSeats: when the sequence's prefill ends or its next token is due

	stalled bool // drawn into the StallRate share of stalled requests (set before submit)
	// pooling marks a prefill-only request (embeddings, rerank, score): it ends when its prompt is computed,
	// generates no token and counts as finished_reason="stop", without a TTFT (set before submit).
	pooling bool
	// stop marks a sequence whose last token ends its turn (an EOS, as /v1/messages' end_turn) rather than
	// reaching a length limit: it counts as finished_reason="stop" (set before submit).
	stop bool

	emitted atomic.Int32
	end     atomic.Int32
	notify  chan struct{}
}

func newSeq(promptTokens, maxTokens int, hashes []uint64) *seq {
	return &seq{prompt: promptTokens, maxTokens: maxTokens, hashes: hashes, cached: -1,
		notify: make(chan struct{}, 1)}
}

func (s *seq) wakeup() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// cachedTokens is the prefix-cache hit reported in usage.prompt_tokens_details.cached_tokens. Read it only after
// end != endNone (or under the engine lock).
func (s *seq) cachedTokens() int { return max(s.cached, 0) }

// engine is one simulated vLLM engine: a waiting queue, a running batch and a KV cache, advanced one
// continuous-batching step at a time.
//
// A step schedules, oldest first, one token for each decoding sequence and prefill chunks for the others
// (preempting the newest running sequence when a block is needed and none is free), then admits waiting
// sequences while max_num_seqs, the token budget and free blocks allow. It lasts
// (prefill tokens)/PrefillTPS + (if any sequence decodes) ITL + ITLPerSeq*(decoders-1), times the slowdown
// fault; at its end every sequence whose prompt is fully computed gets one token. That is the zero physics;
// the physics knobs change the step (prefill-only steps, jitter, the attention cost) or replace it (seats.go),
// and the pool its block size and eviction rule (see the package doc, "Physics").
//
// Concurrency: every method takes mu, except run, which owns the loop goroutine (started by Start, stopped by
// close) and takes mu for each pass. HTTP handlers call submit and abort from their own goroutines.
type engine struct {
	mu     sync.Mutex
	cfg    Config
	clock  timeSource
	faults Faults
	m      *metrics
	start  time.Time // the engine's (simulated process's) start time, reset by restart
	pool   *blockPool

	pending []*seq // sorted by ready
	waiting []*seq // FIFO, preempted sequences at the front; by (priority, order) under the priority policy
	running []*seq // in admission order: the newest is preempted first
	batch   []*seq // sequences scheduled in the current step
	arrived uint64 // sequences submitted, for seq.order

	inStep  bool
	stepEnd time.Time
	lastEnd time.Time
	resyncs int // times the real loop fell more than maxLag behind

	// gen is the tokens each step generated in the last throughputWindow, oldest first from genHead, for
	// SGLang's last_gen_throughput (see noteGenerated). At most one entry per step: a window holds as many as
	// steps end in a second.
	gen     []genEntry
	genHead int

	jit     *rand.PCG  // the jitter's source, seeded by Config.Seed (copied by fork)
	jrng    *rand.Rand // draws from jit
	scratch *metrics   // the registry of predict's forks (see fork), nobody's /metrics; made by the first fork

	passes atomic.Uint64 // loop passes, so tests can see that an idle engine does not tick

	closed   bool // close was called: submit refuses
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func newEngine(cfg Config, clock timeSource) *engine {
	now := clock.Now()
	e := &engine{
		cfg:    cfg,
		clock:  clock,
		faults: Faults{Slowdown: 1, FailRate: cfg.FailRate},
		m:      newMetrics(cfg, now),
		start:  now,
		pool:   newBlockPool(cfg.KVBlocks, cfg.Eviction),
		jit:    rand.NewPCG(cfg.Seed, jitterStream^xxhash.Sum64String(cfg.Name)),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	e.jrng = rand.New(e.jit)
	return e
}

// run is the engine loop: it advances the model to the clock, then sleeps until the next step ends or a pending
// request becomes ready, or blocks (no timer at all) while the engine is idle. submit and control changes wake
// it. It returns when close is called.
func (e *engine) run() {
	defer close(e.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		e.passes.Add(1)
		e.mu.Lock()
		now := e.clock.Now()
		e.advance(now)
		next, busy := e.nextEvent(now)
		e.mu.Unlock()
		if !busy {
			select {
			case <-e.wake:
				continue
			case <-e.stop:
				return
			}
		}
		timer.Reset(next.Sub(now))
		select {
		case <-timer.C:
		case <-e.wake:
			timer.Stop()
		case <-e.stop:
			timer.Stop()
			return
		}
	}
}

func (e *engine) kick() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// close stops the loop (if run was started) and kills every sequence; it waits for the loop to return.
func (e *engine) close(started bool) {
	e.stopOnce.Do(func() {
		close(e.stop)
		if started {
			<-e.done
		}
		e.mu.Lock()
		e.closed = true
		e.killAll()
		e.mu.Unlock()
	})
}

// nextEvent returns when the engine next has something to do after advance(now): the end of the current step or
// the time a pending request joins the queue. busy is false when the engine is idle.
func (e *engine) nextEvent(now time.Time) (next time.Time, busy bool) {
	if e.cfg.Batching == BatchSeats {
		return e.nextSeatEvent()
	}
	switch {
	case e.inStep:
		return e.stepEnd, true
	case len(e.running) > 0 || len(e.waiting) > 0:
		// Unreachable after advance (a running sequence always fits a step), but never spin if it happens.
		return now.Add(e.cfg.ITL), true
	case len(e.pending) > 0:
		return e.pending[0].ready, true
	}
	return time.Time{}, false
}

// advance runs every step that ends at or before now and starts the step that follows.
func (e *engine) advance(now time.Time) {
	if e.cfg.Batching == BatchSeats {
		e.advanceSeats(now)
		return
	}
	for {
		if e.inStep {
			if e.stepEnd.After(now) {
				return
			}
			e.m.loopLag.Observe(now.Sub(e.stepEnd).Seconds())
			e.endStep()
			continue
		}
		var at time.Time
		switch {
		case len(e.running) > 0 || len(e.waiting) > 0:
			at = e.lastEnd
		case len(e.pending) > 0 && !e.pending[0].ready.After(now):
			at = e.pending[0].ready
			if at.Before(e.lastEnd) {
				at = e.lastEnd
			}
		default:
			return
		}
		if now.Sub(at) > maxLag {
			at = now
			e.resyncs++
		}
		e.startStep(at)
		if !e.inStep {
			e.lastEnd = at
			return
		}
	}
}

// submit puts s in the engine at the clock's now: it joins the waiting queue after the overhead (plus the stall
// fault). It fails with errDown while the engine is down or after close, and with errOverloaded (counted in
// tgi_request_failure{err="overloaded"}) when Config.MaxConcurrentRequests sequences are already held: the
// check and the insertion share the lock, so concurrent requests never get past the limit together.
func (e *engine) submit(s *seq) error {
	e.mu.Lock()
	now := e.clock.Now()
	e.advance(now)
	if e.faults.Down || e.closed {
		e.mu.Unlock()
		return errDown
	}
	if limit := e.cfg.MaxConcurrentRequests; limit > 0 && len(e.pending)+len(e.waiting)+len(e.running) >= limit {
		e.m.overloaded.Inc()
		e.mu.Unlock()
		return errOverloaded
	}
	s.arrival = now
	e.arrived++
	s.order = e.arrived
	stall := e.faults.Stall
	if e.faults.StallRate > 0 && !s.stalled {
		stall = 0
	}
	s.ready = now.Add(e.cfg.Overhead + stall)
	s.state = statePending
	i, _ := slices.BinarySearchFunc(e.pending, s.ready, func(p *seq, t time.Time) int {
		if p.ready.After(t) {
			return 1
		}
		return -1 // equal ready times keep arrival order
	})
	e.pending = slices.Insert(e.pending, i, s)
	e.advance(now)
	e.publish()
	e.mu.Unlock()
	e.kick()
	return nil
}

// abort takes s out of the engine wherever it is (pending, waiting, running) and frees its blocks, counting it
// as finished_reason="abort". It does nothing if s already ended.
func (e *engine) abort(s *seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.state == stateDone {
		return
	}
	e.remove(s)
	e.m.success[reasonAbort].Inc()
	e.m.e2e.Observe(e.clock.Now().Sub(s.arrival).Seconds())
	s.end.Store(endAbort)
	s.wakeup() // for a follower other than the aborting handler (a background response's goroutine)
	e.publish()
}

// remove unlinks s from its queue and releases its blocks.
func (e *engine) remove(s *seq) {
	switch s.state {
	case statePending:
		e.pending = deleteSeq(e.pending, s)
	case stateWaiting:
		e.waiting = deleteSeq(e.waiting, s)
	case stateRunning:
		e.running = deleteSeq(e.running, s)
	}
	e.pool.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.state = stateDone
}

func deleteSeq(list []*seq, s *seq) []*seq {
	if i := slices.Index(list, s); i >= 0 {
		return slices.Delete(list, i, i+1)
	}
	return list
}

// killAll ends every sequence as a crash would: their handlers drop the connection without [DONE].
func (e *engine) killAll() {
	for _, list := range [][]*seq{e.pending, e.waiting, e.running} {
		for _, s := range list {
			e.pool.release(s.blocks)
			s.blocks = s.blocks[:0]
			s.state = stateDone
			e.m.success[reasonAbort].Inc()
			s.end.Store(endKilled)
			s.wakeup()
		}
	}
	e.pending, e.waiting, e.running = e.pending[:0], e.waiting[:0], e.running[:0]
	e.batch = e.batch[:0]
	e.inStep = false
	e.lastEnd = e.clock.Now()
	e.publish()
}

// setFaults replaces the fault state. Going down kills every sequence.
func (e *engine) setFaults(f Faults) {
	e.mu.Lock()
	e.advance(e.clock.Now())
	wasDown := e.faults.Down
	e.faults = f
	if f.Down && !wasDown {
		e.killAll()
	}
	e.mu.Unlock()
	e.kick()
}

func (e *engine) getFaults() Faults {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.faults
}

// restart is an engine restart: every sequence is killed, the KV cache is wiped, the metrics start from zero and
// the start time (process_start_time_seconds) is now.
func (e *engine) restart() {
	e.mu.Lock()
	e.killAll()
	e.pool.reset()
	e.start = e.clock.Now()
	e.gen, e.genHead = e.gen[:0], 0
	e.m = newMetrics(e.cfg, e.start)
	e.publish()
	e.mu.Unlock()
	e.kick()
}

// evictCache forgets the prefix of every block no sequence holds (see Backend.EvictCache).
func (e *engine) evictCache() {
	e.mu.Lock()
	e.pool.forgetUnheld()
	e.mu.Unlock()
}

// metrics returns the current registry's owner (restart replaces it).
func (e *engine) metrics() *metrics {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m
}

// throughput is genThroughput now, SGLang's last_gen_throughput.
func (e *engine) throughput() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.genThroughput(e.clock.Now())
}

func (e *engine) startTime() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.start
}

// publish sets the gauges from the queues.
func (e *engine) publish() {
	e.m.running.Set(float64(len(e.running)))
	// As in vLLM, waiting counts the scheduler's queue only: a request still in its overhead (the API server's
	// tokenizing, in a real deployment) or in an injected stall (a TTFT tail that no queue explains) is not
	// waiting for the engine. Counting them made a stalled request look queued to the gateway, whose outlier
	// detector does not judge queued first tokens, so a stalling backend was never ejected.
	e.m.waiting.Set(float64(len(e.waiting)))
	e.m.pending.Set(float64(len(e.pending)))
	e.m.setUsage(e.pool.usage())
}

// blocksFor is the number of blocks that hold n tokens.
func (e *engine) blocksFor(n int) int { return (n + e.cfg.blockSize() - 1) / e.cfg.blockSize() }

// startStep schedules a step beginning at at (see engine's doc). It leaves inStep false if nothing could run.
// Under PrefillUnmixed and PrefillOff a step that can prefill prefills only (decoders wait); when nothing can
// be prefilled it decodes.
func (e *engine) startStep(at time.Time) {
	for len(e.pending) > 0 && !e.pending[0].ready.After(at) {
		s := e.pending[0]
		e.pending = e.pending[1:]
		s.state = stateWaiting
		e.enqueue(s, false)
	}
	mode := e.cfg.ChunkedPrefill
	mixed := mode == "" || mode == PrefillMixed
	prefill, decoders, attention := e.schedule(!mixed, true)
	if !mixed && len(e.batch) == 0 {
		prefill, decoders, attention = e.schedule(false, false) // nothing to prefill: a decode step
	}
	e.publish()
	if len(e.batch) == 0 {
		e.inStep = false
		return
	}
	d := float64(prefill) / e.cfg.PrefillTPS * float64(time.Second)
	if attention > 0 {
		d += attention / e.cfg.PrefillTPS * float64(time.Second)
	}
	if decoders > 0 {
		d += float64(e.cfg.ITL) + float64(e.cfg.ITLPerSeq)*float64(decoders-1)
	}
	d *= e.faults.Slowdown
	if e.cfg.Jitter > 0 {
		d *= e.jitter()
	}
	e.inStep = true
	e.stepEnd = at.Add(time.Duration(d + 0.5))
}

// jitter draws a step's time factor: lognormal with mean 1, its log of standard deviation Config.Jitter.
func (e *engine) jitter() float64 {
	sigma := e.cfg.Jitter
	return math.Exp(sigma*e.jrng.NormFloat64() - sigma*sigma/2)
}

// attentionCost is the prefill cost beyond linear of computing n tokens after c, in tokens' worth: under
// Config.PrefillKnee a token at context x costs 1 + x/knee, so n tokens from c cost n + ((c+n)^2 - c^2)/(2 knee),
// the same whether they run in one chunk or several.
func (e *engine) attentionCost(c, n int) float64 {
	if e.cfg.PrefillKnee == 0 || n == 0 {
		return 0
	}
	cf, nf := float64(c), float64(n)
	return ((cf+nf)*(cf+nf) - cf*cf) / (2 * float64(e.cfg.PrefillKnee))
}

// schedule fills e.batch for one step: the running sequences oldest first (only those still prefilling when
// prefillOnly), then, if admit, waiting sequences while max_num_seqs, the token budget and free blocks allow.
// It returns the prefill tokens, the decoding sequences and the attention cost (attentionCost) scheduled. Under
// PrefillOff a prompt is never split: a prefilling sequence runs whole, or only if it is the step's first.
func (e *engine) schedule(prefillOnly, admit bool) (prefill, decoders int, attention float64) {
	whole := e.cfg.ChunkedPrefill == PrefillOff
	budget := e.cfg.MaxBatchedTokens
	preempted := false
	e.batch = e.batch[:0]
running:
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		if prefillOnly && s.decoding {
			continue
		}
		left := s.prompt + s.output - s.computed
		n := min(left, budget)
		if whole && !s.decoding && n < left {
			if len(e.batch) > 0 {
				continue
			}
			n = left
		}
		for e.blocksFor(s.computed+n)-len(s.blocks) > e.pool.free {
			vi := e.victim()
			victim := e.running[vi]
			if vi < i {
				// Under the priority policy the victim may be scheduled already in this step: vLLM gives
				// its tokens back to the budget.
				i--
				e.batch = deleteSeq(e.batch, victim)
				budget += victim.stepTokens
				if victim.decoding {
					decoders--
				} else {
					prefill -= victim.stepTokens
					attention -= e.attentionCost(victim.computed, victim.stepTokens)
				}
			}
			e.preempt(vi)
			preempted = true
			if victim == s {
				break running
			}
		}
		for range e.blocksFor(s.computed+n) - len(s.blocks) {
			s.blocks = append(s.blocks, e.pool.alloc())
		}
		s.stepTokens = n
		budget -= n
		if s.decoding {
			decoders++
		} else {
			prefill += n
			attention += e.attentionCost(s.computed, n)
		}
		e.batch = append(e.batch, s)
	}
	// As vLLM, admit nothing in a step that had to preempt (unless the batch emptied).
	for admit && (!preempted || len(e.running) == 0) && len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs && budget > 0 {
		s := e.waiting[0]
		total := s.prompt + s.output
		// A full hit still recomputes the last token, which the first new token needs (vLLM caps the hit at
		// total-1 tokens, in whole blocks).
		hit := e.pool.lookup(s.hashes, (total-1)/e.cfg.blockSize())
		computed := hit * e.cfg.blockSize()
		n := min(total-computed, budget)
		if whole && n < total-computed {
			if len(e.batch) > 0 {
				break // the whole prompt waits for a step of its own
			}
			n = total - computed
		}
		idleHits := 0
		for _, h := range s.hashes[:hit] {
			if e.pool.ref[e.pool.cached[h]] == 0 {
				idleHits++
			}
		}
		if e.blocksFor(computed+n)-hit > e.pool.free-idleHits {
			break // out of KV blocks: the queue waits (head of line, as vLLM)
		}
		e.waiting = e.waiting[1:]
		s.blocks = e.pool.hold(s.blocks[:0], s.hashes[:hit])
		for range e.blocksFor(computed+n) - hit {
			s.blocks = append(s.blocks, e.pool.alloc())
		}
		s.computed, s.registered = computed, hit
		if s.cached < 0 {
			s.cached = computed
		}
		e.m.prefixQueries.Add(float64(total))
		e.m.prefixHits.Add(float64(computed))
		s.state = stateRunning
		e.running = append(e.running, s)
		s.stepTokens = n
		budget -= n
		prefill += n
		attention += e.attentionCost(computed, n)
		e.batch = append(e.batch, s)
	}
	return prefill, decoders, attention
}

// victim returns the index in running of the sequence to preempt when a block is needed and none is free: the
// newest (fcfs), or, as vLLM's priority policy, the one with the highest priority value, the latest arrival on
// a tie (max(running, key=(priority, arrival_time)) in vLLM's v1 scheduler).
func (e *engine) victim() int {
	v := len(e.running) - 1
	if e.cfg.SchedulingPolicy != PolicyPriority {
		return v
	}
	for i, s := range e.running {
		if w := e.running[v]; s.priority > w.priority || s.priority == w.priority && s.order > w.order {
			v = i
		}
	}
	return v
}

// preempt sends running[i] back to the waiting queue (its front under fcfs, its place by priority under the
// priority policy), freeing its blocks; it will recompute its prompt and output so far (prefix caching may spare
// part of that).
func (e *engine) preempt(i int) {
	s := e.running[i]
	e.running = slices.Delete(e.running, i, i+1)
	e.pool.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.computed, s.registered, s.decoding = 0, 0, false
	s.state = stateWaiting
	e.enqueue(s, true)
	e.m.preemptions.Inc()
}

// enqueue puts s in the waiting queue: at its back (front when preempted) under fcfs; under the priority
// policy after every sequence with a lower (priority, order), as vLLM's heap of (priority, arrival_time) pops
// them. The waiting queue stays head-of-line either way: admission takes waiting[0].
func (e *engine) enqueue(s *seq, preempted bool) {
	if e.cfg.SchedulingPolicy != PolicyPriority {
		if preempted {
			e.waiting = slices.Insert(e.waiting, 0, s)
		} else {
			e.waiting = append(e.waiting, s)
		}
		return
	}
	i, _ := slices.BinarySearchFunc(e.waiting, s, func(w, s *seq) int {
		return cmp.Or(cmp.Compare(w.priority, s.priority), cmp.Compare(w.order, s.order))
	})
	e.waiting = slices.Insert(e.waiting, i, s)
}

// finish ends a running sequence that is done at now, counted under reason.
func (e *engine) finish(s *seq, now time.Time, reason string) {
	e.running = deleteSeq(e.running, s)
	e.pool.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.state = stateDone
	e.m.success[reason].Inc()
	e.m.e2e.Observe(now.Sub(s.arrival).Seconds())
	s.end.Store(endLength)
}

// endStep completes the current step at stepEnd: computed tokens advance, finished prompt blocks enter the prefix
// cache, and each sequence whose prompt is fully computed gets its next token.
func (e *engine) endStep() {
	now := e.stepEnd
	generated := 0
	for _, s := range e.batch {
		n := s.stepTokens
		s.stepTokens = 0
		if s.state != stateRunning || n == 0 {
			continue // aborted during the step
		}
		s.computed += n
		e.registerPrompt(s)
		if s.computed < s.prompt+s.output {
			continue // a chunk of a longer prefill
		}
		if e.token(s, now) {
			generated++
		}
	}
	e.noteGenerated(now, generated)
	e.batch = e.batch[:0]
	e.inStep = false
	e.lastEnd = now
	e.publish()
}

// throughputWindow is the span over which last_gen_throughput is measured: "the last second or so".
const throughputWindow = time.Second

// genEntry is the tokens one step generated, and when.
type genEntry struct {
	at time.Time
	n  int
}

// noteGenerated counts n tokens generated at now, in generation_tokens_total and in the throughput window,
// dropping the entries older than throughputWindow (compacting once half the slice is dropped, so the cost
// per step stays constant). Call it with e.mu held, at every step's (or seat interval's) end.
func (e *engine) noteGenerated(now time.Time, n int) {
	e.m.genToken.Add(float64(n))
	from := now.Add(-throughputWindow)
	for e.genHead < len(e.gen) && !e.gen[e.genHead].at.After(from) {
		e.genHead++
	}
	if e.genHead > len(e.gen)/2 {
		e.gen = e.gen[:copy(e.gen, e.gen[e.genHead:])]
		e.genHead = 0
	}
	if n > 0 {
		e.gen = append(e.gen, genEntry{now, n})
	}
}

// genThroughput is the generation rate at now in tokens per second: the tokens generated in the last
// throughputWindow over its length, or over the time since the engine started when that is shorter. An idle
// engine's rate falls to 0 a window after its last token. Call it with e.mu held.
func (e *engine) genThroughput(now time.Time) float64 {
	span := min(throughputWindow, now.Sub(e.start))
	if span <= 0 {
		return 0
	}
	from, n := now.Add(-span), 0
	for _, g := range e.gen[e.genHead:] {
		if g.at.After(from) && !g.at.After(now) {
			n += g.n
		}
	}
	return float64(n) / span.Seconds()
}

// registerPrompt enters s's newly computed full prompt blocks in the prefix cache.
func (e *engine) registerPrompt(s *seq) {
	full := min(s.computed/e.cfg.blockSize(), len(s.hashes))
	for k := s.registered; k < full; k++ {
		parent := int32(-1)
		if k > 0 {
			parent = s.blocks[k-1]
		}
		e.pool.register(s.blocks[k], parent, s.hashes[k])
	}
	s.registered = max(s.registered, full)
}

// token gives s, whose prompt is computed, its next token at now (a pooling sequence instead ends), counting
// the metrics and finishing s at its last token. It reports whether a token was generated.
func (e *engine) token(s *seq, now time.Time) bool {
	if s.pooling {
		e.m.promptTokens.Add(float64(s.prompt))
		e.finish(s, now, reasonStop)
		s.wakeup()
		return false
	}
	s.decoding = true
	s.output++
	if s.output == 1 {
		e.m.ttft.Observe(now.Sub(s.arrival).Seconds())
		e.m.promptTokens.Add(float64(s.prompt))
	} else {
		e.m.itl.Observe(now.Sub(s.lastAt).Seconds())
	}
	s.lastAt = now
	s.emitted.Store(int32(s.output))
	if s.output >= s.maxTokens {
		reason := reasonLength
		if s.stop {
			reason = reasonStop
		}
		e.finish(s, now, reason)
	}
	s.wakeup()
	return true
}
