package admission

import (
	"sync"
	"testing"
	"time"
)

// fakeEngine is an Engine whose scrapes a test publishes, stamped by a virtual clock.
type fakeEngine struct {
	mu                        sync.Mutex
	clock                     *fakeClock
	maxSeqs, running, waiting int
	ceiling                   int
	at                        time.Time
}

func (e *fakeEngine) EngineCeiling() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ceiling
}

func (e *fakeEngine) EngineBatch() (int, int, int, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.maxSeqs, e.running, e.waiting, e.at
}

// scrape publishes a scrape a scrape interval after the last one.
func (e *fakeEngine) scrape(maxSeqs, running, waiting int) {
	e.clock.Advance(150 * time.Millisecond)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.maxSeqs, e.running, e.waiting, e.at = maxSeqs, running, waiting, e.clock.Now()
}

func newEngineCap(t *testing.T, maxNumSeqs int) (*Cap, *Caps, *fakeEngine) {
	t.Helper()
	e := &fakeEngine{clock: newFakeClock(), running: -1, waiting: -1}
	cs := NewCaps(CapParams{}, nil)
	cs.Update([]CapConfig{{Name: "b", MaxNumSeqs: maxNumSeqs, Engine: e}})
	return cs.Get("b"), cs, e
}

// takeAll takes slots until the cap refuses one, and returns how many it took.
func takeAll(c *Cap) int {
	n := 0
	for c.TryAcquireFor(Standard, false) {
		n++
	}
	return n
}

func TestSeatsStated(t *testing.T) {
	for _, tc := range []struct {
		name              string
		policy, engine    int
		wantSeats         int
		wantFrom          SeatSource
		wantGuardedLimits int // LimitFor(Standard, true)
	}{
		{name: "engine", engine: 4096, wantSeats: 4096, wantFrom: SeatsEngine, wantGuardedLimits: 4096},
		{name: "policy", policy: 64, wantSeats: 64, wantFrom: SeatsPolicy, wantGuardedLimits: 64},
		{name: "engine over policy", policy: 64, engine: 48, wantSeats: 48, wantFrom: SeatsEngine,
			wantGuardedLimits: 48},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, e := newEngineCap(t, tc.policy)
			e.scrape(tc.engine, 0, 0)
			if n, from := c.SeatsSource(); n != tc.wantSeats || from != tc.wantFrom {
				t.Fatalf("SeatsSource = %d, %v; want %d, %v", n, from, tc.wantSeats, tc.wantFrom)
			}
			if got := c.LimitFor(Standard, true); got != tc.wantGuardedLimits {
				t.Errorf("LimitFor(Standard, guarded) = %d, want %d (no probe seat: the seats are stated)", got,
					tc.wantGuardedLimits)
			}
			if got, want := c.Limit(), tc.wantSeats+DefaultCapParams().TargetWaiting; got != want {
				t.Errorf("Limit = %d, want seats + TargetWaiting = %d, from the first scrape", got, want)
			}
			if f, known := c.Free(); !known || f != tc.wantSeats {
				t.Errorf("Free = %d, %v; want %d, true", f, known, tc.wantSeats)
			}
			// First tokens with a queue do not relearn stated seats.
			for range 8 {
				c.ObserveScrape(time.Second, 5, 3)
			}
			if n, from := c.SeatsSource(); n != tc.wantSeats || from != tc.wantFrom {
				t.Errorf("after queued first tokens SeatsSource = %d, %v; want %d, %v", n, from, tc.wantSeats,
					tc.wantFrom)
			}
		})
	}
}

// TestCapCeiling: an engine that refuses requests past a number it holds at once (TGI's max_concurrent_requests)
// bounds every cap in front of it, static or adaptive, with seats stated or not; a scrape without the figure lifts
// the bound.
func TestCapCeiling(t *testing.T) {
	for _, tc := range []struct {
		name          string
		static, seats int // max_concurrency, the engine's stated seats
		ceiling       int
		want          int // Limit under the ceiling
	}{
		{name: "adaptive, seats unknown", ceiling: 6, want: 6},
		{name: "stated seats past it", seats: 32, ceiling: 20, want: 20},
		{name: "stated seats within it", seats: 16, ceiling: 128, want: 16 + DefaultCapParams().TargetWaiting},
		{name: "static past it", static: 500, ceiling: 128, want: 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &fakeEngine{clock: newFakeClock(), running: -1, waiting: -1}
			cs := NewCaps(CapParams{}, nil)
			cs.Update([]CapConfig{{Name: "b", MaxConcurrency: tc.static, Engine: e}})
			c := cs.Get("b")
			e.mu.Lock()
			e.ceiling = tc.ceiling
			e.mu.Unlock()
			e.scrape(tc.seats, 0, 0)
			if got := c.Limit(); got != tc.want || c.Ceiling() != tc.ceiling {
				t.Fatalf("Limit = %d, Ceiling = %d; want %d, %d", got, c.Ceiling(), tc.want, tc.ceiling)
			}
			if n := takeAll(c); n != tc.want || n > tc.ceiling {
				t.Fatalf("took %d slots under a ceiling of %d", n, tc.ceiling)
			}
			for range c.Inflight() {
				c.Release()
			}
			e.mu.Lock()
			e.ceiling = 0
			e.mu.Unlock()
			e.scrape(tc.seats, 0, 0) // restarted with the limit off, or a build that does not state it
			if c.Ceiling() != 0 || c.Limit() < tc.want {
				t.Fatalf("after a scrape without a ceiling: Limit %d, Ceiling %d", c.Limit(), c.Ceiling())
			}
		})
	}
}

func TestSeatsEngineStopsExporting(t *testing.T) {
	c, cs, e := newEngineCap(t, 32)
	e.scrape(100, 0, 0)
	if n, from := c.SeatsSource(); n != 100 || from != SeatsEngine {
		t.Fatalf("SeatsSource = %d, %v; want 100 from the engine", n, from)
	}
	e.scrape(0, 0, 0) // restarted into a version without the metric
	if n, from := c.SeatsSource(); n != 32 || from != SeatsPolicy {
		t.Fatalf("SeatsSource = %d, %v; want the policy's 32", n, from)
	}
	cs.Update([]CapConfig{{Name: "b", Engine: e}}) // the policy drops max_num_seqs
	if n, from := c.SeatsSource(); n != 0 || from != SeatsUnknown {
		t.Fatalf("SeatsSource = %d, %v; want none", n, from)
	}
}

// TestSeatsProbeDoubles: a fresh cap in front of an engine that runs everything it is sent doubles per scrape,
// so that a large engine is filled within a second or two of scrapes, not one first token at a time.
func TestSeatsProbeDoubles(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	const engineSeats = 4096
	held := 0
	var limits []int
	for range 12 {
		held += takeAll(c)
		e.scrape(0, min(held, engineSeats), max(held-engineSeats, 0))
		limits = append(limits, c.Limit())
	}
	want := []int{16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}
	for i, w := range want {
		if limits[i] != w {
			t.Fatalf("limits per scrape = %v, want %v first", limits, want)
		}
	}
	if limits[10] != 8192 || limits[11] != 8192 {
		t.Errorf("limits per scrape = %v: growth must stop once the engine keeps requests waiting", limits)
	}
	// Two scrapes in a row showed the engine running its proven 4,096 with the rest waiting: its batch.
	if n, from := c.SeatsSource(); n != engineSeats || from != SeatsQueue || from.Sure() != "measured" {
		t.Errorf("SeatsSource = %d, %v (%s); want %d, queue, measured", n, from, from.Sure(), engineSeats)
	}
}

// fillFor takes slots for class under guard until the cap refuses one, and returns how many it took.
func fillFor(c *Cap, class Class) int {
	n := 0
	for c.TryAcquireFor(class, true) {
		n++
	}
	return n
}

// TestSeatsGuardedProbe: while the model has critical demand and the engine's seats are not known, the cap
// sends at most one request past the batch the engine proved it runs (standard and sheddable ones only), one
// seat more per scrape that shows it ran them all, and learns the batch when two scrapes in a row show a queue
// with that batch running; it never doubles into the engine's queue, where a critical request would wait
// behind the requests sent before it.
func TestSeatsGuardedProbe(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	const engineSeats = 13
	e.scrape(0, 0, 0) // an idle engine that exports its batch and queue
	held, worst := 0, 0
	for range 20 {
		if n := fillFor(c, Critical); n > 0 && held+n > c.Batch() {
			t.Fatalf("critical requests filled %d past the %d seats", held+n, c.Batch())
		} else {
			held += n
		}
		held += fillFor(c, Standard)
		worst = max(worst, held-engineSeats)
		e.scrape(0, min(held, engineSeats), max(held-engineSeats, 0))
	}
	if worst > 1 {
		t.Errorf("%d requests waited in the engine at once, want at most the one probe", worst)
	}
	if n, from := c.SeatsSource(); n != engineSeats || from != SeatsQueue {
		t.Errorf("SeatsSource = %d, %v; want %d, queue", n, from, engineSeats)
	}
	if got := c.LimitFor(Standard, true); got != engineSeats {
		t.Errorf("standard may fill %d, want the %d seats", got, engineSeats)
	}
}

// TestSeatsOneQueuedScrape: one scrape with requests waiting at the proven batch (they arrived between two
// steps) does not make the batch the seats; the next scrape without a queue resets the count.
func TestSeatsOneQueuedScrape(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	e.scrape(0, 0, 0)
	held := fillFor(c, Standard) // 8 + the probe
	e.scrape(0, held, 0)         // all 9 run: floor 9
	held += fillFor(c, Standard)
	e.scrape(0, 9, 1)
	e.scrape(0, 10, 0)
	held += fillFor(c, Standard)
	e.scrape(0, 10, held-10)
	if n, from := c.SeatsSource(); from != SeatsFloor || n != 10 {
		t.Errorf("SeatsSource = %d, %v; want 10, probe: no two queued scrapes in a row", n, from)
	}
	if got := c.Batch(); got != 10 {
		t.Errorf("Batch = %d, want the provisional 10", got)
	}
}

func TestSeatsProbeHolds(t *testing.T) {
	for _, tc := range []struct {
		name             string
		running, waiting int
		fillFirst        bool
	}{
		{name: "cap not full", running: 3, waiting: 0},
		{name: "engine queues", running: 8, waiting: 3, fillFirst: true},
		{name: "engine runs few of them", running: 3, waiting: 0, fillFirst: true},
		{name: "engine exports no batch", running: -1, waiting: -1, fillFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, e := newEngineCap(t, 0)
			if tc.fillFirst {
				takeAll(c)
			} else {
				c.TryAcquire()
			}
			e.scrape(0, tc.running, tc.waiting)
			if got := c.Limit(); got != 8 {
				t.Errorf("Limit = %d, want the initial 8", got)
			}
		})
	}
}

// TestSeatsProbeOncePerScrape: the limit doubles once per scrape however often it is read.
func TestSeatsProbeOncePerScrape(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	takeAll(c)
	e.scrape(0, 8, 0)
	for range 10 {
		c.Limit()
		c.Full()
	}
	if got := c.Limit(); got != 16 {
		t.Errorf("Limit = %d, want 16", got)
	}
}

// TestSeatsProbeStopsAtTheBatch: once a queue shows the engine's batch (ObserveScrape), the scrapes no longer
// double the limit, but a slow first token alone does not stop them.
func TestSeatsProbeStopsAtTheBatch(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	takeAll(c)
	c.ObserveEngine(time.Second, 100*time.Millisecond, 0, 8) // slow, without a queue: past slow start
	takeAll(c)
	e.scrape(0, c.Inflight(), 0)
	if got := c.Limit(); got != 14 {
		t.Fatalf("Limit = %d, want 14 (7 after the decrease, doubled)", got)
	}
	takeAll(c)
	for range seatsLowEvidence {
		c.ObserveScrape(time.Second, 3, 12) // the engine runs 12 and queues the rest
	}
	if n, from := c.SeatsSource(); n != 12 || from != SeatsQueue || from.Sure() != "measured" {
		t.Fatalf("SeatsSource = %d, %v; want 12, queue", n, from)
	}
	before := c.Limit()
	e.scrape(0, 12, 0)
	if got := c.Limit(); got != before {
		t.Errorf("Limit = %d, want %d: seats measured, no more doubling", got, before)
	}
}

// TestSeatsPollDoesNotAllocate: reading the engine on the request path costs no allocation.
func TestSeatsPollDoesNotAllocate(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	if n := testing.AllocsPerRun(100, func() {
		e.scrape(0, 1, 0)
		if c.TryAcquireFor(Standard, true) {
			c.Release()
		}
		_, _ = c.SeatsSource()
	}); n != 0 {
		t.Errorf("%v allocations per acquire after a scrape, want 0", n)
	}
}

// TestSeatsProbeMargin: under critical demand with the seats not known, critical requests fill the proven
// batch and the others a probe past it, one seat while the batch is small and an eighth of it once it is large;
// provisional seats count as free seats of the fleet's reserve, the probe does not (Probe).
func TestSeatsProbeMargin(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	e.scrape(0, 0, 0)
	if f, known := c.Free(); !known || f != 8 || c.Batch() != 8 {
		t.Fatalf("after an idle scrape: batch %d, free %d (known %v); want the provisional 8, all free", c.Batch(), f, known)
	}
	if held := fillFor(c, Critical); held != 8 || fillFor(c, Standard) != 0 {
		t.Fatalf("critical requests took %d of 8 provisional seats, or standard ones more", held)
	}
	for _, tc := range []struct{ ran, critical, standard int }{
		{8, 8, 9},    // the engine ran all 8: a probe of one
		{9, 9, 10},   // small: a seat a scrape
		{15, 15, 16}, // still under 16
		{16, 16, 18}, // an eighth: 2
		{100, 100, 112},
	} {
		e.scrape(0, tc.ran, 0)
		if lc, ls := c.LimitFor(Critical, true), c.LimitFor(Standard, true); lc != tc.critical || ls != tc.standard {
			t.Errorf("after the engine ran %d: critical may fill %d, standard %d; want %d, %d", tc.ran, lc, ls,
				tc.critical, tc.standard)
		}
	}
	for range 112 - c.Inflight() {
		c.TryAcquireFor(Standard, true)
	}
	for range batchQueuedScrapes { // the probe waits, scrape after scrape: the batch is 100
		e.scrape(0, 100, 12)
		c.Limit() // the request path reads each scrape
	}
	if f, known := c.Free(); !known || f != 0 || c.Seats() != 100 {
		t.Errorf("seats measured at 100 with 112 in flight: seats %d, free %d (known %v); want 100, 0, true",
			c.Seats(), f, known)
	}
}

// TestSeatsProbePastTheReserve: below the proven batch, one request a scrape that showed nothing waiting may
// pass the fleet's reserve (the creep that lets provisional seats grow under it); at the proven batch, the probe
// past it may, up to its margin; a scrape with a queue stops the creep.
func TestSeatsProbePastTheReserve(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	if c.Probe() {
		t.Fatal("a probe before any scrape")
	}
	e.scrape(0, 0, 0)
	for range 3 {
		c.TryAcquireFor(Standard, true)
	}
	if looked, again := c.Probe(), c.Probe(); !looked || !again {
		t.Fatal("looking at the creep spent it")
	}
	if first, again := c.ClaimProbe(), c.ClaimProbe(); !first || again {
		t.Fatal("want exactly one creep past the reserve after an idle scrape")
	}
	if c.Probe() {
		t.Error("the creep is still offered once claimed")
	}
	e.scrape(0, 3, 1)
	if c.Probe() {
		t.Error("a creep after a scrape with a queue")
	}
	e.scrape(0, 3, 0)
	if !c.Probe() {
		t.Error("no creep after the next idle scrape")
	}
	for c.Inflight() < 8 {
		c.TryAcquireFor(Critical, true)
	}
	e.scrape(0, 8, 0) // all 8 run: the probe of one past them
	if first, again := c.ClaimProbe(), c.ClaimProbe(); !first || !again || !c.Probe() {
		t.Error("the probe at the proven batch is not open to every request while it lasts")
	}
	c.TryAcquireFor(Standard, true)
	if c.Probe() {
		t.Error("a probe with the probe taken")
	}
}

// TestSeatsFoundFast: a large engine's seats are found in a few seconds of scrapes under critical demand, and
// a small engine's with at most one request waiting inside it at a time.
func TestSeatsFoundFast(t *testing.T) {
	for _, tc := range []struct {
		seats, scrapes, waited int
	}{{13, 8, 1}, {64, 40, 8}, {4096, 70, 512}} {
		c, _, e := newEngineCap(t, 0)
		e.scrape(0, 0, 0)
		held, worst, n := 0, 0, 0
		for ; n < 1000; n++ {
			if _, from := c.SeatsSource(); from == SeatsQueue {
				break
			}
			held += fillFor(c, Critical) + fillFor(c, Standard)
			worst = max(worst, held-tc.seats)
			e.scrape(0, min(held, tc.seats), max(held-tc.seats, 0))
		}
		if s := c.Seats(); s != tc.seats || n > tc.scrapes || worst > tc.waited {
			t.Errorf("%d-seat engine: seats %d after %d scrapes with at most %d waiting inside it; want %d within "+
				"%d scrapes, at most %d waiting", tc.seats, s, n, worst, tc.seats, tc.scrapes, tc.waited)
		}
	}
}

// TestSeatsCriticalOnSoleEngine: on the only backend of its models, with the seats not known, a critical
// request may fill the cap's limit while the engine's last scrape showed nothing waiting (it finds a seat, or
// waits in the engine's queue behind only what was sent before it, as in the gateway's, for the same
// completion), and the probe past the proven batch once a scrape shows a queue; never less than a standard request may. Held to the proven
// batch while standard requests took the probe, critical requests waited 3-4 s in the gateway's queue through
// a spike on one 64-seat engine, and up to 0.6 s at half its load (bench/results/protect-2026-12-02-matrix.md).
// A backend that shares a model keeps critical requests to the proven batch: held in the gateway, they go to
// the first seat that frees anywhere (TestSeatsProbeMargin).
func TestSeatsCriticalOnSoleEngine(t *testing.T) {
	e := &fakeEngine{clock: newFakeClock(), running: -1, waiting: -1}
	cs := NewCaps(CapParams{}, nil)
	cs.Update([]CapConfig{{Name: "b", Engine: e, Sole: true}})
	c := cs.Get("b")
	e.scrape(0, 0, 0)
	for range 8 {
		c.TryAcquireFor(Standard, true)
	}
	e.scrape(0, 8, 0) // all 8 run with nothing waiting: the limit doubles, the probe is one past them
	if lc, ls, l := c.LimitFor(Critical, true), c.LimitFor(Standard, true), c.Limit(); lc != l || ls != 9 || l != 16 {
		t.Errorf("idle engine: critical may fill %d, standard %d, limit %d; want the limit 16, 9", lc, ls, l)
	}
	if f, _ := c.Free(); f != 0 {
		t.Errorf("Free = %d past the 8 proven seats, want 0: the fleet's reserve counts proven seats only", f)
	}
	e.scrape(0, 8, 2) // requests waiting: only the probe past the proven batch
	if lc, ls := c.LimitFor(Critical, true), c.LimitFor(Standard, true); lc != 9 || ls != 9 {
		t.Errorf("engine with a queue: critical may fill %d, standard %d; want the probe, 9 and 9", lc, ls)
	}
	for i, sc := range []struct{ running, waiting int }{{9, 0}, {9, 3}, {12, 0}, {12, 0}, {20, 1}, {20, 0}, {3, 0}, {30, 5}} {
		e.scrape(0, sc.running, sc.waiting)
		for _, guard := range []bool{true, false} {
			lc, ls, lh := c.LimitFor(Critical, guard), c.LimitFor(Standard, guard), c.LimitFor(Sheddable, guard)
			if lc < ls || ls < lh {
				t.Errorf("scrape %d (guard %v): critical may fill %d, standard %d, sheddable %d", i, guard, lc, ls, lh)
			}
		}
	}
	// Shared again (a reload added a backend to its model): the proven batch binds critical requests.
	cs.Update([]CapConfig{{Name: "b", Engine: e}})
	e.scrape(0, 30, 0)
	if lc, ls := c.LimitFor(Critical, true), c.LimitFor(Standard, true); lc != 30 || ls != 33 {
		t.Errorf("shared backend: critical may fill %d, standard %d; want the proven 30, and 33", lc, ls)
	}

	// Critical demand without end on a sole engine: its seats are found within a few scrapes, and the standard
	// requests sent after the critical ones are the first to wait inside it, a probe's worth at most.
	for _, tc := range []struct{ seats, scrapes, waited int }{{13, 8, 1}, {64, 40, 8}, {4096, 70, 512}} {
		e := &fakeEngine{clock: newFakeClock(), running: -1, waiting: -1}
		cs := NewCaps(CapParams{}, nil)
		cs.Update([]CapConfig{{Name: "b", Engine: e, Sole: true}})
		c := cs.Get("b")
		e.scrape(0, 0, 0)
		held, worst, n := 0, 0, 0
		for ; n < 1000; n++ {
			if _, from := c.SeatsSource(); from == SeatsQueue {
				break
			}
			held += fillFor(c, Critical)
			std := fillFor(c, Standard)
			held += std
			worst = max(worst, min(std, held-tc.seats))
			e.scrape(0, min(held, tc.seats), max(held-tc.seats, 0))
		}
		if s := c.Seats(); s != tc.seats || n > tc.scrapes || worst > tc.waited {
			t.Errorf("sole %d-seat engine: seats %d after %d scrapes with at most %d standard requests waiting "+
				"inside it; want %d within %d scrapes, at most %d waiting", tc.seats, s, n, worst, tc.seats,
				tc.scrapes, tc.waited)
		}
	}
}

// peerEngine is a fakeEngine whose backend's peers agree on some seats (PeerEngine).
type peerEngine struct {
	*fakeEngine
	peers, floor int
}

func (e *peerEngine) PeerSeats() (int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peers, e.floor
}

func (e *peerEngine) setPeers(seats, floor int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.peers, e.floor = seats, floor
}

// newPeerCap returns an adaptive cap reading a peerEngine, with the policy's max_num_seqs (0: none).
func newPeerCap(policy int) (*Cap, *peerEngine) {
	e := &peerEngine{fakeEngine: &fakeEngine{clock: newFakeClock(), running: -1, waiting: -1}}
	cs := NewCaps(CapParams{}, nil)
	cs.Update([]CapConfig{{Name: "b", MaxNumSeqs: policy, Engine: e}})
	return cs.Get("b"), e
}

// TestSeatsFromPeers: a cap that knows no seats of its own takes those its backend's peers agree on, with its
// limit at once; it drops them when the peers do or when its engine has run more; its own measure at a queue
// replaces them, and a stated figure wins. Routing is told the cap's own lower bound, not the peers' figure.
func TestSeatsFromPeers(t *testing.T) {
	t.Run("adopted", func(t *testing.T) {
		c, e := newPeerCap(0)
		e.setPeers(16, 0)
		e.scrape(0, 3, 0)
		if n, from := c.SeatsSource(); n != 16 || from != SeatsPeers {
			t.Fatalf("SeatsSource = %d, %v; want 16, peers", n, from)
		}
		if n, exact := c.MeasuredSeats(); n != 3 || exact {
			t.Errorf("MeasuredSeats = %d, %v; want its own lower bound 3, not exact", n, exact)
		}
		if got := c.LimitFor(Critical, true); got != 16 {
			t.Errorf("LimitFor(Critical) = %d, want the 16 seats (a fresh cap's limit is %v)", got, CapParams{}.withDefaults().Initial)
		}
		e.setPeers(0, 0)
		e.scrape(0, 3, 0)
		if n, from := c.SeatsSource(); n != 3 || from != SeatsFloor {
			t.Errorf("after the peers' figure went: SeatsSource = %d, %v; want 3, probe", n, from)
		}
	})
	t.Run("its engine ran more", func(t *testing.T) {
		c, e := newPeerCap(0)
		held := fillFor(c, Standard)
		e.scrape(0, held, 0) // its floor
		e.setPeers(held-1, 0)
		e.scrape(0, held, 0)
		if n, from := c.SeatsSource(); from != SeatsFloor || n != held {
			t.Errorf("SeatsSource = %d, %v; want its floor %d, probe", n, from, held)
		}
	})
	t.Run("its own queue replaces them", func(t *testing.T) {
		c, e := newPeerCap(0)
		e.setPeers(16, 0)
		e.scrape(0, 0, 0)
		held := fillFor(c, Critical)
		for range 2 { // the most it ever ran, and a queue: twice in a row, its batch is 12
			e.scrape(0, 12, held-12)
			c.Seats() // the cap reads each scrape
		}
		if n, from := c.SeatsSource(); n != 12 || from != SeatsQueue {
			t.Fatalf("SeatsSource = %d, %v; want 12, queue (held %d)", n, from, held)
		}
		e.scrape(0, 12, 2)
		if n, from := c.SeatsSource(); n != 12 || from != SeatsQueue {
			t.Errorf("after another scrape: SeatsSource = %d, %v; want its own 12", n, from)
		}
		if n, exact := c.MeasuredSeats(); n != 12 || !exact {
			t.Errorf("MeasuredSeats = %d, %v; want 12, exact", n, exact)
		}
	})
	t.Run("stated wins", func(t *testing.T) {
		c, e := newPeerCap(8)
		e.setPeers(16, 0)
		e.scrape(0, 3, 0)
		if n, from := c.SeatsSource(); n != 8 || from != SeatsPolicy {
			t.Errorf("SeatsSource = %d, %v; want 8, policy", n, from)
		}
	})
}

// TestSeatsProbeFromPeersBatch: while no seats are known, a replica's provisional seats start at the largest
// batch any of its peers ran, and its limit with them; its own batch still decides once it is larger.
func TestSeatsProbeFromPeersBatch(t *testing.T) {
	c, e := newPeerCap(0)
	e.scrape(0, 3, 0)
	if got, want := c.Batch(), int((CapParams{}).withDefaults().Initial); got != want {
		t.Fatalf("Batch = %d before the peers ran anything, want Initial", got)
	}
	e.setPeers(0, 16)
	e.scrape(0, 3, 0)
	if got := c.Batch(); got != 16 {
		t.Errorf("Batch = %d, want the peers' 16", got)
	}
	held := fillFor(c, Standard)
	if held != 16+probeMargin(16) {
		t.Errorf("standard requests let through: %d, want 16 and the probe's %d", held, probeMargin(16))
	}
	for range held {
		c.Release()
	}
	if n, from := c.SeatsSource(); from != SeatsFloor || n != 3 {
		t.Errorf("SeatsSource = %d, %v; want its own 3, probe: the peers' batch is not its seats", n, from)
	}
	// The first-token rules keep their say between two growths of the peers' batch.
	c.limit.store(5)
	e.scrape(0, 3, 0)
	if got := c.Limit(); got != 5 {
		t.Errorf("limit %d after a scrape with the same peers' batch, want the 5 it was lowered to", got)
	}
	e.setPeers(0, 20)
	e.scrape(0, 3, 0)
	if got, want := c.Limit(), 20+probeMargin(20); got != want {
		t.Errorf("limit %d once the peers' batch grew to 20, want %d", got, want)
	}
}

// probedEngine is a fakeEngine with a seat probe's result (ProbedEngine).
type probedEngine struct {
	*fakeEngine
	seats int
	exact bool
	at    time.Time
}

func (e *probedEngine) ProbedSeats() (int, bool, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seats, e.exact, e.at
}

func (e *probedEngine) probed(seats int, exact bool) {
	e.mu.Lock()
	e.seats, e.exact, e.at = seats, exact, e.clock.Now()
	e.mu.Unlock()
}

// TestSeatsFromAProbe: a seat probe's exact figure is the cap's own measure from the next scrape on (the seats a
// critical request may fill, the limit, what routing is told), a lower bound raises the provisional seats
// instead, and a stated figure wins over both.
func TestSeatsFromAProbe(t *testing.T) {
	newCap := func(policy int) (*Cap, *probedEngine) {
		e := &probedEngine{fakeEngine: &fakeEngine{clock: newFakeClock(), running: -1, waiting: -1}}
		cs := NewCaps(CapParams{}, nil)
		cs.Update([]CapConfig{{Name: "b", MaxNumSeqs: policy, Engine: e}})
		return cs.Get("b"), e
	}
	t.Run("exact", func(t *testing.T) {
		c, e := newCap(0)
		e.scrape(0, 0, 0)
		if n, from := c.SeatsSource(); n != 0 || from != SeatsUnknown {
			t.Fatalf("before the probe: %d, %v", n, from)
		}
		e.probed(40, true)
		e.scrape(0, 2, 0)
		if n, from := c.SeatsSource(); n != 40 || from != SeatsQueue {
			t.Fatalf("after the probe: SeatsSource = %d, %v; want 40, queue", n, from)
		}
		if n, exact := c.MeasuredSeats(); n != 40 || !exact {
			t.Errorf("MeasuredSeats = %d, %v; want 40, exact", n, exact)
		}
		if lc, ls, l := c.LimitFor(Critical, true), c.LimitFor(Standard, true), c.Limit(); lc != 40 || ls != 40 || l < 40 {
			t.Errorf("critical may fill %d, standard %d, limit %d; want 40, 40 and at least 40", lc, ls, l)
		}
		if f, known := c.Free(); f != 40 || !known {
			t.Errorf("Free = %d, %v; want 40 known", f, known)
		}
		// The same probe is taken once: a measure the cap makes later stands.
		c.ObserveScrape(time.Second, 3, 36)
		c.ObserveScrape(time.Second, 3, 36)
		for range seatsLowEvidence {
			c.ObserveScrape(time.Second, 3, 36)
		}
		e.scrape(0, 36, 3)
		if n, _ := c.SeatsSource(); n != 36 {
			t.Errorf("after a queue at 36 and a scrape with the old probe: %d seats, want 36", n)
		}
	})
	t.Run("lower bound", func(t *testing.T) {
		c, e := newCap(0)
		e.scrape(0, 0, 0)
		e.probed(1024, false)
		e.scrape(0, 0, 0)
		if n, from := c.SeatsSource(); n != 1024 || from != SeatsFloor {
			t.Fatalf("SeatsSource = %d, %v; want 1024, probe", n, from)
		}
		if lc, ls := c.LimitFor(Critical, true), c.LimitFor(Standard, true); lc != 1024 || ls != 1024+1024/probeShare {
			t.Errorf("critical may fill %d, standard %d; want the 1024 ran and a probe past them", lc, ls)
		}
	})
	t.Run("stated wins", func(t *testing.T) {
		c, e := newCap(16)
		e.probed(40, true)
		e.scrape(0, 0, 0)
		if n, from := c.SeatsSource(); n != 16 || from != SeatsPolicy {
			t.Errorf("SeatsSource = %d, %v; want the policy's 16", n, from)
		}
	})
}
