package proxy

import (
	"math"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// The request path reads per-backend and per-model state through records resolved once per policy snapshot
// (Server.follow), not through registries keyed by name: a request finds its model's record once, and every
// pick and attempt after that follows pointers. The state the records point to (breakers, caps, outlier
// detectors, queues, reserves, budgets) outlives reloads; a record is rebuilt, never changed, when a snapshot is
// installed, and requests that started on the previous one keep theirs to the end.

// endpoint is one backend with its protections. It is shared by every model the backend serves.
type endpoint struct {
	b       *routing.Backend
	guards  admission.Endpoint // breaker, concurrency cap, outlier detector: what a Permit acquires
	ends    *streamEnds        // switchyard_stream_ends_total's children for this backend (streamend.go)
	backend backendChildren    // the per-backend histograms' children (children.go)
	kids    childSet           // the GenAI series of its successful requests (children.go)
}

// modelRec is one model of a snapshot with what its backends share. ends[i] guards m.Targets[i].
type modelRec struct {
	m       *Model
	ends    []*endpoint
	queue   *admission.Queue[*exchange]
	reserve *admission.SeatReserve
	hedges  *admission.HedgeBudget
	fleet   admission.Fleet // reserve, queue and calibration, as a Permit reports to them
	degrade *modelRec       // m.DegradeTo's record; nil when it has none
	yield   *yielders       // the streams that may yield their seat (m.Preempt); nil without preempt
	// resumeBy is the standard class's objective for a first token (m.SLO.TTFT times its slo_factor), the longest
	// a standard stream that yields may expect to wait for its seat back (standardMayYield); 0: none.
	resumeBy time.Duration
}

// endpointOf returns the record of b, the backend of one of r's targets, or nil for another backend (a linear
// scan of pointers: a model has a handful of backends).
func (r *modelRec) endpointOf(b *routing.Backend) *endpoint {
	for _, e := range r.ends {
		if e.b == b {
			return e
		}
	}
	return nil
}

// fleetSeats returns the engine seats free and in all over r's backends that the seat reserve counts, and how
// many backends those are: the available ones (outlier detector), healthy and with a batch size their cap knows
// or holds (Cap.Free). A request's choice (exchange.chooseFrom) and /debug/models count them here.
func (r *modelRec) fleetSeats() (free, seats, counted int) {
	for _, e := range r.ends {
		g := &e.guards
		if o := g.Outlier; o != nil && !o.Available() {
			continue
		}
		if c := g.Cap; c != nil && e.b.Healthy() {
			if f, known := c.Free(); known {
				free, seats, counted = free+f, seats+c.Batch(), counted+1
			}
		}
	}
	return free, seats, counted
}

// standardMayYield reports whether a standard stream of r's model may give its seat to a critical request now,
// need seats being wanted by critical requests (those waiting less the yields under way, the asker's included): if
// it may expect a seat back (admission.SeatReserve.ResumeWait, over the seats fleetSeats counts) within its class's
// objective for a first token (resumeBy), the pause its class is promised at most; without an objective, while
// critical demand leaves any completions to it. While no completion is known, it may.
func (r *modelRec) standardMayYield(need int) bool {
	if r == nil || r.reserve == nil {
		return true
	}
	_, seats, _ := r.fleetSeats()
	wait, ok := r.reserve.ResumeWait(need, seats)
	switch {
	case !ok:
		return true
	case r.resumeBy > 0:
		return wait <= r.resumeBy
	}
	return wait < time.Duration(math.MaxInt64)
}

// resolved is a snapshot with its records.
type resolved struct {
	snap   *Snapshot
	models map[*Model]*modelRec // every model the snapshot names, degrade_to models included
}

// resolve builds the records of snap. The caps and outlier detectors must hold snap's backends already.
func (s *Server) resolve(snap *Snapshot) *resolved {
	ends := make(map[*routing.Backend]*endpoint, len(snap.Backends))
	endOf := func(b *routing.Backend) *endpoint {
		if e := ends[b]; e != nil {
			return e
		}
		e := &endpoint{b: b, guards: admission.Endpoint{Breaker: s.brk.get(b), Cap: s.caps.Get(b.Name()),
			Outlier: s.outliers.Get(b.Name())}, ends: newStreamEnds(s.m.StreamEnds, b.Name()),
			backend: newBackendChildren(s.m, b.Name())}
		ends[b] = e
		return e
	}
	res := &resolved{snap: snap, models: make(map[*Model]*modelRec, len(snap.Models))}
	var recOf func(m *Model) *modelRec
	recOf = func(m *Model) *modelRec {
		if r := res.models[m]; r != nil {
			return r
		}
		r := &modelRec{m: m, ends: make([]*endpoint, len(m.Targets)), queue: s.queueFor(m.Name, snap),
			reserve: s.reserveFor(m.Name), hedges: s.hedgeBudget(m)}
		r.fleet = admission.Fleet{Reserve: r.reserve, Queue: r.queue, Calibration: s.calibrationFor(m.Name)}
		if m.Preempt {
			r.yield = s.yieldersFor(m.Name)
			r.resumeBy = m.SLO.TTFT
			if snap.Shedder != nil {
				r.resumeBy = snap.Shedder.Objective(admission.Standard, m.SLO.TTFT)
			}
		}
		for i, t := range m.Targets {
			r.ends[i] = endOf(t.Backend)
		}
		res.models[m] = r
		if m.DegradeTo != nil {
			r.degrade = recOf(m.DegradeTo)
		}
		return r
	}
	for _, m := range snap.Models {
		recOf(m)
	}
	return res
}
