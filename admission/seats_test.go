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
	at                        time.Time
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
	want := []int{17, 35, 71, 143, 287, 575, 1151, 2303, 4607, 4607} // twice what ran, and one (provisionalGrowth)
	for i, w := range want {
		if limits[i] != w {
			t.Fatalf("limits per scrape = %v, want %v first", limits, want)
		}
	}
	if limits[10] != 4607 || limits[11] != 4607 {
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
// sends at most twice the batch the engine proved it runs, doubling per scrape that shows it ran them all, and
// learns the batch when two scrapes in a row show a queue with that batch running: the engine's queue holds at
// most the batch proven before it, once.
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
	if worst > 8 {
		t.Errorf("%d requests waited in the engine at once, want at most the 8 proven before the queue", worst)
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
	if got := c.Batch(); got != 21 {
		t.Errorf("Batch = %d, want the provisional 21 (twice 10, and one)", got)
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
	if got := c.Limit(); got != 17 {
		t.Errorf("Limit = %d, want 17 (twice the 8 that ran, and one)", got)
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
	if got := c.Limit(); got != 17 {
		t.Fatalf("Limit = %d, want 17 (the 8 that ran, twice and one, over the decrease to 7)", got)
	}
	takeAll(c)
	for range seatsLowEvidence {
		c.ObserveScrape(time.Second, 4, 13) // the engine runs 13 and queues the rest
	}
	if n, from := c.SeatsSource(); n != 13 || from != SeatsQueue || from.Sure() != "measured" {
		t.Fatalf("SeatsSource = %d, %v; want 13, queue", n, from)
	}
	before := c.Limit()
	e.scrape(0, 13, 0)
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

// TestSeatsProvisionalDoubles: the provisional seats are Initial until a scrape shows a batch, then twice the
// largest batch the engine ran without a queue, for every class, and all of them count as free seats for the
// fleet's reserve.
func TestSeatsProvisionalDoubles(t *testing.T) {
	c, _, e := newEngineCap(t, 0)
	if _, known := c.Free(); known || c.Batch() != 0 {
		t.Fatalf("before any scrape: batch %d, free known %v; want 0, false", c.Batch(), known)
	}
	e.scrape(0, 0, 0)
	if got := c.Batch(); got != 8 {
		t.Fatalf("Batch = %d after an idle scrape, want the initial 8", got)
	}
	for range 7 {
		c.TryAcquireFor(Standard, true)
	}
	if f, known := c.Free(); !known || f != 1 {
		t.Fatalf("7 of 8 provisional seats taken: free %d (known %v); want 1", f, known)
	}
	if !c.TryAcquireFor(Standard, true) || c.TryAcquireFor(Critical, true) {
		t.Fatal("the eighth seat refused, or a ninth granted")
	}
	e.scrape(0, 8, 0) // the engine runs all 8
	if got, lc, ls := c.Batch(), c.LimitFor(Critical, true), c.LimitFor(Standard, true); got != 17 || lc != 17 || ls != 17 {
		t.Fatalf("after the engine ran 8: batch %d, critical limit %d, standard limit %d; want 17 each", got, lc, ls)
	}
	if n, from := c.SeatsSource(); n != 8 || from != SeatsFloor {
		t.Errorf("SeatsSource = %d, %v; want 8, probe (at least)", n, from)
	}
}

// TestSeatsProvisionalGrowUnderAReserve: standard requests that stop short of the fleet's reserve still grow
// the provisional seats until the engine's batch shows: fast when the reserve is a small share of them, and at
// least a seat a scrape when it holds half of them and no critical request comes to take any (the reserve
// over proven seats alone held a 64-seat engine at 5 running).
func TestSeatsProvisionalGrowUnderAReserve(t *testing.T) {
	const engineSeats = 64
	for _, tc := range []struct {
		share  float64
		within int
	}{{0.1, 8}, {0.25, 10}, {0.5, engineSeats + batchQueuedScrapes}} {
		c, _, e := newEngineCap(t, 0)
		e.scrape(0, 0, 0)
		held, scrapes := 0, 0
		for ; scrapes < 100; scrapes++ {
			if _, from := c.SeatsSource(); from == SeatsQueue {
				break
			}
			before := c.Batch()
			reserve := int(tc.share * float64(before))
			for before-held > reserve && c.TryAcquireFor(Standard, true) {
				held++
			}
			e.scrape(0, min(held, engineSeats), max(held-engineSeats, 0))
			if b := c.Batch(); b <= before && held <= engineSeats {
				t.Fatalf("reserve %.0f%%: provisional seats %d after %d, no growth", 100*tc.share, b, before)
			}
		}
		if n, from := c.SeatsSource(); n != engineSeats || from != SeatsQueue || scrapes > tc.within {
			t.Errorf("reserve %.0f%% of the seats: SeatsSource = %d, %v after %d scrapes; want %d, queue within %d",
				100*tc.share, n, from, scrapes, engineSeats, tc.within)
		}
	}
}
