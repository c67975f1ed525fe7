package admission

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

func newCap(t *testing.T, p CapParams, maxConcurrency int) *Cap {
	t.Helper()
	cs := NewCaps(p, nil)
	cs.Update([]CapConfig{{Name: "b", MaxConcurrency: maxConcurrency}})
	c := cs.Get("b")
	if c == nil {
		t.Fatal("Get after Update = nil")
	}
	return c
}

func TestStaticCap(t *testing.T) {
	c := newCap(t, CapParams{}, 3)
	for i := range 3 {
		if !c.TryAcquire() {
			t.Fatalf("acquire %d refused under the cap", i+1)
		}
	}
	if c.TryAcquire() || !c.Full() {
		t.Fatal("a 4th slot on a cap of 3")
	}
	c.Observe(time.Millisecond, time.Second, 0) // a static cap does not adapt
	if c.Limit() != 3 || c.Adaptive() {
		t.Errorf("static cap changed: %d", c.Limit())
	}
	c.Release()
	if c.Full() || !c.TryAcquire() {
		t.Error("a released slot is not reusable")
	}
}

// TestCapConcurrentNeverExceeds: goroutines racing for slots never hold more than the limit at once.
func TestCapConcurrentNeverExceeds(t *testing.T) {
	c := newCap(t, CapParams{}, 5)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				if !c.TryAcquire() {
					continue
				}
				h := held.Add(1)
				for {
					p := peak.Load()
					if h <= p || peak.CompareAndSwap(p, h) {
						break
					}
				}
				held.Add(-1)
				c.Release()
			}
		})
	}
	wg.Wait()
	if peak.Load() > 5 {
		t.Errorf("peak %d slots held, cap 5", peak.Load())
	}
	if c.Inflight() != 0 {
		t.Errorf("inflight %d after all released", c.Inflight())
	}
}

// fill takes n slots.
func fill(t *testing.T, c *Cap, n int) {
	t.Helper()
	for range n {
		if !c.TryAcquire() {
			t.Fatalf("cannot take %d slots of %d", n, c.Limit())
		}
	}
}

func TestAdaptiveCap(t *testing.T) {
	const pred = 100 * time.Millisecond
	good := obs{pred, pred, 0}
	for _, tc := range []struct {
		name     string
		inflight int
		steady   bool // past slow start
		obs      obsList
		want     int
	}{
		{name: "slow start: +1 per good observation", inflight: 20, obs: rep(8, good), want: 40},
		{name: "app-limited: no growth", inflight: 10, obs: rep(8, good), want: 32},
		{name: "engine queue: shrink once per round trip", inflight: 20, obs: rep(20, obs{pred, pred, 3}), want: 28},
		{name: "a few waiting for the next fast step: no shrink", inflight: 20, obs: rep(20, obs{5 * time.Millisecond, 2 * time.Millisecond, 3}), want: 32},
		{name: "slow TTFT: shrink", inflight: 20, obs: rep(1, obs{2 * pred, pred, 0}).then(rep(19, obs{pred, pred, 1})), want: 28},
		{name: "shrink again after a round trip", inflight: 20, obs: rep(40, obs{pred, pred, 5}), want: 25},
		{name: "hold between the thresholds", inflight: 20, obs: rep(50, obs{pred * 13 / 10, pred, 1}), want: 32},
		{name: "steady: +1 per limit observations", inflight: 20, steady: true, obs: rep(33, good), want: 33}, // sum of 1/l
		{name: "unknown prediction: waiting alone decides", inflight: 20,
			obs: rep(4, obs{10 * pred, 0, 0}).then(rep(1, obs{pred, 0, 3})), want: 32}, // 36 * 0.9
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCap(t, CapParams{Initial: 32}, 0)
			c.steady.Store(tc.steady)
			fill(t, c, tc.inflight)
			for _, o := range tc.obs {
				c.Observe(o.ttft, o.predicted, o.waiting)
			}
			if got := c.Limit(); got != tc.want {
				t.Errorf("limit = %d (%.3f), want %d", got, c.limit.load(), tc.want)
			}
		})
	}
}

type obs struct {
	ttft, predicted time.Duration
	waiting         int
}

type obsList []obs

func rep(n int, o obs) obsList {
	l := make(obsList, n)
	for i := range l {
		l[i] = o
	}
	return l
}

func (l obsList) then(m obsList) obsList { return append(l, m...) }

func TestAdaptiveCapBounds(t *testing.T) {
	c := newCap(t, CapParams{Initial: 4, Min: 2, Max: 6}, 0)
	fill(t, c, 4)
	for range 100 {
		c.Observe(time.Millisecond, time.Second, 0)
	}
	if c.Limit() != 6 {
		t.Errorf("limit %d, want Max 6", c.Limit())
	}
	for range 1000 {
		c.Observe(time.Minute, time.Second, 10)
	}
	if c.Limit() != 2 {
		t.Errorf("limit %d, want Min 2", c.Limit())
	}
}

// TestCapsUpdate: caps keep their learned limit and their slots across a reload, switch between static and
// adaptive, and drop removed backends.
func TestCapsUpdate(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	cs := NewCaps(CapParams{Initial: 32}, m)
	cs.Update([]CapConfig{{Name: "a"}, {Name: "b", MaxConcurrency: 8}})
	a, b := cs.Get("a"), cs.Get("b")
	fill(t, a, 20)
	for range 4 {
		a.Observe(time.Millisecond, time.Second, 0)
	}
	if a.Limit() != 36 {
		t.Fatalf("a learned %d, want 36", a.Limit())
	}
	if got := value(t, m.ConcurrencyLimit.WithLabelValues("a")); got != 36 {
		t.Errorf("concurrency limit gauge = %v, want 36", got)
	}
	cs.Update([]CapConfig{{Name: "a"}, {Name: "b"}, {Name: "c", MaxConcurrency: 1}})
	if cs.Get("a") != a || a.Limit() != 36 || a.Inflight() != 20 {
		t.Errorf("a lost its state across the reload: %d/%d", a.Inflight(), a.Limit())
	}
	if cs.Get("b") != b || !b.Adaptive() || b.Limit() != 32 {
		t.Errorf("b did not become adaptive at the initial limit: %d", b.Limit())
	}
	cs.Update([]CapConfig{{Name: "c", MaxConcurrency: 1}})
	if cs.Get("a") != nil {
		t.Error("a removed backend is still there")
	}
	a.Release() // a request still holding the dropped cap
	if cs.Get("nope") != nil {
		t.Error("unknown name")
	}
}

func TestCapDoesNotAllocate(t *testing.T) {
	c := newCap(t, CapParams{}, 0)
	if a := testing.AllocsPerRun(100, func() {
		if c.TryAcquire() {
			c.Observe(100*time.Millisecond, 100*time.Millisecond, 0)
			c.Release()
		}
	}); a != 0 {
		t.Errorf("TryAcquire/Observe/Release allocate %v times", a)
	}
}

// TestCapFitsTheEngineAtOnce: when requests wait inside the engine, the cap drops to the engine's running batch
// plus the target queue in one step, instead of creeping down from its initial limit.
func TestCapFitsTheEngineAtOnce(t *testing.T) {
	cs := NewCaps(CapParams{Initial: 32}, nil)
	cs.Update([]CapConfig{{Name: "a"}})
	c := cs.Get("a")
	for range 32 { // the gateway fills a cap of 32; the engine runs 16 and queues 16
		c.TryAcquire()
	}
	c.ObserveEngine(time.Second, 100*time.Millisecond, 16, 16)
	if got := c.Limit(); got != 18 {
		t.Errorf("limit %d after one observation of 16 running and 16 waiting, want 16+2", got)
	}
	c.ObserveEngine(time.Second, 100*time.Millisecond, 0, 0)
	if got := c.Limit(); got > 18 {
		t.Errorf("limit %d grew on a slow first token", got)
	}
}

// TestCriticalReserve: while critical requests come, standard and sheddable ones leave part of every cap to them;
// without critical demand they may fill it.
func TestCriticalReserve(t *testing.T) {
	cs := NewCaps(CapParams{}, nil)
	cs.Update([]CapConfig{{Name: "a", MaxConcurrency: 20}, {Name: "b", MaxConcurrency: 1}})
	c := cs.Get("a")
	if got := c.LimitFor(Standard, true); got != 17 {
		t.Errorf("standard may fill %d of 20, want 17 (15%% reserved)", got)
	}
	if got := c.LimitFor(Standard, false); got != 20 {
		t.Errorf("without critical demand standard may fill %d of 20, want 20 (nothing to reserve for)", got)
	}
	for range 17 {
		if !c.TryAcquireFor(Sheddable, true) {
			t.Fatal("a sheddable request was refused below its limit")
		}
	}
	if c.TryAcquireFor(Standard, true) || !c.FullFor(Standard, true) {
		t.Error("a standard request took a reserved slot")
	}
	for range 3 {
		if !c.TryAcquireFor(Critical, true) {
			t.Fatal("a critical request was refused a reserved slot")
		}
	}
	if c.TryAcquireFor(Critical, true) || !c.Full() {
		t.Error("the cap was exceeded")
	}
	if got := cs.Get("b").LimitFor(Standard, true); got != 1 {
		t.Errorf("a cap of 1 reserves nothing: standard gets %d", got)
	}
}

// TestCapIgnoresJitterOfFastBackends: a backend that answers in milliseconds is not slow for being 2.5x late by
// a few milliseconds of scheduler jitter; its cap does not shrink. (Nor does it grow on such first tokens: growth
// still asks for one within LowRatio of its prediction, and counting the slack there too made the caps of a
// failover region grow into engine queues during an outage, where the shedder then refused requests.)
func TestCapIgnoresJitterOfFastBackends(t *testing.T) {
	c := newCap(t, CapParams{}, 0)
	fill(t, c, 8)
	for range 100 {
		c.Observe(5*time.Millisecond, 2*time.Millisecond, 0)
	}
	if got := c.Limit(); got != 8 {
		t.Errorf("limit %d after 100 first tokens 3 ms late on a 2 ms prediction; want 8: neither slow nor good", got)
	}
	for range 20 {
		c.Observe(2*time.Millisecond, 2*time.Millisecond, 0)
	}
	if got := c.Limit(); got <= 8 {
		t.Errorf("limit %d after on-time first tokens; it must grow", got)
	}
}

// TestCapLearnsEngineSeats: an engine that keeps requests waiting shows its batch size (its running count, in a
// scrape seen by a late first token, near the cap's limit); requests then fill at most that many seats instead of
// waiting inside the engine up to the limit. An engine running far fewer than the limit with a request waiting is
// held by something else, and a fast engine's next-step arrivals are no queue. Without new evidence for SeatsTTL
// first tokens the estimate is tested with a probe, and evidence of a different batch replaces it.
func TestCapLearnsEngineSeats(t *testing.T) {
	cs := NewCaps(CapParams{Initial: 32}, nil)
	cs.Update([]CapConfig{{Name: "a"}, {Name: "s", MaxConcurrency: 20}, {Name: "fast"}})
	c := cs.Get("a")
	if c.Seats() != 0 || c.LimitFor(Critical, true) != 32 {
		t.Fatalf("before any scrape: seats %d, critical may fill %d; want 0 and the limit 32", c.Seats(), c.LimitFor(Critical, true))
	}
	const pred = 100 * time.Millisecond
	late := time.Second
	fill(t, c, 20)
	// A request waits while 5 run, against a limit of 32: a long prefill step, say, not a full batch.
	for range 6 {
		c.ObserveScrape(late, 1, 5)
	}
	if c.Seats() != 0 {
		t.Fatalf("seats %d from 5 running and 1 waiting under a limit of 32; want unknown", c.Seats())
	}
	// A queue: 16 running and 4 waiting. The cap drops to 16 + 2 at once, and the batch is 16.
	c.ObserveEngine(late, pred, 4, 16)
	c.ObserveScrape(late, 4, 16)
	if c.Seats() != 16 || c.Limit() != 18 {
		t.Fatalf("seats %d, limit %d after 16 running and 4 waiting; want 16 and 18", c.Seats(), c.Limit())
	}
	if got := c.LimitFor(Critical, true); got != 16 {
		t.Errorf("critical may fill %d, want the 16 seats", got)
	}
	if got := c.LimitFor(Standard, true); got != 16 {
		t.Errorf("standard may fill %d, want the 16 seats (the fleet keeps the critical reserve)", got)
	}
	if got := c.LimitFor(Standard, false); got != 18 {
		t.Errorf("without critical demand standard may fill %d, want the whole limit 18 (the seats do not bind)", got)
	}
	if free, known := c.Free(); free != 0 || !known {
		t.Errorf("Free() = %d, %v with 20 in flight on 16 seats; want 0, true", free, known)
	}
	if c.TryAcquireFor(Critical, true) || !c.FullFor(Sheddable, true) {
		t.Error("a request was let in beyond the engine's seats (20 in flight)")
	}
	// A scrape between two steps may catch a seat empty while requests wait: not a smaller batch.
	for range seatsLowEvidence - 1 {
		c.ObserveScrape(late, 2, 15)
	}
	if c.Seats() != 16 {
		t.Errorf("seats %d after %d scrapes of 15 running, want 16 kept", c.Seats(), seatsLowEvidence-1)
	}
	// Good first tokens do not grow the limit past seats + TargetWaiting while the seats are known.
	for range 100 {
		c.ObserveEngine(pred/2, pred, 0, 16)
	}
	if got := c.Limit(); got > 18 {
		t.Errorf("limit grew to %d with the engine's 16 seats known; want at most 18", got)
	}
	// The engine runs more than thought without a queue (a restart with a larger batch): the estimate follows.
	c.ObserveScrape(pred, 0, 24)
	if c.Seats() != 24 {
		t.Errorf("seats %d after a scrape of 24 running, want 24", c.Seats())
	}
	for range 300 {
		c.ObserveEngine(pred/2, pred, 0, 24)
	}
	// Without new evidence the estimate is tested: standard requests may fill one seat more (a probe), critical
	// ones still only the seats.
	for range SeatsTTL {
		c.ObserveScrape(pred, 0, 10)
	}
	if lim := c.Limit(); lim < 25 {
		t.Fatalf("limit %d after 300 good first tokens with 24 seats known; want it near 24+2", lim)
	}
	if c.Seats() != 24 || c.LimitFor(Critical, true) != 24 || c.LimitFor(Standard, true) != 25 {
		t.Errorf("after %d first tokens without a queue: seats %d, critical may fill %d, standard %d; want 24, 24, 25",
			SeatsTTL, c.Seats(), c.LimitFor(Critical, true), c.LimitFor(Standard, true))
	}
	// The engine keeps the probe waiting: the estimate is confirmed and the probe's seat closes.
	c.ObserveScrape(pred, 1, 24)
	if c.LimitFor(Standard, true) != 24 {
		t.Errorf("standard may fill %d after the probe queued, want 24", c.LimitFor(Standard, true))
	}
	// Fewer run while requests wait (longer sequences under a KV-cache limit): the cap drops to what runs + 2,
	// and a few such first tokens lower the estimate.
	c.ObserveEngine(late, pred, 3, 12)
	for range seatsLowEvidence {
		c.ObserveScrape(late, 3, 12)
	}
	if c.Seats() != 12 {
		t.Errorf("seats %d after %d first tokens seeing 12 running and 3 waiting, want 12", c.Seats(), seatsLowEvidence)
	}
	// A fast engine always has a few requests waiting for its next step, and answers them at once: no batch.
	f := cs.Get("fast")
	for range 50 {
		f.ObserveEngine(3*time.Millisecond, 2*time.Millisecond, 3, 5)
		f.ObserveScrape(3*time.Millisecond, 3, 5)
	}
	if f.Seats() != 0 {
		t.Errorf("seats %d learned from a fast engine's next-step arrivals; want unknown", f.Seats())
	}
	// A static cap is the operator's word: it does not learn seats.
	s := cs.Get("s")
	s.ObserveScrape(late, 4, 20)
	if s.Seats() != 0 || s.LimitFor(Critical, true) != 20 {
		t.Errorf("static cap: seats %d, critical may fill %d; want 0 and 20", s.Seats(), s.LimitFor(Critical, true))
	}
	if _, known := s.Free(); known {
		t.Error("a static cap claims to know its engine's free seats")
	}
}

// TestCapLearnsSeatsAboveTheBatch: a cap that drifted a few above the engine's batch (its queue of one or two
// does not shrink it) still learns the batch from a late first token that sees the queue.
func TestCapLearnsSeatsAboveTheBatch(t *testing.T) {
	c := newCap(t, CapParams{Initial: 21}, 0)
	c.ObserveScrape(time.Second, 1, 16)
	if c.Seats() != 16 {
		t.Errorf("seats %d after 16 running and 1 waiting under a limit of 21, want 16", c.Seats())
	}
}
