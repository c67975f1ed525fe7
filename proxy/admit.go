package proxy

import (
	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// follow installs a new policy snapshot's backends and models into the admission state that outlives reloads
// (concurrency caps and outlier detectors keep what they learned for backends that stay, and the queues of
// models that went away are closed: their waiters get 503 shutting_down), and resolves the snapshot's records
// (records.go). Each request calls it; it is a pointer comparison unless the snapshot changed.
func (s *Server) follow(snap *Snapshot) *resolved {
	if r := s.followed.Load(); r != nil && r.snap == snap {
		return r
	}
	s.followMu.Lock()
	defer s.followMu.Unlock()
	if r := s.followed.Load(); r != nil && r.snap == snap {
		return r
	}
	caps := make([]admission.CapConfig, 0, len(snap.Backends))
	names := make([]string, 0, len(snap.Backends))
	shared := map[*routing.Backend]bool{} // serves a model with other backends
	for _, m := range snap.Models {
		for _, t := range m.Targets {
			shared[t.Backend] = shared[t.Backend] || len(m.Targets) > 1
		}
	}
	for _, b := range snap.Backends {
		c := b.Config()
		caps = append(caps, admission.CapConfig{Name: c.Name, MaxConcurrency: c.MaxConcurrency,
			MaxNumSeqs: c.MaxNumSeqs, Engine: b, Sole: !shared[b]})
		names = append(names, c.Name)
	}
	s.caps.Update(caps)
	for _, b := range snap.Backends {
		// Routing counts a backend whose seats are all taken as saturated and prices the wait for one; the cap
		// measures the seats of an engine that states none.
		if c := s.caps.Get(b.Config().Name); c != nil {
			b.SetSeatMeter(c)
		}
	}
	s.outliers.Update(names)
	s.queues.Range(func(k, v any) bool {
		if snap.Models[k.(string)] == nil {
			s.queues.Delete(k)
			v.(*admission.Queue[*exchange]).Close()
		}
		return true
	})
	r := s.resolve(snap)
	s.followed.Store(r)
	return r
}

// queueFor returns the gateway queue of a model, creating it on first use with snap's size. Queues outlive
// reloads (a reload does not drop waiters); their size is the one in force when they were created.
func (s *Server) queueFor(model string, snap *Snapshot) *admission.Queue[*exchange] {
	if q, ok := s.queues.Load(model); ok {
		return q.(*admission.Queue[*exchange])
	}
	size := admission.DefaultQueueSize
	if snap.Queue.Size > 0 {
		size = snap.Queue.Size
	}
	q := admission.NewQueue(admission.QueueConfig[*exchange]{
		Name: model, Size: size, Dispatch: dispatchQueued, Metrics: s.m, Clock: s.clock,
	})
	if prev, loaded := s.queues.LoadOrStore(model, q); loaded {
		q.Close()
		return prev.(*admission.Queue[*exchange])
	}
	return q
}

// closeQueues answers every queued request (the gateway is stopping).
func (s *Server) closeQueues() {
	s.queues.Range(func(k, v any) bool {
		v.(*admission.Queue[*exchange]).Close()
		return true
	})
}

// hedgeBudget returns the hedge budget of a model (its share of requests that may be hedged).
func (s *Server) hedgeBudget(m *Model) *admission.HedgeBudget {
	if b, ok := s.hedges.Load(m.Name); ok {
		return b.(*admission.HedgeBudget)
	}
	pct := m.Hedge.BudgetPercent
	if pct <= 0 {
		pct = 5
	}
	b, _ := s.hedges.LoadOrStore(m.Name, admission.NewHedgeBudget(pct, 3, s.m))
	return b.(*admission.HedgeBudget)
}

// reserveFor returns the seats a model's fleet keeps free for critical requests (admission.SeatReserve).
func (s *Server) reserveFor(model string) *admission.SeatReserve {
	if r, ok := s.reserves.Load(model); ok {
		return r.(*admission.SeatReserve)
	}
	r, _ := s.reserves.LoadOrStore(model, admission.NewSeatReserve(nil))
	return r.(*admission.SeatReserve)
}

// calibrationFor returns the measured error of a model's TTFT predictions for admission (admission.Calibration).
func (s *Server) calibrationFor(model string) *admission.Calibration {
	if c, ok := s.cals.Load(model); ok {
		return c.(*admission.Calibration)
	}
	c, _ := s.cals.LoadOrStore(model, admission.NewCalibration())
	return c.(*admission.Calibration)
}

// measure fills c, the claim of a request's first attempt, with what the fleet's Calibration measures at its
// first token: the wait the request was admitted on and the time it waited, and routing's p90 for the backend
// just picked. Retries and hedges are not measured (admission.Claim), nor requests not judged on a prediction.
func (ex *exchange) measure(c *admission.Claim) {
	if !ex.judged || ex.attempts > 0 {
		return
	}
	c.Wait, c.Waited, c.Serve = ex.wait, ex.s.clock.Now().Sub(ex.arrival), ex.rreq.Decision().TTFT
}

// tooLate is the queue's last check on a waiting request whose attempt Dispatch just picked and claimed
// (admission.Shedder.TooLate): when its first token can no longer come within its objective, the claim is given
// back and the request is refused now (ErrQueueTimeout) rather than dispatched to miss. A stream waiting to
// resume after it yielded its seat (yield.go) had its first token long ago: it is never too late.
func (ex *exchange) tooLate(a *attempt) error {
	snap := ex.snap
	if ex.resuming || snap.Shedder == nil || !snap.Shedder.TooLate(ex.class, ex.model.SLO.TTFT,
		ex.s.clock.Now().Sub(ex.arrival), ex.rreq.Decision().TTFT, ex.rec.fleet.Calibration) {
		return nil
	}
	a.permit.Cancel()
	a.unhold()
	return admission.ErrQueueTimeout
}

// refusedLate tells the Calibration that a request admitted on an expected wait was refused in the queue (its
// deadline passed, or tooLate refused it): it waited at least as long as it did.
func (ex *exchange) refusedLate() {
	if ex.judged {
		ex.rec.fleet.Calibration.Late(ex.class, ex.wait, ex.s.clock.Now().Sub(ex.arrival))
	}
}

// pool measures a model's backends for brownout and shedding: the mean saturation S over its healthy backends
// (engine queue, KV use and concurrency cap, admission.Saturation) and whether all are saturated.
func pool(r *modelRec, saturated bool) admission.Pool {
	var meter admission.PoolMeter
	healthy, full := 0, 0
	for i, t := range r.m.Targets {
		b := t.Backend
		if !b.Healthy() {
			continue
		}
		healthy++
		waiting, kv := 0, 0.0
		if es := b.Engine(); es != nil && !es.Stale {
			waiting, kv = int(es.Waiting), es.KVUsage
		}
		inflight, limit := int(b.Inflight()), 0
		if c := r.ends[i].guards.Cap; c != nil {
			inflight, limit = c.Inflight(), c.LimitFor(admission.Critical, true)
			if c.Full() {
				full++
			}
		}
		meter.Add(admission.Saturation(waiting, kv, inflight, limit))
	}
	return admission.Pool{Saturation: meter.S(), Saturated: saturated || healthy == 0 || full == healthy}
}

// A backend's cap takes the seats its peers agree on while it knows none of its own (admission.PeerEngine).
var _ admission.PeerEngine = (*routing.Backend)(nil)
