package routing

import "time"

// The prefill queued on a backend, as the cost sees it, is the work left, not the work dispatched: a request whose
// 1,400-token prefill started 120 ms ago on an engine that prefills 10,000 tokens/s has 200 tokens left, not 1,400.
// Counting the whole of it made the owner of a conversation's prefix look busy for as long as a neighbour's prefill
// was in flight (and then, once the first token came, idle again), so the next turn moved for a wait that was
// mostly over; and leaving the other replicas' prefill out (their reports are up to three intervals old) hid it
// entirely, so a turn that waited behind it taught the replica that the owner was slow.
//
// Both are drained at the backend's learned prefill rate (the TTFT model's per-token coefficient), as a fluid
// queue:
//
//	local:  drainAt = max(drainAt, now) + uncached * rate       at each dispatch (now, if nothing was prefilling)
//	        queued_local(now) = min(prefill tokens in flight, max(0, drainAt - now) / rate)
//	        on a first token or an end before it, drainAt <= now + (prefill tokens left) * rate
//	peers:  each replica reports its queued_local at its report's time; the reader drains each report by its age
//	        (from Redis TIME) and then by the time since it read them:
//	        reported(now) = max(0, sum - (now - at) / rate)
//	        and each prefix hint carries its dispatch's uncached tokens, which reach the others within a round
//	        trip rather than a report interval; the reader queues them at their dispatch time (the stream
//	        entry's Redis time, less the clock offset the load script measured) like its own:
//	        peerDrain = max(peerDrain, dispatched) + tokens * rate,  announced(now) = max(0, peerDrain - now) / rate
//	        queued_peers(now) = max(reported(now), announced(now))    (the same requests, seen twice: never summed)
//
// The hints matter because a report is up to an interval old when it is written and another when it is read: a
// neighbour's cold prefill of 1,400 tokens (140 ms here) was over before the other replica knew of it, which
// then predicted a cached turn queued behind it at a fifth of what it took; the slow first tokens led passive
// outlier detection to eject the busiest owner and move every conversation on it at once.
//
// The bound by the tokens in flight keeps a learned rate that is too slow from inventing work; a rate that is
// too fast drains early, and the engine's scraped queue (waiting * tokens per request, loadAt) is the floor.

// queuePrefill adds tok uncached tokens dispatched at now to b's drain time; fresh says nothing else was
// prefilling, so the queue starts now whatever the old drain time was.
func (b *Backend) queuePrefill(now time.Time, tok float64, fresh bool) {
	add := int64(tok * b.lat.prefillPerToken() * 1e9)
	t := now.UnixNano()
	for {
		old := b.drainAt.Load()
		start := max(old, t)
		if fresh {
			start = t
		}
		if b.drainAt.CompareAndSwap(old, start+add) {
			return
		}
	}
}

// prefillDone bounds b's drain time after a prefill ended at now with left tokens still in flight.
func (b *Backend) prefillDone(now time.Time, left float64) {
	bound := now.UnixNano() + int64(max(left, 0)*b.lat.prefillPerToken()*1e9)
	for {
		old := b.drainAt.Load()
		if old <= bound || b.drainAt.CompareAndSwap(old, bound) {
			return
		}
	}
}

// queuedAt returns the prefill tokens this replica dispatched to b that are left at now (see above).
func (b *Backend) queuedAt(now time.Time) float64 {
	_, tok := b.Prefilling()
	if tok <= 0 {
		return 0
	}
	rate := b.lat.prefillPerToken()
	if rate <= 0 {
		return 0
	}
	left := float64(b.drainAt.Load()-now.UnixNano()) / 1e9 / rate
	return min(float64(tok), max(left, 0))
}

// peerDispatched queues tok uncached tokens another replica dispatched to b at at (its hint, hints.go).
func (b *Backend) peerDispatched(at time.Time, tok float64) {
	add := int64(tok * b.lat.prefillPerToken() * 1e9)
	t := at.UnixNano()
	for {
		old := b.peerDrain.Load()
		if b.peerDrain.CompareAndSwap(old, max(old, t)+add) {
			return
		}
	}
}

// peerDispatchedLeft returns the prefill tokens the other replicas' hints announced that are left at now.
func (b *Backend) peerDispatchedLeft(now time.Time) float64 {
	rate := b.lat.prefillPerToken()
	if rate <= 0 {
		return 0
	}
	return max(float64(b.peerDrain.Load()-now.UnixNano())/1e9/rate, 0)
}

// prefillLeft returns the peers' queued prefill left at now, drained at rate seconds per token since At.
func (p *PeerLoad) prefillLeft(now time.Time, rate float64) float64 {
	if p.PrefillTokens <= 0 {
		return 0
	}
	if rate <= 0 {
		return 0
	}
	return max(float64(p.PrefillTokens)-max(now.Sub(p.At).Seconds(), 0)/rate, 0)
}
