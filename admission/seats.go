package admission

import "time"

// Engine is what a Cap reads of its backend's engine to know its seats before any first token: routing.Backend
// implements it (the Monitor's last scrape). Implementations must be safe for concurrent use and cheap: the cap
// reads it on the request path.
type Engine interface {
	// EngineBatch returns the engine's last successful scrape: maxSeqs the most sequences it says it runs at
	// once (0 when it does not export that), running and waiting its batch and queue then (-1 when not
	// exported), and at the scrape's time (zero before any scrape; unchanged until the next successful one).
	EngineBatch() (maxSeqs, running, waiting int, at time.Time)
}

// engineRef boxes an Engine for an atomic.Pointer.
type engineRef struct{ e Engine }

// SeatSource says where a Cap's figure of its engine's seats came from, and so how sure it is.
type SeatSource uint8

// The sources, from the surest. An engine's own figure wins over the policy's, which wins over what the cap
// measured; each is used only while no surer one exists.
const (
	// SeatsUnknown: no figure yet. The cap starts at CapParams.Initial and grows from what the scrapes show.
	SeatsUnknown SeatSource = iota
	// SeatsEngine: the engine exports its batch limit (routing.SignalMaxSeqs). Exact.
	SeatsEngine
	// SeatsPolicy: the policy states it (backends[].max_num_seqs). Exact if the operator is right.
	SeatsPolicy
	// SeatsQueue: measured, the engine's running count while it kept requests waiting (Cap.ObserveScrape).
	SeatsQueue
	// SeatsFloor: a lower bound, the largest batch the engine ran without a queue (Cap.ObserveBatch).
	SeatsFloor
)

// String returns the source's name as /debug/backends shows it.
func (s SeatSource) String() string {
	switch s {
	case SeatsEngine:
		return "engine"
	case SeatsPolicy:
		return "policy"
	case SeatsQueue:
		return "queue"
	case SeatsFloor:
		return "probe"
	}
	return "unknown"
}

// Sure says how sure a figure from the source is: stated (the engine or the policy says so), measured (seen
// at the engine's limit), at_least (a lower bound) or none.
func (s SeatSource) Sure() string {
	switch s {
	case SeatsEngine, SeatsPolicy:
		return "stated"
	case SeatsQueue:
		return "measured"
	case SeatsFloor:
		return "at_least"
	}
	return "none"
}

// maxProbeLimit bounds how far ObserveBatch doubles an adaptive limit while the engine runs all it is sent.
const maxProbeLimit = 1 << 16

// SeatsSource returns the cap's best figure of the engine's seats and where it came from: the stated or
// measured seats (Seats), else the lower bound the scrapes found (0 with SeatsUnknown before any).
func (c *Cap) SeatsSource() (int, SeatSource) {
	c.poll()
	if s := c.stated.Load(); s > 0 {
		return int(s), SeatSource(c.statedBy.Load())
	}
	if s := c.seats.Load(); s > 0 {
		return int(s), SeatsQueue
	}
	if f := c.floor.Load(); f > 0 {
		return int(f), SeatsFloor
	}
	return 0, SeatsUnknown
}

// setEngine installs the backend's engine view and the policy's max_num_seqs (0: none). Called by
// Caps.Update.
func (c *Cap) setEngine(e Engine, maxNumSeqs int) {
	if e == nil {
		c.engine.Store(nil)
	} else {
		c.engine.Store(&engineRef{e: e})
	}
	c.policy.Store(int64(max(maxNumSeqs, 0)))
	switch {
	case SeatSource(c.statedBy.Load()) == SeatsEngine:
		// The engine's figure stands until a scrape without it.
	case maxNumSeqs > 0:
		c.state(maxNumSeqs, SeatsPolicy)
	default:
		c.unstate()
	}
}

// poll consumes the engine's newest scrape once (ObserveBatch). Lock-free: of the readers that see a new scrape,
// one claims it.
func (c *Cap) poll() {
	r := c.engine.Load()
	if r == nil {
		return
	}
	maxSeqs, running, waiting, at := r.e.EngineBatch()
	if at.IsZero() {
		return
	}
	t, last := at.UnixNano(), c.scrapeAt.Load()
	if t <= last || !c.scrapeAt.CompareAndSwap(last, t) {
		return
	}
	c.ObserveBatch(maxSeqs, running, waiting)
}

// ObserveBatch feeds one scrape of the engine: maxSeqs its batch limit as it exports it (0: not exported),
// running and waiting its batch and queue (-1: not exported). A cap with an Engine (CapConfig.Engine) calls it
// itself, once per scrape; static caps ignore it.
//
// The seats come, in order, from the engine's maxSeqs, the policy's max_num_seqs, and otherwise a probe of the
// running batch: while the engine queues nothing and runs at least half of what the cap lets through, and the
// cap is full, the engine has seats to spare, and the limit doubles (once per scrape, 100-200 ms), as TCP's
// slow start doubles per round trip, until the engine first keeps requests waiting and so shows its batch
// (ObserveScrape); the first-token rules take over from there. A slow first token does not stop the doubling,
// as it ends the first-token slow start: against a latency model that has not learned the engine yet, a
// TTFT ratio is a weaker signal than the engine running all it is sent with nothing queued (a fresh cap's
// first first tokens ended its slow start at a limit of 8 in front of 4,096 free seats). Growing one slot per good first token instead left a
// 4,096-seat engine at a limit of 9 through a 6 s burst of 15 s streams, whose first tokens came too late to
// grow it. The largest batch run without a queue is kept as a lower bound of the seats (SeatsFloor).
//
// Stated seats set the limit to seats + TargetWaiting at once, and bound it there; the TTFT rules may still
// lower it.
func (c *Cap) ObserveBatch(maxSeqs, running, waiting int) {
	if !c.Adaptive() {
		return
	}
	switch {
	case maxSeqs > 0:
		c.state(maxSeqs, SeatsEngine)
		return
	case SeatSource(c.statedBy.Load()) == SeatsEngine:
		// The engine no longer exports its figure (a restart into another version): the policy's, or none.
		if p := c.policy.Load(); p > 0 {
			c.state(int(p), SeatsPolicy)
		} else {
			c.unstate()
		}
	}
	if c.stated.Load() > 0 || running < 0 || waiting < 0 {
		return
	}
	c.batchSeen.Store(true)
	if waiting == 0 {
		c.queued.Store(0)
		for {
			f := c.floor.Load()
			if int64(running) <= f || c.floor.CompareAndSwap(f, int64(running)) {
				break
			}
		}
	} else if f := c.floor.Load(); c.seats.Load() == 0 && f > 0 && int64(running) >= f &&
		int64(running) < c.inflight.Load() {
		// The engine runs at least what it proved it runs, and keeps some of the requests sent to it waiting:
		// its batch is full. One such scrape may catch requests that arrived between two steps with seats
		// free; a second in a row (several steps later) shows a queue.
		if c.queued.Add(1) >= batchQueuedScrapes {
			c.seats.Store(int64(running))
			c.seatsAge.Store(0)
			c.seatsLow.Store(0)
		}
	} else {
		c.queued.Store(0)
	}
	if waiting != 0 || c.seats.Load() != 0 {
		return
	}
	// The limit keeps up with the provisional seats, which follow what the engine ran: requests the fleet's
	// reserve held back never fill a limit of their own, and a limit that doubled only when filled held a
	// 4,096-seat engine at 37 while its provisional seats were 69.
	l, p := c.limit.load(), float64(c.provisional())
	if float64(c.inflight.Load()) >= l-1 && float64(running) >= l/2 {
		p = max(p, 2*l)
	}
	if p > l {
		c.set(c.limit.update(func(l float64) float64 { return max(l, min(p, maxProbeLimit)) }))
	}
}

// batchQueuedScrapes is how many scrapes in a row must show the engine keeping requests waiting while it runs
// at least its proven batch (SeatsFloor) for that batch to be its seats (ObserveBatch).
const batchQueuedScrapes = 2

// provisionalGrowth is how many times the largest batch an engine ran without a queue (SeatsFloor) the
// provisional seats are, plus one (Cap.provisional). Standard requests fill the provisional seats P less what
// the fleet's reserve holds back, R, the floor follows them, and the next P is provisionalGrowth*(P-R)+1. The
// reserve is at most half the seats (SeatReserve.Seats' limit), so with 2, the factor of TCP's slow start, P
// grows in every case: by at least one a scrape when a forecast of critical demand holds half the seats that
// critical requests do not come to take, and doubling when the reserve is small next to the seats or critical
// requests take what it holds, as they do when their forecast is right. What it costs is bounded by the
// engine, not by a tuned figure: an engine whose seats are the floor gets at most floor+1 requests more than it
// runs, for the two scrapes that measure its batch (batchQueuedScrapes), and never again once they are known.
const provisionalGrowth = 2

// provisional returns the seats an adaptive cap without known seats works with while the model has critical
// demand (LimitFor, Batch): provisionalGrowth times the largest batch its engine ran without a queue
// (SeatsFloor) plus one, or CapParams.Initial if that is more, at most maxProbeLimit; 0 when the cap reads no engine
// that exports its batch and queue (then the cap's limit and CriticalReserve alone apply).
func (c *Cap) provisional() int {
	if c.static.Load() > 0 || c.stated.Load() > 0 || c.seats.Load() > 0 || !c.batchSeen.Load() {
		return 0
	}
	f := int(c.floor.Load())
	if f == 0 {
		return min(int(c.p.Initial), maxProbeLimit)
	}
	return min(max(provisionalGrowth*f+1, int(c.p.Initial)), maxProbeLimit)
}

// state installs seats stated by src, and moves the limit to them when they changed.
func (c *Cap) state(seats int, src SeatSource) {
	c.statedBy.Store(int32(src))
	if c.stated.Swap(int64(seats)) != int64(seats) {
		l := float64(seats + c.p.TargetWaiting)
		c.limit.store(l)
		c.set(l)
	}
}

// unstate drops stated seats: the cap learns them again.
func (c *Cap) unstate() {
	c.statedBy.Store(int32(SeatsUnknown))
	c.stated.Store(0)
}
