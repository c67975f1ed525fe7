package proxy

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard/switchyard/openai"
)

// fakeClock is a virtual clock for the request path: time moves, and timers fire, only when a test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	added  chan struct{} // one value per timer made
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_700_000_000, 0), added: make(chan struct{}, 64)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) timer {
	c.mu.Lock()
	t := &fakeTimer{c: make(chan time.Time, 1), at: c.now.Add(d), clk: c}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.added <- struct{}{}
	return t
}

// Advance moves the clock by d and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if !t.done && !t.at.After(c.now) {
			t.done = true
			t.c <- c.now
		}
	}
}

// awaitTimer waits until the code under test has made its next timer.
func (c *fakeClock) awaitTimer(t *testing.T) {
	t.Helper()
	select {
	case <-c.added:
	case <-time.After(10 * time.Second):
		t.Fatal("no timer was made")
	}
}

type fakeTimer struct {
	c    chan time.Time
	at   time.Time
	clk  *fakeClock
	done bool // fired or stopped; guarded by clk.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

func counterOf(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// hedgeRig is decisionRig for a streamed chat request to a model that hedges after 100 ms with the given budget,
// on a virtual clock, with attempts that never reach the network: the primary waits until the test releases
// it (or the hedge race aborts it), a hedge answers at once.
func hedgeRig(t *testing.T, budgetPercent float64) (*Server, *exchange, *fakeClock, chan struct{}) {
	t.Helper()
	s, ex := decisionRig(t, 2, 1, func(snap *Snapshot) {
		snap.Models["sim-model"].Hedge = Hedge{After: 100 * time.Millisecond, BudgetPercent: budgetPercent}
	})
	clk := newFakeClock()
	s.clock = clk
	release := make(chan struct{})
	s.attemptHook = func(a *attempt) error {
		if !a.hedge {
			<-release
			if why := a.aborted(); why != nil {
				return why
			}
		}
		a.gotFirst = true
		return nil
	}
	ex.rt = &route{group: DefaultEndpoints, method: "POST", api: openai.Chat}
	ex.endpoint = openai.Chat
	ex.body = append(ex.body[:0], `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`...)
	if err := ex.parse(); err != nil {
		t.Fatal(err)
	}
	ex.rreq.PromptTokens = ex.sum.PromptTokens
	return s, ex, clk, release
}

// TestHedgeOnVirtualClock checks when a hedge goes: not before the model's hedge delay, at it when the budget
// allows, never when it does not; the first answer wins and the primary's slot is given back.
func TestHedgeOnVirtualClock(t *testing.T) {
	t.Run("the hedge goes at the delay and wins", func(t *testing.T) {
		s, ex, clk, release := hedgeRig(t, 100)
		defer close(release)
		done := make(chan error, 1)
		go func() { done <- ex.run() }()
		clk.awaitTimer(t)
		clk.Advance(99 * time.Millisecond)
		if n := counterOf(t, s.m.Hedges.WithLabelValues("sent")); n != 0 {
			t.Fatalf("%v hedges sent before the delay", n)
		}
		clk.Advance(time.Millisecond)
		if err := <-done; err != nil {
			t.Fatalf("run = %v", err)
		}
		if ex.cur == nil || !ex.cur.hedge {
			t.Fatal("the hedge answered first, but it is not the exchange's attempt")
		}
		if sent, won := counterOf(t, s.m.Hedges.WithLabelValues("sent")), counterOf(t, s.m.Hedges.WithLabelValues("hedge_won")); sent != 1 || won != 1 {
			t.Fatalf("hedges sent %v, won %v; want 1, 1", sent, won)
		}
		// The lost primary reads on to its first token (exchange.abandon), holding its slot until then.
		for _, e := range ex.rec.ends {
			if got := e.guards.Cap.Inflight(); got != 1 {
				t.Fatalf("%s holds %d slots, want 1: the hedge answers and the lost primary reads on", e.b.Name(), got)
			}
		}
		if n := s.orphans.len(); n != 1 {
			t.Fatalf("%d attempts read on after losing, want 1", n)
		}
		release <- struct{}{} // the primary's first token comes
		waitFor(t, 10*time.Second, func() bool { return s.orphans.len() == 0 })
		for _, e := range ex.rec.ends {
			want := 0
			if e.b == ex.cur.target.Backend {
				want = 1
			}
			if got := e.guards.Cap.Inflight(); got != want {
				t.Fatalf("%s holds %d slots, want %d: the lost primary gives its slot back at its first token", e.b.Name(), got, want)
			}
		}
	})
	t.Run("a spent budget keeps waiting for the primary", func(t *testing.T) {
		s, ex, clk, release := hedgeRig(t, 0.0001)
		for ex.rec.hedges.Allow() { // spend the saved hedges
		}
		denied := s.m.BudgetDenied.WithLabelValues("hedge")
		before := counterOf(t, denied)
		done := make(chan error, 1)
		go func() { done <- ex.run() }()
		clk.awaitTimer(t)
		clk.Advance(time.Second)
		waitFor(t, 10*time.Second, func() bool { return counterOf(t, denied) == before+1 })
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("run = %v", err)
		}
		if ex.cur == nil || ex.cur.hedge || counterOf(t, s.m.Hedges.WithLabelValues("sent")) != 0 {
			t.Fatal("a hedge went without budget")
		}
	})
}
