package routing

import (
	"math"
	"testing"
	"time"
)

// TestIdleWaitFollowsTraffic: a backend may go idleGaps of its fair-share gaps between first tokens without one
// before it is probed, measured from the traffic its models get, within [IdleProbeAfter, maxIdleProbeAfter].
func TestIdleWaitFollowsTraffic(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	var cfgs []*BackendConfig
	for _, n := range []string{"a", "b", "c", "d"} {
		cfgs = append(cfgs, &BackendConfig{Name: n, URL: "http://127.0.0.1:1", Engine: EngineVLLM, Models: []string{"m"}})
	}
	cfgs = append(cfgs, &BackendConfig{Name: "both", URL: "http://127.0.0.1:1", Engine: EngineVLLM, Models: []string{"m", "n"}},
		&BackendConfig{Name: "n", URL: "http://127.0.0.1:1", Engine: EngineVLLM, Models: []string{"n"}})
	bs := reg.Sync(cfgs)
	m := NewMonitor(reg, MonitorOptions{Clock: clk})
	after := func(i int) time.Duration { return bs[i].idleAfter(DefaultIdleProbeAfter) }

	// Before any sweep: the floor. A sweep with no traffic at all: the bound.
	if got := after(0); got != DefaultIdleProbeAfter {
		t.Fatalf("before a sweep: %v", got)
	}
	m.sweepIdle(clk.Now())
	clk.Advance(time.Second)
	m.sweepIdle(clk.Now())
	for i := range bs {
		if got := after(i); got != maxIdleProbeAfter {
			t.Fatalf("%s without traffic: %v, want %v", bs[i].Name(), got, maxIdleProbeAfter)
		}
	}

	// Model m: 5 backends, 2 first tokens a second, all on a and b (c and d avoided); model n: 2 backends, 1 a
	// second on n. both serves both models: its fair share is m's 2/5 and n's 1/2 a second.
	for range 60 {
		bs[0].idle.firsts.Add(1)
		bs[1].idle.firsts.Add(1)
		bs[5].idle.firsts.Add(1)
		clk.Advance(time.Second)
		m.sweepIdle(clk.Now())
	}
	climb := 1 - math.Exp(-60/idleRateWindow.Seconds()) // the EWMA's climb from its first sweep at 0
	want := func(fair float64) time.Duration {
		return max(DefaultIdleProbeAfter, min(maxIdleProbeAfter, time.Duration(idleGaps/(fair*climb)*float64(time.Second))))
	}
	for i, fair := range []float64{2.0 / 5, 2.0 / 5, 2.0 / 5, 2.0 / 5, 2.0/5 + 1.0/2, 1.0 / 2} {
		if got, w := after(i), want(fair); got < w-time.Millisecond || got > w+time.Millisecond {
			t.Errorf("%s: %v, want %v (fair share %.2f first tokens/s)", bs[i].Name(), got, w, fair)
		}
	}
	if got := after(2); got < 9*time.Second || got > 11*time.Second {
		t.Errorf("an avoided backend of a model at 2 first tokens/s over 5 backends: %v, want 4 gaps of 2.5 s", got)
	}
	// Traffic twenty times as dense: the wait falls to the floor, not below it.
	for range 60 {
		bs[0].idle.firsts.Add(20)
		bs[1].idle.firsts.Add(20)
		clk.Advance(time.Second)
		m.sweepIdle(clk.Now())
	}
	if got := after(2); got != DefaultIdleProbeAfter {
		t.Errorf("at 40 first tokens/s over 5 backends: %v, want the floor", got)
	}
	// Sparse traffic: 1 first token a second over 5 backends is a 5 s gap, 20 s of them.
	for range 120 {
		bs[0].idle.firsts.Add(1)
		clk.Advance(time.Second)
		m.sweepIdle(clk.Now())
	}
	if got := after(3); got < 19*time.Second || got > 21*time.Second {
		t.Errorf("at 1 first token/s over 5 backends: %v, want about 20 s", got)
	}
	// An unhealthy backend takes no share: the others' grow.
	bs[4].SetHealthy(false)
	bs[5].SetHealthy(false)
	m.sweepIdle(clk.Now())
	if got := after(3); got < 15*time.Second || got > 17*time.Second {
		t.Errorf("with one of m's 5 backends down: %v, want about 16 s", got)
	}
	// A backend the regime detector saw slow down (its first tokens five times as slow as its model) is probed at
	// the floor until it is seen to recover; its peers keep their fair-share wait.
	fit := func(b *Backend, factor float64, n int) {
		for range n {
			b.lat.observeTTFT(statusPromptTokens, 0, 0, factor*b.lat.ttftMean(statusPromptTokens, 0, 0))
		}
	}
	fit(bs[2], 1, 30)
	fit(bs[2], 5, 6)
	m.sweepIdle(clk.Now())
	if got := after(2); !bs[2].slowed() || got != DefaultIdleProbeAfter {
		t.Errorf("a backend seen to slow down: slowed %v (%.2f), wait %v, want the floor", bs[2].slowed(),
			bs[2].lat.ttftSlowed.load(), got)
	}
	if got := after(3); got < 15*time.Second {
		t.Errorf("its peer: %v, want the fair-share wait", got)
	}
	fit(bs[2], 0.2, 6)
	m.sweepIdle(clk.Now())
	if got := after(2); bs[2].slowed() || got < 15*time.Second {
		t.Errorf("after its recovery: slowed %v (%.2f), wait %v", bs[2].slowed(), bs[2].lat.ttftSlowed.load(), got)
	}
	// Off: nothing is set.
	off := NewMonitor(reg, MonitorOptions{Clock: clk, IdleProbeAfter: -1})
	bs[0].idle.after.Store(0)
	off.sweepIdle(clk.Now())
	if bs[0].idle.after.Load() != 0 {
		t.Error("idle probes off: a wait was set")
	}
}

// TestIdleProbeTakesNoSeat: a probe due by time is sent only while the engine has room for it and one more
// request with nothing waiting, or, its seats unknown, runs nothing.
func TestIdleProbeTakesNoSeat(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	bs := reg.Sync([]*BackendConfig{
		{Name: "four", URL: "http://127.0.0.1:1", Engine: EngineVLLM, Models: []string{"m"}, MaxNumSeqs: 4},
		{Name: "unknown", URL: "http://127.0.0.1:1", Engine: EngineVLLM, Models: []string{"m"}},
	})
	m := NewMonitor(reg, MonitorOptions{Clock: clk})
	clk.Advance(time.Minute)
	scrape := func(b *Backend, running, waiting float64) {
		b.engine.Store(&EngineStats{Running: running, Waiting: waiting, Has: HasRunning | HasWaiting,
			At: clk.Now(), sent: clk.Now(), begun: b.requests.Load(), ended: b.ended.Load()})
	}
	for _, tc := range []struct {
		b                *Backend
		running, waiting float64
		local            int // requests this gateway sent since the scrape
		due              bool
	}{
		{bs[0], 0, 0, 0, true},
		{bs[0], 2, 0, 0, true},
		{bs[0], 3, 0, 0, false}, // the probe would take the last seat
		{bs[0], 2, 0, 1, false}, // as the scrape brought up to now shows
		{bs[0], 4, 0, 0, false},
		{bs[0], 1, 1, 0, false}, // something waits
		{bs[1], 0, 0, 0, true},
		{bs[1], 1, 0, 0, false}, // seats unknown: idle only
		{bs[1], 0, 0, 1, false},
	} {
		scrape(tc.b, tc.running, tc.waiting)
		var as []Attempt
		for range tc.local {
			as = append(as, tc.b.Begin(10))
		}
		s := &scraper{m: m, b: tc.b}
		if got := s.idleProbeDue(); got != tc.due {
			t.Errorf("%s running %v waiting %v, %d sent since: due %v, want %v", tc.b.Name(), tc.running, tc.waiting,
				tc.local, got, tc.due)
		}
		for i := range as {
			as[i].End(false)
		}
	}
}
