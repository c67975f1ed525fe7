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
	// EngineCeiling returns the most requests the engine holds at once, running and queued, before it refuses
	// new ones (TGI's max_concurrent_requests), as its last successful scrape says; 0 when it states none.
	EngineCeiling() int
}

// PeerEngine is an Engine that also knows the seats its backend's peers agree on (routing.Backend: replicas of
// one deployment, routing/peerseats.go). A cap that knows no seats of its own takes those (adoptPeers).
type PeerEngine interface {
	Engine
	// PeerSeats returns seats, the figure the backend's peers that know theirs agree on (0 when none do, they
	// disagree, or one of them ran more at once), and floor, the largest batch any of them ran (0: none yet).
	PeerSeats() (seats, floor int)
}

// ProbedEngine is an Engine whose seats a burst of the gateway's own requests measured before any load showed
// them (routing.Backend: the Monitor's seat probe, routing/seatprobe.go). A cap that knows no seats takes the
// probe's figure as its own measure (adoptProbe).
type ProbedEngine interface {
	Engine
	// ProbedSeats returns what the last seat probe found: seats, the engine's batch limit when exact, else a
	// lower bound (the most it ran with nothing of the probe waiting); at, when the probe ended (zero: none).
	ProbedSeats() (seats int, exact bool, at time.Time)
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
	// SeatsQueue: measured, the engine's running count while it kept requests waiting (Cap.ObserveScrape),
	// its own traffic's or a seat probe's (ProbedEngine).
	SeatsQueue
	// SeatsFloor: a lower bound, the largest batch the engine ever ran (Cap.ObserveBatch).
	SeatsFloor
	// SeatsPeers: what the backend's peers (replicas of one deployment) measured or state, taken while the cap
	// knows none of its own (PeerEngine). Replaced by the cap's own measure at its first queue.
	SeatsPeers
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
	case SeatsPeers:
		return "peers"
	}
	return "unknown"
}

// Sure says how sure a figure from the source is: stated (the engine or the policy says so), measured (seen
// at the engine's limit), at_least (a lower bound) or none.
func (s SeatSource) Sure() string {
	switch s {
	case SeatsEngine, SeatsPolicy:
		return "stated"
	case SeatsQueue, SeatsPeers:
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
		if c.fromPeers.Load() {
			return int(s), SeatsPeers
		}
		return int(s), SeatsQueue
	}
	if f := c.floor.Load(); f > 0 {
		return int(f), SeatsFloor
	}
	return 0, SeatsUnknown
}

// MeasuredSeats returns what the cap knows of its own engine's seats, for routing (routing.SeatMeter): the
// seats, and whether they are the engine's limit (stated, or measured at its queue) rather than the largest batch
// it ran (a lower bound). Seats taken from peers count as the lower bound: routing has the peers' figure already,
// and a member must not vouch for its peers' figure as its own.
func (c *Cap) MeasuredSeats() (seats int, exact bool) {
	n, src := c.SeatsSource()
	if src == SeatsPeers {
		return int(c.floor.Load()), false
	}
	return n, src != SeatsFloor && src != SeatsUnknown
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
	c.refuseAt.Store(int64(max(r.e.EngineCeiling(), 0)))
	c.ObserveBatch(maxSeqs, running, waiting)
	if pe, ok := r.e.(ProbedEngine); ok {
		if seats, exact, at := pe.ProbedSeats(); !at.IsZero() && c.probedAt.Swap(at.UnixNano()) != at.UnixNano() {
			c.adoptProbe(seats, exact)
		}
	}
	if pe, ok := r.e.(PeerEngine); ok {
		c.adoptPeers(pe.PeerSeats())
	}
}

// adoptProbe takes what a seat probe found (ProbedEngine), once per probe: the batch it ran is a lower bound
// of the seats (the floor), and an exact figure is the cap's own measure, as a queue of its own traffic would
// have shown it (SeatsQueue), with the limit moved to it as stated seats move it. Seats stated by the engine or
// the policy win, as over any measure.
func (c *Cap) adoptProbe(seats int, exact bool) {
	if seats <= 0 || !c.Adaptive() {
		return
	}
	c.raiseFloor(int64(seats))
	if c.stated.Load() > 0 {
		return
	}
	if !exact {
		// The provisional seats start at the batch it ran, and the limit with them (as a peer's batch does).
		p := float64(seats + probeMargin(seats))
		c.set(c.limit.update(func(l float64) float64 { return max(l, min(p, maxProbeLimit)) }))
		return
	}
	c.seats.Store(int64(seats))
	c.fromPeers.Store(false)
	c.seatsAge.Store(0)
	c.seatsLow.Store(0)
	c.queued.Store(0)
	tw := float64(c.p.TargetWaiting)
	c.set(c.limit.update(func(l float64) float64 { return max(l, float64(seats)+tw) }))
}

// raiseFloor raises the largest batch the engine ran (the floor) to n, and reports whether it was higher
// than a batch proven before (not the first figure).
func (c *Cap) raiseFloor(n int64) (grew bool) {
	for {
		f := c.floor.Load()
		if n <= f {
			return false
		}
		if c.floor.CompareAndSwap(f, n) {
			return f > 0
		}
	}
}

// adoptPeers takes the seats the backend's peers agree on (peers; 0: none) while the cap knows none of its own,
// and follows them while they are what it knows: replicas of one deployment have one batch limit, and one
// replica's first queue then spares the others theirs (a spike's first queue on each of four engines found
// their seats one by one). The cap's own measure replaces them (ObserveScrape, ObserveBatch), and so does a
// batch past them (the floor): the peers' figure is then not this engine's, and the routing group drops it.
//
// The peers' batch (floor, the most any of them ran) is a lower bound of this replica's seats too: its
// provisional seats start there, and its limit with them.
func (c *Cap) adoptPeers(peers, floor int) {
	grew := int64(floor) > c.peerFloor.Swap(int64(max(floor, 0)))
	if !c.Adaptive() || c.stated.Load() > 0 {
		return
	}
	// The limit follows the peers' batch when it grows, once: between two growths the first-token rules keep
	// their say (raised at every scrape, it undid their decreases, and an owner of many conversations, ejected
	// as slow, lost them).
	if pr := c.provisional(); grew && pr > 0 && int64(pr) > c.floor.Load() {
		p := float64(pr + probeMargin(pr))
		c.set(c.limit.update(func(l float64) float64 { return max(l, p) }))
	}
	cur := c.seats.Load()
	switch {
	case cur > 0 && !c.fromPeers.Load():
		return // its own measure
	case peers <= 0 || int64(peers) < c.floor.Load():
		if cur > 0 && c.seats.CompareAndSwap(cur, 0) {
			c.fromPeers.Store(false)
			c.seatsAge.Store(SeatsTTL)
		}
	case int64(peers) != cur && c.seats.CompareAndSwap(cur, int64(peers)):
		c.fromPeers.Store(true)
		c.seatsAge.Store(0)
		c.seatsLow.Store(0)
		// As stated seats do (state), the limit goes to them at once: a fresh cap's limit (Initial) would hold
		// a 16-seat replica at 8 while its peers run 16.
		tw := float64(c.p.TargetWaiting)
		c.set(c.limit.update(func(l float64) float64 { return max(l, float64(peers)+tw) }))
	}
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
	c.idle.Store(waiting == 0)
	// Whatever the engine ran at once it has seats for, queue or not: the floor is the most it ever ran. A
	// floor raised only by scrapes without a queue stood still at 8 through a burst of 200 requests/s, whose
	// arrivals between two steps had some waiting at nearly every scrape.
	grew := c.raiseFloor(int64(running))
	switch f := c.floor.Load(); {
	case waiting == 0 || grew:
		c.queued.Store(0)
	case (c.seats.Load() == 0 || c.fromPeers.Load()) && f > 0 && int64(running) == f && int64(running) < c.inflight.Load():
		// The engine runs the most it ever ran, no more, and keeps some of the requests sent to it waiting:
		// its batch is full. One such scrape may catch requests that arrived between two steps with seats
		// free; a second in a row (several steps later) shows a queue.
		if c.queued.Add(1) >= batchQueuedScrapes {
			c.seats.Store(int64(running))
			c.fromPeers.Store(false)
			c.seatsAge.Store(0)
			c.seatsLow.Store(0)
		}
	default:
		c.queued.Store(0)
	}
	if (waiting != 0 && !grew) || c.seats.Load() != 0 {
		return
	}
	// The limit keeps up with the provisional seats and their probe, which follow what the engine ran:
	// requests held back under critical demand never fill a limit of their own, and a limit that doubled only
	// when filled held a 4,096-seat engine at 37 while the engine had proved more.
	l := c.limit.load()
	p := float64(0)
	if pr := c.provisional(); pr > 0 && running >= pr {
		p = float64(pr + probeMargin(pr))
	}
	if float64(c.inflight.Load()) >= l-1 && float64(running) >= l/2 {
		p = max(p, 2*l)
	}
	if p > l {
		c.set(c.limit.update(func(l float64) float64 { return max(l, min(p, maxProbeLimit)) }))
	}
}

// batchQueuedScrapes is how many scrapes in a row must show the engine keeping requests waiting while it runs
// its proven batch (SeatsFloor), no more, for that batch to be its seats (ObserveBatch).
const batchQueuedScrapes = 2

// probeShare is the share of the proven batch (SeatsFloor) that standard and sheddable requests may be sent
// past it, at least one seat, while the engine's seats are not known and the model has critical demand
// (Cap.LimitFor): the probe that finds the seats. Its cost is bounded relative to the engine: if the proven
// batch was the whole batch, the probe's requests wait inside the engine for as many completions, an eighth of
// a batch's time; small engines (a proven batch under 16) probe one seat at a time, as a probe of one request
// costs them a single completion. Its benefit: the proven batch grows by an eighth a scrape once it is 16, so a
// 4,096-seat engine is found in a few seconds of scrapes (one seat a scrape took minutes), and it never stalls
// under the fleet's reserve, which counts known seats only (Cap.Free). Doubling instead (TCP's slow start) put
// up to a batch of standard requests in first-come-first-served engine queues: critical p99 first tokens of
// 1.7-1.9 s (15x unloaded) in the protect matrix's n4/s16 and n8/s8 cells at 2x, against 0.3-0.6 s with one seat.
const probeShare = 8

// probeMargin returns how many requests past a proven batch of floor the probe sends (probeShare).
func probeMargin(floor int) int { return max(1, floor/probeShare) }

// provisional returns the seats an adaptive cap without known seats works with while the model has critical
// demand (LimitFor, Batch): the largest batch its engine, or any of its peers (PeerEngine: replicas of one
// deployment, whose seats are one figure), ever ran, or CapParams.Initial if that is more; 0 when the cap reads
// no engine that exports its batch and queue (then the cap's limit and CriticalReserve alone apply). The peers'
// batch lets each replica's probe start where the furthest one got: four replicas probing a seat at a time each
// found 16 seats in 4-7 s (protect-overload). A replica with fewer seats than its peers' batch queues at its own
// and so measures them (ObserveBatch).
func (c *Cap) provisional() int {
	if c.static.Load() > 0 || c.stated.Load() > 0 || c.seats.Load() > 0 || !c.batchSeen.Load() {
		return 0
	}
	return min(max(int(c.floor.Load()), int(c.peerFloor.Load()), int(c.p.Initial)), maxProbeLimit)
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
