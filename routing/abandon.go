package routing

// Abandon ends an attempt cancelled before its first token because another attempt for the same request won the
// race (a hedge): not the backend's failure, so nothing counts against it, but the time it waited without a first
// token is a lower bound of its TTFT, which the model learns when it is well above the prediction (as for a
// first-byte timeout, see End). Without this, hedging would hide a backend's slow tail from routing: every slow
// attempt would be cancelled before it could teach the model anything.
func (a *Attempt) Abandon() {
	if a.ended {
		return
	}
	first := a.first
	waited := a.b.clock.Now().Sub(a.start).Seconds()
	a.End(false)
	if !first && waited > 2*(a.rtt+a.predTTFT) {
		a.b.observeTTFT(a, waited)
	}
}
