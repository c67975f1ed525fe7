package routing

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"
)

func TestSeatWait(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		occupied, seats, hold float64
		want                  float64
	}{
		{"a seat free", 3, 4, 2, 0},
		{"every seat taken: one release", 4, 4, 2, 0.5},
		{"two queued ahead: three releases", 6, 4, 2, 1.5},
		{"seats unknown", 9, 0, 2, 0},
		{"hold time unknown", 9, 4, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := seatWait(tc.occupied, tc.seats, tc.hold); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("seatWait(%v, %v, %v) = %v, want %v", tc.occupied, tc.seats, tc.hold, got, tc.want)
			}
		})
	}
}

// meter is a SeatMeter with a fixed figure.
type meter struct {
	seats int
	exact bool
}

func (m meter) MeasuredSeats() (int, bool) { return m.seats, m.exact }

// serve runs n requests of prompt tokens through b on the virtual clock, one at a time: first token after ttft,
// end after hold more, so that b learns what a request holds a seat for.
func (f *fleet) serve(name string, n, prompt int, ttft, hold time.Duration) {
	b := f.b(name)
	for range n {
		a := b.Begin(prompt)
		f.clk.Advance(ttft)
		a.FirstToken()
		f.clk.Advance(hold)
		a.End(false)
	}
}

// TestAdaptiveWaitsForASeat: an engine that runs a few sequences at once starts a queued request only when one of
// them ends, seconds on a long answer. The owner of a prompt's prefix keeps it while it has a seat free; once
// every seat is taken the wait for one (the requests ahead, at the rate its seats free up) is in its cost and the
// prompt goes to a backend with a seat, paying the prefill; with a request already waiting the owner is
// saturated. Seats count when the policy states them or the cap measured them (an exact SeatMeter), not when they
// are only the largest batch seen, unless a fresh scrape shows the engine queueing at that batch.
func TestAdaptiveWaitsForASeat(t *testing.T) {
	prompt := text(31, 6000) // about 1,500 tokens: 150 ms of prefill at the truth's rate
	truth := law{a: 0.015, perTok: 0.0001, perQueued: 0.0001, perRun: 0.0002}
	for _, tc := range []struct {
		name      string
		policy    int    // backends[].max_num_seqs
		meter     *meter // the cap's figure; nil: none installed
		peer      *meter // b0's cap's figure, when not meter's (b0 is a peer of the owner b2: peerseats.go)
		inflight  int    // requests in flight on the owner
		waiting   float64
		running   float64
		wantKeep  bool
		wantWait  time.Duration
		saturated bool
	}{
		{name: "a seat free", policy: 4, inflight: 3, running: 3, wantKeep: true},
		{name: "every seat taken", policy: 4, inflight: 4, running: 4, wantWait: 500 * time.Millisecond},
		{name: "one waiting", policy: 4, inflight: 5, running: 4, waiting: 1, wantWait: time.Second, saturated: true},
		{name: "one waiting, before a scrape shows it", policy: 4, inflight: 5, running: 4, wantWait: time.Second,
			saturated: true},
		{name: "measured seats", meter: &meter{4, true}, inflight: 4, running: 4, wantWait: 500 * time.Millisecond},
		{name: "a lower bound only", meter: &meter{4, false}, inflight: 4, running: 4, wantKeep: true},
		{name: "a lower bound, the engine queueing at it", meter: &meter{4, false}, inflight: 5, running: 4,
			waiting: 1, wantWait: time.Second, saturated: true},
		{name: "seats unknown", inflight: 6, running: 4, wantKeep: true},
		{name: "a lower bound, a peer measured its seats", meter: &meter{4, false}, peer: &meter{4, true},
			inflight: 4, running: 4, wantWait: 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgs := local(4)
			for _, c := range cfgs {
				c.MaxNumSeqs = tc.policy
			}
			f := newFleet(t, cfgs...)
			for _, tg := range f.targets {
				f.train(tg.Backend.Name(), truth, 300)
				if tc.meter != nil {
					tg.Backend.SetSeatMeter(*tc.meter)
				}
				f.serve(tg.Backend.Name(), 20, 100, 30*time.Millisecond, 2*time.Second-30*time.Millisecond)
				f.engine(tg.Backend.Name(), 0, 0, 0)
			}
			if tc.peer != nil {
				f.b("b0").SetSeatMeter(*tc.peer)
			}
			for _, tg := range f.targets {
				tg.Backend.notePeers(tg.Backend.Engine())
			}
			owner := f.b("b2")
			if h := owner.hold.load(); math.Abs(h-2) > 0.05 {
				t.Fatalf("hold time learned %.3f s, want about 2 s", h)
			}
			f.hold("b2", prompt)
			atts := occupy(owner, tc.inflight)
			f.engine("b2", tc.waiting, tc.running, 0)
			l := owner.loadAt(f.clk.Now())
			if got := duration(l.seatWait); absDur(got-tc.wantWait) > 50*time.Millisecond {
				t.Fatalf("seat wait %v, want %v", got, tc.wantWait)
			}
			sat := saturationOf(DefaultAdaptiveParams())
			if got := sat.at(owner.Config(), l); got != tc.saturated {
				t.Fatalf("saturated = %v, want %v", got, tc.saturated)
			}
			if got := sat.saturated(owner, owner.Config(), f.clk.Now()); got != tc.saturated {
				t.Fatalf("saturated (no load in hand) = %v, want %v", got, tc.saturated)
			}
			got := f.picks(adaptive(t, f, ""), prompt, 50)
			if keep := got["b2"] == 50; keep != tc.wantKeep {
				t.Fatalf("picks %v, want the owner b2 kept: %v", got, tc.wantKeep)
			}
			if !tc.wantKeep && got["b2"] > 0 {
				t.Fatalf("picks %v: the owner took some while its wait for a seat outweighs the prefill", got)
			}
			endAll(atts)
		})
	}
}

func absDur(d time.Duration) time.Duration { return max(d, -d) }

// seated returns a fleet of n backends whose policy states seats each.
func seated(t *testing.T, n, seats int) *fleet {
	cfgs := local(n)
	for _, c := range cfgs {
		c.MaxNumSeqs = seats
	}
	return newFleet(t, cfgs...)
}

// occupy begins n requests on b past their first token, and returns them for End.
func occupy(b *Backend, n int) []Attempt {
	atts := make([]Attempt, n)
	for i := range atts {
		atts[i] = b.Begin(100)
		atts[i].FirstToken()
	}
	return atts
}

// endAll ends the attempts.
func endAll(atts []Attempt) {
	for i := range atts {
		atts[i].End(false)
	}
}

// TestSeatWaitIsNotPrefill: a first token that came late because the request waited for a seat does not teach the
// TTFT model a slow engine: the wait predicted at dispatch is taken out before the model learns.
func TestSeatWaitIsNotPrefill(t *testing.T) {
	f := seated(t, 1, 1)
	b := f.b("b0")
	f.serve("b0", 20, 100, 30*time.Millisecond, time.Second)
	before, _ := b.PredictTTFT(100, 0)
	for range 100 {
		busy := b.Begin(100) // holds the seat
		busy.FirstToken()
		a := b.Begin(100) // waits for it: about a second, then 30 ms of prefill
		if a.seatWait < 0.9 {
			t.Fatalf("seat wait predicted at dispatch %.3f s, want about 1 s", a.seatWait)
		}
		f.clk.Advance(time.Second + 30*time.Millisecond)
		a.FirstToken()
		busy.End(false)
		f.clk.Advance(time.Second)
		a.End(false)
	}
	after, _ := b.PredictTTFT(100, 0)
	if after > 2*before {
		t.Fatalf("predicted TTFT of an idle engine %v after requests that waited for a seat, %v before", after, before)
	}
}

// TestITLObjectiveOnTheMean: a backend whose ITL prediction is noisy (a wide p90) but whose mean meets the objective
// is eligible; one whose mean misses it is not. Judging the p90 sent every request to the few backends observed
// most, whose spread had narrowed, until their seats overflowed.
func TestITLObjectiveOnTheMean(t *testing.T) {
	f := newFleet(t, local(3)...)
	for i := range 200 {
		f.b("b0").lat.observeITL(4, 0.040)
		f.b("b1").lat.observeITL(4, []float64{0.030, 0.055}[i%2]) // mean 42 ms, p90 past 50 ms
		f.b("b2").lat.observeITL(4, 0.060)
	}
	s := adaptive(t, f, "")
	r := &Request{Model: "m", Prompt: text(1, 400), ITLSLO: 50 * time.Millisecond}
	now := f.clk.Now()
	for name, want := range map[string]uint8{"b0": tierEligible, "b1": tierEligible, "b2": tierMisses} {
		b := f.b(name)
		if p90 := b.lat.itlMean(1) * b.lat.itlSpread.load(); name == "b1" && p90 <= 0.050 {
			t.Fatalf("b1's p90 ITL %.1f ms is within the objective: the case is not tested", p90*1e3)
		}
		if c := s.evaluate(r, b, now, 100, 0, 0, 0, false, turnLess{}); c.tier != want {
			t.Errorf("%s: tier %d, want %d (mean ITL %.1f ms)", name, c.tier, want, b.lat.itlMean(1)*1e3)
		}
	}
}

// TestHoldIsTheMeanOfTheFirstAnswers: the hold time starts as the mean of the answers that ended, not as the
// first of them (the shortest of those begun together), and then follows the recent ones.
func TestHoldIsTheMeanOfTheFirstAnswers(t *testing.T) {
	f := newFleet(t, local(1)...)
	b := f.b("b0")
	f.serve("b0", 1, 100, 30*time.Millisecond, time.Second)
	f.serve("b0", 3, 100, 30*time.Millisecond, 9*time.Second)
	if h := b.hold.load(); math.Abs(h-7.03) > 0.05 {
		t.Fatalf("hold after answers of 1 and 3x9 s: %.2f s, want their mean, about 7 s", h)
	}
	f.serve("b0", 40, 100, 30*time.Millisecond, 2*time.Second)
	if h := b.hold.load(); math.Abs(h-2.03) > 0.1 {
		t.Fatalf("hold after 40 answers of 2 s: %.2f s, want about 2 s", h)
	}
}

// TestHoldFromTheFleet: a backend none of whose answers has ended yet prices the wait for a seat with its fleet's
// hold time, and with its own once one ends there.
func TestHoldFromTheFleet(t *testing.T) {
	f := seated(t, 2, 4)
	f.serve("b0", 10, 100, 30*time.Millisecond, 2*time.Second-30*time.Millisecond)
	b1 := f.b("b1")
	atts := occupy(b1, 4)
	if w := b1.loadAt(f.clk.Now()).seatWait; math.Abs(w-0.5) > 0.05 {
		t.Fatalf("seat wait on a backend without answers of its own: %.3f s, want the fleet's hold (2 s) / 4 seats", w)
	}
	f.clk.Advance(6 * time.Second)
	atts[0].End(false)
	again := b1.Begin(100) // its four seats taken again
	again.FirstToken()
	if w := b1.loadAt(f.clk.Now()).seatWait; math.Abs(w-1.5) > 0.05 {
		t.Fatalf("seat wait once an answer of 6 s ended there: %.3f s, want its own hold (6 s) / 4 seats", w)
	}
}

// TestTTFTObjectiveBesideITL: a backend predicted to miss the TTFT objective (here by its wait for a seat) ranks
// with one that misses the ITL objective, and the cheaper of them takes the request: the ITL filter alone sent it
// to wait seconds for a seat on the only backend whose ITL met its objective.
func TestTTFTObjectiveBesideITL(t *testing.T) {
	f := seated(t, 2, 4)
	f.serve("b0", 10, 100, 30*time.Millisecond, 4*time.Second)
	for range 200 {
		f.b("b0").lat.observeITL(4, 0.040)
		f.b("b1").lat.observeITL(4, 0.060)
	}
	b0 := f.b("b0")
	atts := occupy(b0, 4)
	s := adaptive(t, f, "")
	r := &Request{Model: "m", Prompt: text(2, 400), ITLSLO: 50 * time.Millisecond, TTFTSLO: 500 * time.Millisecond}
	now := f.clk.Now()
	if c := s.evaluate(r, b0, now, 100, 0, 0, 0, false, turnLess{}); c.tier != tierMisses {
		t.Fatalf("b0, a second's wait for a seat against a 500 ms objective: tier %d, want %d", c.tier, tierMisses)
	}
	got, err := s.Pick(r, f.targets)
	if err != nil {
		t.Fatal(err)
	}
	if got.Backend.Name() != "b1" {
		t.Fatalf("picked %s, want b1 (a free seat, ITL 60 ms against 50) over b0 (ITL 40 ms, a second's wait)",
			got.Backend.Name())
	}
	endAll(atts)
}

// TestOccupancySinceTheScrape: a scrape is up to an interval old, and the engine's batch has changed since by what
// this gateway dispatched and ended there. A conversation's next turn comes the moment its previous answer
// ended: the scrape still counts that answer, and the owner, with a seat free again, must not look full. A
// request dispatched after the scrape counts beside the engine's other clients the scrape saw.
func TestOccupancySinceTheScrape(t *testing.T) {
	for _, tc := range []struct {
		name              string
		ours              int     // our requests in the engine when it is scraped
		running, waiting  float64 // what the scrape shows (ours and the engine's other clients)
		ended, dispatched int     // ours after the scrape
		want              float64 // the engine's occupancy now
		full              bool
	}{
		{name: "as scraped", ours: 4, running: 4, want: 4},
		{name: "an answer ended since", ours: 4, running: 4, ended: 1, want: 3},
		{name: "another client waiting, one of ours ended", ours: 4, running: 4, waiting: 1, ended: 1, want: 4},
		{name: "another client waiting", ours: 4, running: 4, waiting: 1, want: 5, full: true},
		{name: "dispatched since, beside other clients", ours: 2, running: 4, dispatched: 1, want: 5, full: true},
		{name: "more ended than the scrape saw", ours: 4, running: 2, ended: 4, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			e.set(vllmText(tc.waiting, tc.running, 0.1, 4096, 1e9, false), http.StatusOK)
			s, b, clk := scraperFor(t, e.srv.URL, EngineVLLM)
			cfg := *b.Config()
			cfg.MaxNumSeqs = 4
			b.cfg.Store(&cfg)
			for range 20 { // a request holds a seat for 2 s here
				a := b.Begin(100)
				clk.Advance(30 * time.Millisecond)
				a.FirstToken()
				clk.Advance(2*time.Second - 30*time.Millisecond)
				a.End(false)
			}
			atts := occupy(b, tc.ours)
			if err := s.scrape(context.Background()); err != nil {
				t.Fatal(err)
			}
			endAll(atts[:tc.ended])
			more := occupy(b, tc.dispatched)
			got, ok := b.engineOccupancy(b.Engine())
			if !ok || got != tc.want {
				t.Fatalf("occupancy %v (%v), want %v", got, ok, tc.want)
			}
			l := b.loadAt(clk.Now())
			if l.full != tc.full {
				t.Fatalf("full = %v, want %v", l.full, tc.full)
			}
			if want := seatWait(tc.want, 4, 2); math.Abs(l.seatWait-want) > 0.05 {
				t.Fatalf("seat wait %.3f s, want %.3f s", l.seatWait, want)
			}
			sat := saturationOf(DefaultAdaptiveParams())
			if got := sat.saturated(b, b.Config(), clk.Now()); got != tc.full {
				t.Fatalf("saturated = %v, want %v", got, tc.full)
			}
			endAll(atts[tc.ended:])
			endAll(more)
		})
	}
}
