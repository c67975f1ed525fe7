package routing

import "time"

// The prefill queued on a backend, as the cost sees it, is this replica's in full and the other replicas' as much
// of it as is left:
//
//	local:  the uncached tokens of this replica's requests there without a first token yet, in full
//	peers:  each replica reports its own that way; the reader drains each report by its age (from Redis TIME)
//	        and then by the time since it read them, at the backend's learned prefill rate (the TTFT model's
//	        per-token coefficient):
//	        reported(now) = max(0, sum - (now - at) / rate)
//	        and each prefix hint carries its dispatch's uncached tokens, which reach the others within a round
//	        trip rather than a report interval; the reader queues them at their dispatch time (the stream
//	        entry's Redis time, less the clock offset the load script measured) as a fluid queue:
//	        peerDrain = max(peerDrain, dispatched) + tokens * rate,  announced(now) = max(0, peerDrain - now) / rate
//	        queued_peers(now) = max(reported(now), announced(now))    (the same requests, seen twice: never summed)
//
// A report is up to an interval old when it is written and another when it is read: counted raw it was mostly
// stale (and taught the models a prefill rate several times too fast), and leaving it out, as routing once did,
// hid a neighbour's cold prefill (1,400 tokens, 140 ms here) from the other replica, which then took a
// conversation's owner for idle or, once the wait showed, for slow. The hints make a neighbour's prefill known
// before it is over.
//
// This replica's own prefill is not drained, by measurement: draining it too at the learned rate (the engine
// working through its queue as a fluid) predicted the first tokens of short turns queued behind a neighbour's
// prefill several times too early on the simulator, whose engine step holds a whole prefill chunk; passive
// outlier detection (admission) counted them slow and ejected the busiest owner on one replica in about one run
// of three of TestConversationAffinityAcrossReplicas (none in five runs counting the local prefill in full), each
// time moving every conversation on it. A request without a first token is work the engine has not finished.

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
