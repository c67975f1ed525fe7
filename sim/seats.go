package sim

import "time"

// The BatchSeats law: MaxNumSeqs seats, each sequence on its own clock (no shared step). A sequence admitted at t
// takes a seat and the KV blocks of its whole context (prompt and max_tokens, so it is never preempted), and
// gets its first token at t + prefill*factor, where prefill is its uncached part at PrefillTPS (with the
// PrefillKnee cost); then one token every ITL*factor. factor is drawn for each interval when it starts:
//
//	factor = (1 + (LoadFactor-1)*(in_flight-1)/(MaxNumSeqs-1)) * slowdown * jitter
//
// with in_flight counting the sequence itself, as llm-d-inference-sim's time-factor-under-load. Requests
// beyond the seats (or the blocks) wait in the queue, head of line, and take a seat when one frees.

// nextSeatEvent is nextEvent under BatchSeats: the next token or prefill end, or the next pending arrival.
func (e *engine) nextSeatEvent() (next time.Time, busy bool) {
	for _, s := range e.running {
		if !busy || s.nextAt.Before(next) {
			next, busy = s.nextAt, true
		}
	}
	if len(e.pending) > 0 && (!busy || e.pending[0].ready.Before(next)) {
		next, busy = e.pending[0].ready, true
	}
	return next, busy
}

// advanceSeats runs every seat event at or before now, in time order.
func (e *engine) advanceSeats(now time.Time) {
	for {
		at, busy := e.nextSeatEvent()
		if !busy || at.After(now) {
			return
		}
		e.seatEvent(at)
	}
}

// seatFactor is the time factor of an interval starting with n sequences in flight.
func (e *engine) seatFactor(n int) float64 {
	f := e.cfg.loadTimeFactor(n) * e.faults.Slowdown
	if e.cfg.Jitter > 0 {
		f *= e.jitter()
	}
	return f
}

// seatEvent processes the events due at at: arrivals join the queue, due sequences get their token (finishing
// frees their seat), and waiting sequences take the free seats.
func (e *engine) seatEvent(at time.Time) {
	for len(e.pending) > 0 && !e.pending[0].ready.After(at) {
		s := e.pending[0]
		e.pending = e.pending[1:]
		s.state = stateWaiting
		e.enqueue(s, false)
	}
	generated := 0
	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		if s.nextAt.After(at) {
			continue
		}
		if !s.decoding {
			s.computed = s.prompt
			e.registerPrompt(s)
		}
		if e.token(s, at) {
			generated++
		}
		if s.state == stateDone {
			i-- // finish removed it from running
			continue
		}
		s.nextAt = at.Add(time.Duration(float64(e.cfg.ITL)*e.seatFactor(len(e.running)) + 0.5))
	}
	e.noteGenerated(at, generated)
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		s := e.waiting[0]
		hit := e.pool.lookup(s.hashes, (s.prompt-1)/e.cfg.blockSize())
		computed := hit * e.cfg.blockSize()
		idleHits := 0
		for _, h := range s.hashes[:hit] {
			if e.pool.ref[e.pool.cached[h]] == 0 {
				idleHits++
			}
		}
		need := e.blocksFor(s.prompt+s.maxTokens) - hit
		if need > e.pool.free-idleHits {
			break // out of KV blocks: the queue waits
		}
		e.waiting = e.waiting[1:]
		s.blocks = e.pool.hold(s.blocks[:0], s.hashes[:hit])
		for range need {
			s.blocks = append(s.blocks, e.pool.alloc())
		}
		s.computed, s.registered = computed, hit
		if s.cached < 0 {
			s.cached = computed
		}
		e.m.prefixQueries.Add(float64(s.prompt))
		e.m.prefixHits.Add(float64(computed))
		s.state = stateRunning
		e.running = append(e.running, s)
		n := s.prompt - computed
		cost := (float64(n) + e.attentionCost(computed, n)) / e.cfg.PrefillTPS * float64(time.Second)
		s.nextAt = at.Add(time.Duration(cost*e.seatFactor(len(e.running)) + 0.5))
	}
	e.lastEnd = at
	e.publish()
}
