package admission

import (
	"errors"
	"time"
)

// Breaker is a circuit breaker as a Permit uses it, in two steps: Allow when an attempt is dispatched, and the
// done it returns, called exactly once with the attempt's outcome (nil: the backend answered). An error from
// Allow refuses the attempt (open, or half-open with its probes taken). The request path's breakers
// (proxy/breaker.go, gobreaker's two-step breaker, shared across replicas through Redis) implement it.
type Breaker interface {
	Allow() (done func(outcome error), err error)
}

// Signaler is told when capacity may have freed or changed: a model's Queue.
type Signaler interface {
	Signal()
}

// Endpoint is one backend's protections, resolved when a policy snapshot is installed so that the request path
// holds pointers, not names. Nil fields are protections the backend does not have. An Endpoint is read-only
// once built; what it points to is safe for concurrent use.
type Endpoint struct {
	Breaker Breaker
	Cap     *Cap
	Outlier *Outlier
}

// Fleet is what a model's backends share: the seats kept free for critical requests, the queue of the
// requests waiting for capacity, and the measured error of the predictions admission judges on. Nil fields are
// mechanisms the model does not have.
type Fleet struct {
	Reserve     *SeatReserve
	Queue       Signaler
	Calibration *Calibration
}

// Claim is what an attempt asks of a backend.
type Claim struct {
	// Class is the request's priority class and Guard whether its model has critical demand to keep engine seats
	// for (Cap.LimitFor).
	Class Class
	Guard bool
	// Force lets the attempt go when the cap is full, its slot counted past the limit (Cap.AcquirePast):
	// hedges of an admitted request, and retries on a gateway without admission control (with admission on, a
	// retry claims under its class's rules or waits in the queue: proxy's exchange.requeue). The slot is counted
	// because the engine runs or queues the attempt all the same: uncounted, a retry that failed over from a
	// backend that went down left the cap of the backend it went to one seat short of the truth, and the next
	// critical request sent into that "free" seat waited inside the engine for a completion
	// (bench/results/protect-2026-12-02-matrix.md, the one-down cell).
	Force bool
	// Retries, when set, is the budget whose retry slot the attempt holds (RetryBudget.Allow returned true):
	// the permit gives it back at the first token or at the end. On a refusal it stays the caller's.
	Retries *RetryBudget
	// Wait is the expected wait the request was admitted on (ShedDecision.Wait), Waited the time from its
	// arrival to this claim, and Serve routing's p90 prediction for this backend (Decision.TTFT): the attempt's
	// first token measures both predictions' errors in the fleet's Calibration. Zero predictions: not measured.
	// Set them on a request's first attempt only: a retry's or a hedge's first token says how the failure or
	// the race went, not how good the prediction was.
	Wait, Waited, Serve time.Duration
}

// Acquire's refusals.
var (
	// ErrCapFull: the backend's concurrency cap is full for the class; capacity may free on this backend.
	ErrCapFull = errors.New("admission: concurrency cap full")
	// ErrOutOfService: the backend's breaker or outlier detector keeps it out now; pick another backend.
	ErrOutOfService = errors.New("admission: backend out of service")
)

// ErrNotSent is the outcome a Permit reports to a breaker whose permission it took and gave back unused (the
// attempt was refused elsewhere before anything was sent). Breakers must exclude it from their counts.
var ErrNotSent = errors.New("admission: attempt not sent")

// First is what the request path knows when an attempt's answer begins (its first content, or an answer that
// ended without one).
type First struct {
	// Content says a content token arrived; false for an answer without one, which nothing judges.
	Content bool
	// TTFT is dispatch to first token. Predicted is routing's mean prediction at dispatch and P90 its p90, both
	// RTT included (0: none); the outlier detector judges against the mean, the concurrency cap against the p90.
	TTFT, Predicted, P90 time.Duration
	// Hit says the prediction counted on a prefix the engine was believed to hold.
	Hit bool
	// Waiting and Running are the engine's queue and batch as last scraped (0 when stale or unknown).
	Waiting, Running int
}

// Outcome is how an attempt ended.
type Outcome struct {
	// Err is the attempt's end as the breaker judges it: nil for success, else the attempt's error.
	Err error
	// Fault says the failure was the backend's (connection failure, 5xx, first-byte timeout, invalid
	// response), what the outlier detector counts as an error.
	Fault bool
	// Reached says the attempt produced its first content (First was called with Content).
	Reached bool
	// Lost says the attempt was cancelled in a hedged race before its first token, after waiting Waited: the
	// detector judges the wait as a lower bound of its TTFT against Predicted, so that hedging hides no slow tail.
	// (A race lost to the other attempt reads on and is judged on its real first token, with First.)
	Lost              bool
	Waited, Predicted time.Duration
}

// Permit is one attempt's hold on a backend, from admission: the breaker's permission, a concurrency slot and,
// on a backend on probation, the outlier detector's probe, taken together by Acquire; First at the attempt's
// first token feeds the cap and the detector; End gives everything back with the outcome. The order of the
// mechanisms, and when each judges, live here, so that adding a protection changes admission alone.
//
// A Permit is a value the attempt embeds (no allocation); it is used by one goroutine at a time. The zero value
// holds nothing: First and End on it do nothing.
type Permit struct {
	done    func(error) // the breaker's, until First or End
	cap     *Cap        // the slot held; nil: none (no cap, or forced past a full one)
	out     *Outlier    // the detector still to judge the attempt; nil once it has
	reserve *SeatReserve
	since   time.Time // when the slot was taken, on the reserve's clock (SeatReserve.Served)
	queue   Signaler
	retries *RetryBudget
	held    bool

	// What the fleet's Calibration measures at the first token (Claim.Wait, Waited, Serve).
	cal                 *Calibration
	class               Class
	wait, waited, serve time.Duration

	// A first token judged later, when the usage says what the engine had cached (pending): its TTFT and the
	// prediction made at dispatch, which judges it if no such usage comes.
	ttft, pred time.Duration
	pending    bool
}

// Acquire takes e's breaker permission, a concurrency slot within c.Class's limit and, for a backend on
// probation, its probe, for one attempt of a request on fleet f: all of them or none. It returns ErrCapFull
// when only the cap refused (capacity may free here) and ErrOutOfService when the breaker or the detector
// refused (pick another backend). p must hold nothing.
func (p *Permit) Acquire(e *Endpoint, f *Fleet, c Claim) error {
	var done func(error)
	if e.Breaker != nil {
		d, err := e.Breaker.Allow()
		if err != nil {
			return ErrOutOfService // open, or half-open with its probes taken
		}
		done = d
	}
	cp := e.Cap
	if cp != nil && !cp.TryAcquireFor(c.Class, c.Guard) {
		if !c.Force {
			if done != nil {
				done(ErrNotSent)
			}
			return ErrCapFull
		}
		cp.AcquirePast()
	}
	if o := e.Outlier; o != nil && !o.Acquire() {
		if done != nil {
			done(ErrNotSent)
		}
		if cp != nil {
			cp.Release()
		}
		return ErrOutOfService
	}
	*p = Permit{done: done, cap: cp, out: e.Outlier, retries: c.Retries, held: true, class: c.Class,
		wait: c.Wait, waited: c.Waited, serve: c.Serve}
	if f != nil {
		p.reserve, p.queue, p.cal = f.Reserve, f.Queue, f.Calibration
		if cp != nil && f.Reserve != nil {
			p.since = f.Reserve.Now()
		}
	}
	return nil
}

// Cancel gives back what Acquire took for an attempt that is not sent after all (the queue found the request
// too late to meet its objective): the breaker's permission (as ErrNotSent), the concurrency slot and a probe,
// with nothing judged and no completion counted for the seat reserve. p holds nothing afterwards.
func (p *Permit) Cancel() {
	if !p.held {
		return
	}
	if p.done != nil {
		p.done(ErrNotSent)
	}
	if p.cap != nil {
		p.cap.Release()
	}
	if p.out != nil {
		p.out.Observe(true, 0, 0) // neutral: frees a probe slot
	}
	q := p.queue
	*p = Permit{}
	if q != nil {
		q.Signal()
	}
}

// Held reports whether p holds an attempt (Acquire succeeded and End has not run).
func (p *Permit) Held() bool { return p.held }

// Slot reports whether p holds a concurrency slot: always once Acquire succeeded on a backend with a cap, an
// attempt forced past a full cap included (Claim.Force).
func (p *Permit) Slot() bool { return p.cap != nil }

// First records that the attempt's answer began: the cap and the detector observe its first token, the fleet's
// Calibration its predictions' errors, the breaker counts the backend's success, a retry gives back its budget
// slot, and the queue is told. Call it once, when the attempt wins (its first content is in hand, or its answer
// ended without one).
func (p *Permit) First(f *First) {
	if !p.held {
		return
	}
	if f.Content && p.cal != nil {
		p.cal.Observe(p.class, p.waited, p.wait, f.TTFT, p.serve)
		p.cal = nil
	}
	if f.Content {
		if p.cap != nil {
			p.cap.ObserveEngine(f.TTFT, f.P90, f.Waiting, f.Running)
			p.cap.ObserveScrape(f.TTFT, f.Waiting, f.Running)
		}
		if o := p.out; o != nil {
			switch {
			case f.Waiting > 0 || p.cap != nil && p.cap.Seats() > 0 && f.Running >= p.cap.Seats():
				// The engine had a queue of its own, or ran its whole batch: a late first token is the load's
				// doing (a queue, or prefills sharing steps with a full batch), which the cap and routing
				// answer; judging it made the detector eject one of four identical backends under overload (a
				// 12-13% slow share against its peers' 4%, by the luck of the queues) and cut the fleet's
				// throughput by a quarter. The attempt still counts toward the error rate.
				o.Observe(true, f.TTFT, 0)
				p.out = nil
			case f.Hit && o.State() == Serving:
				// The prediction counted on a prefix the engine may have evicted, and a miss is not slowness:
				// judge the first token when the usage says what was cached (Revised), against the prediction
				// for the prefill the engine really did. Round robin under cache pressure had a healthy
				// backend ejected on such misses. A probe is judged at once, so that probing stays quick.
				p.ttft, p.pred, p.pending = f.TTFT, f.Predicted, true
			default:
				o.Observe(true, f.TTFT, f.Predicted)
				p.out = nil
			}
		}
	}
	if p.done != nil {
		// The backend answered: that is the breaker's success (a half-open breaker closes after its probes'
		// first tokens, not after their whole streams). A stream that breaks later is not counted.
		p.done(nil)
		p.done = nil
	}
	if p.retries != nil {
		p.retries.Done()
		p.retries = nil
	}
	if p.queue != nil {
		p.queue.Signal()
	}
}

// Pending reports whether a first token waits for Revised to be judged.
func (p *Permit) Pending() bool { return p.pending }

// Revised judges a first token that First left pending, against revised, the prediction for the prefill the
// engine really did (routing.Attempt.RevisedTTFT, once the usage says what was cached). Call it when the
// usage's cached tokens arrive; without a pending first token it does nothing.
func (p *Permit) Revised(revised time.Duration) {
	if !p.pending {
		return
	}
	p.pending = false
	p.out.Observe(true, p.ttft, revised)
	p.out = nil
}

// End gives back what p holds, with the attempt's outcome: the breaker's count (unless First counted it), the
// concurrency slot (a completion for the fleet's seat reserve), the detector's judgement of an attempt it has not
// judged yet (a pending first token on the prediction made at dispatch; a failure before the first token when it
// was the backend's fault; otherwise a neutral observation that frees a probe slot), and a retry's budget slot;
// then the queue is told. p holds nothing afterwards.
func (p *Permit) End(o *Outcome) {
	if !p.held {
		return
	}
	if p.done != nil {
		p.done(o.Err)
	}
	freed := p.cap != nil // a seat freed: a completion for the critical reserve
	if freed {
		p.cap.Release()
	}
	if out := p.out; out != nil {
		switch {
		case p.pending: // no usage with cached tokens came: judge it on the prediction made at dispatch
			out.Observe(true, p.ttft, p.pred)
		case o.Lost:
			// Losing is not the backend's failure, but the time it waited without a first token is evidence of
			// its speed: the detector judges it as a lower bound of its TTFT.
			out.Observe(true, o.Waited, o.Predicted)
		case o.Fault && !o.Reached:
			out.Observe(false, 0, 0)
		case !o.Reached:
			out.Observe(true, 0, 0) // answered, or left for reasons not its own: frees a probe slot
		}
	}
	if p.retries != nil {
		p.retries.Done()
	}
	if freed && p.reserve != nil {
		p.reserve.Served(p.since)
	}
	q := p.queue
	*p = Permit{}
	if q != nil {
		q.Signal()
	}
}
