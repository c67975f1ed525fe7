package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/switchyard/switchyard/openai"
)

// Prediction is the simulator's ground truth for one request that has not been sent: what the backend would do
// with it if it arrived now. POST /sim/predict answers it as JSON.
type Prediction struct {
	// Backend is Config.Name.
	Backend string `json:"backend"`
	// PromptTokens is the request's prompt length in tokens, as its usage would report it.
	PromptTokens int `json:"prompt_tokens"`
	// CachedTokens is the prefix-cache hit the prompt would get now: the full blocks of its prefix in the cache
	// at this moment (capped, as at admission, so that the last token is computed). A prefix still being
	// prefilled by a request ahead is not counted yet, though TTFTMillis counts its saving if the prefill ends
	// before the probe is admitted.
	CachedTokens int `json:"cached_tokens"`
	// TTFTMillis is the engine's own estimate of the request's time to first token if it arrived now: RTT, the
	// API overhead, the wait for a seat and the queue ahead, and the prefill of its uncached part, under the
	// backend's physics and its current faults (see engine.predict).
	TTFTMillis float64 `json:"ttft_ms"`
	// Running and Waiting are vllm:num_requests_running and vllm:num_requests_waiting now.
	Running int `json:"running"`
	Waiting int `json:"waiting"`
	// MaxNumSeqs is Config.MaxNumSeqs.
	MaxNumSeqs int `json:"max_num_seqs"`
}

// maxPredictEvents bounds the events (step ends, arrivals) a prediction simulates. The probe is admitted at the
// latest when everything ahead of it has finished, which takes far fewer steps than this on any valid Config;
// the bound only keeps a bug from hanging a handler.
const maxPredictEvents = 1 << 22

// errNoPrediction is returned when the probe got no first token within maxPredictEvents (or was killed).
var errNoPrediction = errors.New("sim: predict: the probe got no first token")

// predictClock is a virtual clock for a forked engine: predict moves it from event to event.
type predictClock struct{ t time.Time }

func (c *predictClock) Now() time.Time { return c.t }

// probe is a request to predict: its prompt, its generation length and its hashes, as submit would get them.
type probe struct {
	prompt, maxTokens, priority int
	hashes                      []uint64
	// delay is the time before the request reaches the API server (Config.RTT): the engine moves on meanwhile.
	delay time.Duration
}

// predict answers Prediction for p without changing e: it copies the engine (queues, running batch, KV cache,
// faults, the jitter generator's state) under the lock, then, without the lock, runs the copy on a virtual
// clock from now: the copy first catches up to now (as e's loop would on waking), then the probe arrives after
// p.delay and the copy runs event by event until the probe's first token. The answer is therefore exact for a
// request sent now when no other request arrives before its first token; every later arrival can only make it
// later (a longer queue, a bigger batch) or, under the priority policy, earlier than a lower-priority one.
// Stall faults drawn per request (StallRate > 0) are not drawn for the probe; a stall of every request is
// counted. Nothing of e changes: no LRU touch, no metric, no counter, no random draw.
func (e *engine) predict(p probe) (Prediction, error) {
	e.mu.Lock()
	now := e.clock.Now()
	clk := &predictClock{t: now}
	f := e.fork(clk)
	e.mu.Unlock()

	f.advance(now)
	out := Prediction{
		Backend:      f.cfg.Name,
		PromptTokens: p.prompt,
		CachedTokens: f.pool.lookup(p.hashes, (p.prompt-1)/f.cfg.blockSize()) * f.cfg.blockSize(),
		Running:      len(f.running),
		Waiting:      len(f.waiting),
		MaxNumSeqs:   f.cfg.MaxNumSeqs,
	}
	arrive := now.Add(p.delay)
	events := 0
	if !f.runUntil(clk, arrive, &events, nil) {
		return Prediction{}, errNoPrediction
	}
	s := newSeq(p.prompt, p.maxTokens, p.hashes)
	s.priority = p.priority
	if err := f.submit(s); err != nil {
		return Prediction{}, fmt.Errorf("sim: predict: %w", err)
	}
	first := func() bool { return s.output > 0 || s.state == stateDone }
	if !f.runUntil(clk, time.Time{}, &events, first) || s.output == 0 {
		return Prediction{}, errNoPrediction
	}
	out.TTFTMillis = float64(clk.t.Sub(now)) / float64(time.Millisecond)
	return out, nil
}

// runUntil runs a forked engine event by event until target (a zero target: no limit) or until done reports
// true after an event, moving clk to each event's time. It reports false if it ran out of events (idle before
// done) or past maxPredictEvents, counting events in *n.
func (e *engine) runUntil(clk *predictClock, target time.Time, n *int, done func() bool) bool {
	for ; *n < maxPredictEvents; *n++ {
		if done != nil && done() {
			return true
		}
		next, busy := e.nextEvent(clk.t)
		if !busy || (!target.IsZero() && next.After(target)) {
			if target.IsZero() {
				return false
			}
			clk.t = target
			e.advance(target)
			return true
		}
		if next.After(clk.t) {
			clk.t = next
		}
		e.advance(clk.t)
	}
	return false
}

// fork returns a copy of e for predict, run on clk. The copy shares nothing e mutates: its sequences, queues
// and KV pool are copies, its metrics a scratch registry that nobody reads, and it has no loop goroutine (its
// wake channel is nil, so kick does nothing). Call it with e.mu held.
func (e *engine) fork(clk timeSource) *engine {
	if e.scratch == nil {
		e.scratch = newMetrics(e.cfg, e.start)
	}
	f := &engine{
		cfg:     e.cfg.forPredict(),
		clock:   clk,
		faults:  e.faults,
		m:       e.scratch,
		start:   e.start,
		pool:    e.pool.clone(),
		arrived: e.arrived,
		inStep:  e.inStep,
		stepEnd: e.stepEnd,
		lastEnd: e.lastEnd,
	}
	jit := *e.jit // the same draws as e's next steps
	f.jit = &jit
	f.jrng = rand.New(f.jit)
	copies := make(map[*seq]*seq, len(e.pending)+len(e.waiting)+len(e.running))
	notify := make(chan struct{}, 1) // shared: nobody waits on a fork's sequences
	dup := func(list []*seq) []*seq {
		out := make([]*seq, len(list))
		for i, s := range list {
			c := s.fork(notify)
			copies[s] = c
			out[i] = c
		}
		return out
	}
	f.pending, f.waiting, f.running = dup(e.pending), dup(e.waiting), dup(e.running)
	for _, s := range e.batch {
		if c, ok := copies[s]; ok { // a sequence aborted during the step is in no queue: endStep skips it
			f.batch = append(f.batch, c)
		}
	}
	return f
}

// fork copies the engine's part of s (not its delivery to a handler) for engine.fork.
func (s *seq) fork(notify chan struct{}) *seq {
	return &seq{
		prompt: s.prompt, maxTokens: s.maxTokens, hashes: s.hashes,
		arrival: s.arrival, ready: s.ready, priority: s.priority, order: s.order, state: s.state,
		computed: s.computed, output: s.output, blocks: slices.Clone(s.blocks), registered: s.registered,
		decoding: s.decoding, stepTokens: s.stepTokens, cached: s.cached, lastAt: s.lastAt, nextAt: s.nextAt,
		stalled: s.stalled, pooling: s.pooling, stop: s.stop,
		notify: notify,
	}
}

// Predict answers what the backend would do with body, a POST /v1/chat/completions or /v1/completions body
// (told apart by "messages" or "prompt"), if it arrived now, without changing anything (see POST
// /sim/predict). A body the endpoint would refuse is an error carrying the endpoint's status and message.
func (b *Backend) Predict(body []byte) (Prediction, error) {
	ep := openai.Chat
	var kind struct {
		Messages presence `json:"messages"`
		Prompt   presence `json:"prompt"`
	}
	if json.Unmarshal(body, &kind) == nil && !kind.Messages.set && kind.Prompt.set {
		ep = openai.Completions
	}
	req, maxTokens, err := parseRequest(ep, body)
	if err != nil {
		return Prediction{}, err
	}
	if req.Model != "" && req.Model != b.cfg.Model {
		return Prediction{}, errorf(http.StatusNotFound, "The model `%s` does not exist.", req.Model)
	}
	if req.Priority != 0 && b.cfg.SchedulingPolicy != PolicyPriority {
		return Prediction{}, errorf(http.StatusBadRequest,
			"Got priority %d but Priority scheduling is not enabled.", req.Priority)
	}
	prompt, err := openai.AppendPrompt(nil, ep, body)
	if err != nil {
		return Prediction{}, errorf(http.StatusBadRequest, "%s", err.Error())
	}
	promptTokens := max(openai.EstimateTokens(len(prompt)), 1)
	if maxTokens == 0 {
		maxTokens = b.defaultMaxTokens(promptTokens)
	}
	if err := b.checkContext(promptTokens, maxTokens); err != nil {
		return Prediction{}, err
	}
	return b.eng.predict(probe{
		prompt: promptTokens, maxTokens: maxTokens, priority: req.Priority,
		hashes: b.blockHashes(prompt), delay: b.cfg.RTT,
	})
}

// servePredict answers POST /sim/predict (see Predict). Like /sim/control it is the harness's handle, not part
// of the simulated server: it is not delayed by RTT (the prediction counts it), counts in no metric and takes no
// random draw; it answers 405, 413 and 503 (while down) as the completion endpoints do, and a body they would
// refuse with the same status and vLLM-shaped error.
func (b *Backend) servePredict(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	p, err := b.Predict(body)
	if err != nil {
		var br *badRequest
		switch {
		case errors.As(err, &br):
			writeError(w, br.status, br.msg)
		case errors.Is(err, errDown): // it went down since readPost looked
			writeError(w, http.StatusServiceUnavailable, "The engine is down.")
		default:
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	out, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(out, '\n'))
}
