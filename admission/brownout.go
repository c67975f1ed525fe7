package admission

// Pool is what Brownout needs to know about a model's backends.
type Pool struct {
	// Saturation is the pool's saturation S (PoolSaturation).
	Saturation float64
	// Saturated says that every healthy backend of the pool is saturated (routing's Decision.Saturated, or
	// every Cap Full), or that none is healthy.
	Saturated bool
}

// Brownout decides when a request goes to its model's degrade_to variant (a smaller or quantized model) instead
// of waiting or being shed (docs/design.md, "Routing and protection": brownout before shedding). A request of class c
// is degraded when
//
//	c is not critical, and the model has a degrade_to, and
//	the primary pool is Saturated or its S >= At[c], and
//	the degraded pool is not Saturated and its S is below the primary's (degrading must help).
//
// The thresholds put brownout ahead of every refusal: sheddable traffic moves at the onset of the sheddable
// shedding curve, standard traffic when the primary pool is nearly full (it would queue next). Critical traffic
// is never degraded: it keeps the model it asked for and queues. The zero value never degrades; use
// DefaultBrownout.
type Brownout struct {
	// At is the primary pool saturation from which each class (by Class.Index) is degraded; 0 means never.
	// Defaults: critical never, standard 0.9, sheddable 0.4 (where DefaultShedParams' curve starts to refuse
	// 1%).
	At [NumClasses]float64
}

// DefaultBrownout returns the thresholds listed on Brownout.
func DefaultBrownout() Brownout {
	return Brownout{At: [NumClasses]float64{0, 0.9, 0.4}}
}

// Degrade reports whether a request of class c should be served by the model's degrade_to model. Call it
// after the pick on the primary model (which gives primary.Saturated) and before the Shedder, only for a model
// with a degrade_to; on true, route the request with the degraded model (pick again on its targets) and give
// the Shedder the degraded pool's state, then count it in switchyard_degraded_total. It does not allocate.
func (b Brownout) Degrade(c Class, primary, degraded Pool) bool {
	at := b.At[c.Index()]
	if at <= 0 || c.Index() == Critical.Index() {
		return false
	}
	if !primary.Saturated && primary.Saturation < at {
		return false
	}
	return !degraded.Saturated && degraded.Saturation < primary.Saturation
}
