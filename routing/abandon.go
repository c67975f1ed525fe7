package routing

// Abandon ends an attempt cancelled before its first token while it raced a hedge (the request was given up:
// the client left, or the gateway stops; a race lost to the other attempt reads on to its first token instead,
// docs/design.md, "Hedging"): not the backend's failure, so nothing counts against it, but the time it waited
// without a first token is a lower bound of its TTFT, which the model learns when it is well above the
// prediction (as for a first-byte timeout, see End).
func (a *Attempt) Abandon() {
	if a.ended {
		return
	}
	first := a.first
	now := a.b.clock.Now()
	waited := now.Sub(a.start).Seconds()
	a.End(false)
	if !first && waited > 2*a.predicted() {
		a.b.observeTTFT(a, waited, now)
	}
}
