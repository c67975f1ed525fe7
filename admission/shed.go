package admission

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/switchyard/switchyard/metrics"
)

// Saturation thresholds, as routing's adaptive strategy defines "fully loaded" (routing.AdaptiveParams): a
// backend with this many requests waiting in its engine, or this share of its KV cache in use, counts as
// saturation 1.
const (
	SaturationWaiting = 4
	SaturationKV      = 0.85
	// MaxSaturation caps one backend's contribution to PoolSaturation, so that one backend drowning does not
	// make a pool of idle ones look saturated (llm-d's probabilistic admitter caps at 1.5 too).
	MaxSaturation = 1.5
)

// Saturation returns one backend's saturation: the largest of waiting/SaturationWaiting,
// kvUsage/SaturationKV and inflight/limit (the concurrency cap; limit <= 0 means no cap), so 1 means "at
// capacity" by whichever measure is tightest. Pass the engine's waiting requests and KV usage (0 to 1) when its
// metrics are fresh, 0 otherwise; the gateway's own in-flight count and cap (Cap.Inflight, Cap.LimitFor) have no
// lag, so either view can trip it (routing.md 4.6.5).
func Saturation(waiting int, kvUsage float64, inflight, limit int) float64 {
	s := max(float64(waiting)/SaturationWaiting, kvUsage/SaturationKV)
	if limit > 0 {
		s = max(s, float64(inflight)/float64(limit))
	}
	return max(s, 0)
}

// PoolSaturation returns the saturation S of a pool (the backends that serve a model): the mean over its
// healthy backends of min(Saturation, MaxSaturation). sats holds one value per healthy backend; an empty pool
// is saturated (1). PoolMeter computes the same without a slice.
func PoolSaturation(sats []float64) float64 {
	var m PoolMeter
	for _, s := range sats {
		m.Add(s)
	}
	return m.S()
}

// PoolMeter accumulates a pool's saturation backend by backend, without allocating: Add each healthy backend's
// Saturation, then read S. The zero value is an empty pool. Not safe for concurrent use (keep it on the stack).
type PoolMeter struct {
	sum float64
	n   int
}

// Add counts one healthy backend of saturation s.
func (m *PoolMeter) Add(s float64) {
	m.sum += min(max(s, 0), MaxSaturation)
	m.n++
}

// S returns the pool's saturation: the mean of the capped saturations added, or 1 when none was (no healthy
// backend: the pool can take nothing).
func (m *PoolMeter) S() float64 {
	if m.n == 0 {
		return 1
	}
	return m.sum / float64(m.n)
}

// Curve is a probabilistic shedding curve (llm-d's probabilistic admitter, routing.md 4.6.2): at pool
// saturation S a request is refused with probability min(1, (S/Full)^Power). llm-d writes it
// min(1, k*S^power) with k = Full^-Power; its defaults k 300, power 5 are Full ~0.32 on its saturation scale
// (queue/5, KV/0.8 only), where a gateway-held queue never shows.
type Curve struct {
	// Full is the saturation at which every request of the class is refused; 0 disables the curve.
	Full float64
	// Power shapes the onset: the larger, the later and steeper. Must be > 0 when Full is set.
	Power float64
}

// P returns the refusal probability at saturation s.
func (c Curve) P(s float64) float64 {
	if c.Full <= 0 || s <= 0 {
		return 0
	}
	if s >= c.Full {
		return 1
	}
	return math.Pow(s/c.Full, c.Power)
}

// ShedParams tune the Shedder. DefaultShedParams gives the defaults.
type ShedParams struct {
	// Curves are the saturation curves, by Class.Index. Defaults: sheddable {Full 1, Power 5} (1% refused at
	// S 0.4, 3% at 0.5, 17% at 0.7, 59% at 0.9, all at 1: at S 1 every backend is at capacity and the gateway
	// queue would hold the request); standard and critical none (standard is shed only on its prediction,
	// critical never).
	Curves [NumClasses]Curve
	// RetryAfter is the Retry-After of a shed request; MaxRetryAfter bounds the longer one given when the
	// curve refuses most traffic (RetryAfter + p*(MaxRetryAfter-RetryAfter), rounded to seconds by the client
	// header). Defaults 1s and 5s (ops.md A1.5: small, so SDKs come back soon).
	RetryAfter    time.Duration
	MaxRetryAfter time.Duration
	// Priorities gives each class's SLO factor. Default DefaultPriorities().
	Priorities Priorities
}

// DefaultShedParams returns the defaults listed on ShedParams.
func DefaultShedParams() ShedParams {
	p := ShedParams{
		RetryAfter:    time.Second,
		MaxRetryAfter: 5 * time.Second,
		Priorities:    DefaultPriorities(),
	}
	p.Curves[Sheddable.Index()] = Curve{Full: 1, Power: 5}
	return p
}

// ShedInput is what the request path knows when it decides: the class, the model's objective, and what
// routing's Pick predicted (routing.Request.Decision()).
type ShedInput struct {
	// Class is the request's class (Priorities.Class).
	Class Class
	// SLO is the model's TTFT objective; 0 means none (no shedding on prediction).
	SLO time.Duration
	// TTFT is the best predicted p90 time to first token, RTT included (Decision.TTFT); 0 means unknown.
	TTFT time.Duration
	// Wait is the expected wait in the gateway queue of a request that cannot start now (Queue.ExpectedWait);
	// added to TTFT when the request would wait (Saturated, or Queued > 0).
	Wait time.Duration
	// Saturation is the pool's saturation S (PoolSaturation).
	Saturation float64
	// Saturated says that every healthy candidate was saturated (Decision.Saturated), or that the picked
	// backend's concurrency cap is full: the request cannot start now.
	Saturated bool
	// Queued is the number of requests waiting in the model's queue (Queue.Len).
	Queued int
	// Idle says the picked backend has nothing in flight, so its prediction may be stale: a sheddable request
	// is not shed on prediction then (the Inference Extension's "has idle" escape hatch).
	Idle bool
	// Calibration corrects the predictions by the error measured on the model's admitted requests (nil: they
	// are taken as they are).
	Calibration *Calibration
}

// Verdict is what to do with a request.
type Verdict uint8

const (
	// Admit: send it now (after Cap.TryAcquire on the picked backend; Enqueue if that fails).
	Admit Verdict = iota
	// Enqueue: wait in the model's Queue (Queue.Wait), which dispatches it when a backend frees.
	Enqueue
	// Shed: refuse it with Decision.Err.
	Shed
)

// String returns "admit", "enqueue" or "shed", for logs.
func (v Verdict) String() string {
	switch v {
	case Admit:
		return "admit"
	case Enqueue:
		return "enqueue"
	}
	return "shed"
}

// ShedDecision is the Shedder's answer.
type ShedDecision struct {
	Verdict Verdict
	// Err, for Shed, is ErrOverloaded (the sheddable curve) or ErrSLO (the prediction misses): both 503.
	Err error
	// RetryAfter, for Shed, is the Retry-After to send.
	RetryAfter time.Duration
	// Wait, for Enqueue, is the expected wait the request was judged on (ShedInput.Wait), before correction:
	// what its wait is measured against (Calibration.Observe, Calibration.Late). 0 when it was not judged on a
	// prediction (critical, no SLO, no prediction) or does not wait.
	Wait time.Duration
}

// Shedder decides admit / queue / shed before any GPU prefill is spent (routing.md 4.6.1-2):
//
//	objective = SLO * slo_factor(class); waits = Saturated or Queued > 0
//	corrected = TTFT * Calibration.Serve(class) + (Wait * Calibration.Wait(class) if waits)
//	sheddable: shed with probability Curve.P(S)                                   (ErrOverloaded)
//	           shed if corrected > objective, unless the backend is idle          (ErrSLO)
//	standard:  shed if corrected > objective and waits                            (ErrSLO)
//	critical:  never shed here
//	then:      enqueue if waits (strict priority: nobody overtakes the queue), else admit
//
// A standard request that can start now is admitted whatever its prediction: refusing it frees nothing that
// another request could use, and its first token measures the prediction (without it, a fleet whose prediction
// is biased high would refuse every waiting request and never learn otherwise). In the queue, Deadline and
// TooLate refuse a request as soon as it can no longer meet its objective.
//
// Immutable once built; safe for concurrent use.
type Shedder struct {
	p    ShedParams
	rand func() float64
	shed shedCounters
}

// NewShedder returns a Shedder counting its refusals in m (nil: none). Zero fields of p take their defaults.
func NewShedder(p ShedParams, m *metrics.Gateway) *Shedder {
	d := DefaultShedParams()
	if p.RetryAfter <= 0 {
		p.RetryAfter = d.RetryAfter
	}
	if p.MaxRetryAfter < p.RetryAfter {
		p.MaxRetryAfter = max(d.MaxRetryAfter, p.RetryAfter)
	}
	return &Shedder{p: p, rand: rand.Float64, shed: newShedCounters(m, ReasonSaturated, ReasonSLO)}
}

// Params returns the parameters in force.
func (s *Shedder) Params() ShedParams { return s.p }

// Decide returns the verdict for one request. Call it after the routing Pick (whose Decision it reads) and
// before sending anything upstream; call it again for a retry only if the policy wants retries re-judged (the
// request was already admitted once). It does not allocate.
func (s *Shedder) Decide(in *ShedInput) ShedDecision { return s.decide(in, s.rand()) }

// decide is Decide with the random draw u in [0, 1) given.
func (s *Shedder) decide(in *ShedInput, u float64) ShedDecision {
	c := in.Class
	objective := s.Objective(c, in.SLO)
	waits := in.Saturated || in.Queued > 0
	judged := in.SLO > 0 && in.TTFT > 0 && c != Critical
	var wait time.Duration // the wait judged; 0: none
	if judged && waits {
		wait = in.Wait
	}
	late := judged && in.Calibration.Corrected(c, in.TTFT, wait) > objective
	switch c.Index() {
	case Sheddable.Index():
		if p := s.p.Curves[c.Index()].P(in.Saturation); p > 0 && u < p {
			return s.refuse(ErrOverloaded, c, p)
		}
		if late && !in.Idle {
			return s.refuse(ErrSLO, c, 0)
		}
	case Standard.Index():
		if p := s.p.Curves[c.Index()].P(in.Saturation); p > 0 && u < p {
			return s.refuse(ErrOverloaded, c, p)
		}
		if late && waits {
			return s.refuse(ErrSLO, c, 0)
		}
	}
	if waits {
		return ShedDecision{Verdict: Enqueue, Wait: wait}
	}
	return ShedDecision{Verdict: Admit}
}

func (s *Shedder) refuse(err error, c Class, p float64) ShedDecision {
	s.shed.count(err, c)
	ra := s.p.RetryAfter + time.Duration(p*float64(s.p.MaxRetryAfter-s.p.RetryAfter))
	return ShedDecision{Verdict: Shed, Err: err, RetryAfter: ra}
}

// Objective returns the TTFT objective of a request of class c on a model whose objective is slo: slo times the
// class's SLO factor (0 when slo is 0).
func (s *Shedder) Objective(c Class, slo time.Duration) time.Duration {
	return time.Duration(float64(slo) * s.p.Priorities.Factor(c))
}

// Deadline returns the latest time a request judged on in (its Decide input) that arrived at arrival may still
// be dispatched from the queue, for Queue.Wait: arrival + queueTimeout, shortened, for standard and sheddable
// requests on a model with a TTFT objective, to the last moment from which its first token can still come
// within the objective (a request that misses its objective waiting has lost its value; routing.md 4.6.3):
//
//	arrival + objective - TTFT * Calibration.Serve(class)     (never before arrival)
//
// Critical requests are not shortened (they wait for capacity up to queueTimeout).
func (s *Shedder) Deadline(arrival time.Time, in *ShedInput, queueTimeout time.Duration) time.Time {
	wait := queueTimeout
	if in.SLO > 0 && in.Class != Critical {
		serve := time.Duration(float64(in.TTFT) * in.Calibration.Serve(in.Class))
		wait = min(wait, max(s.Objective(in.Class, in.SLO)-serve, 0))
	}
	return arrival.Add(wait)
}

// TooLate is the queue's last check when a waiting standard or sheddable request is about to be dispatched: it
// reports whether its first token, counted from arrival, misses the objective of class c on a model whose
// objective is slo when it comes waited + ttft * Calibration.Serve(c) (ttft: routing's p90 prediction for the
// backend just picked). A request too late is refused at that moment (ErrQueueTimeout) rather than dispatched
// to miss. Critical requests, and models without an objective, are never too late.
func (s *Shedder) TooLate(c Class, slo, waited, ttft time.Duration, cal *Calibration) bool {
	if slo <= 0 || c == Critical {
		return false
	}
	return waited+time.Duration(float64(ttft)*cal.Serve(c)) > s.Objective(c, slo)
}
