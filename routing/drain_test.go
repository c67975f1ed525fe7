package routing

import (
	"math"
	"testing"
	"time"
)

// TestQueuedPrefillDrains: the prefill queued on a backend is what is left at its learned rate, never more than
// the tokens in flight, and a replica's report of it is drained by its age.
func TestQueuedPrefillDrains(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "x", URL: "http://h:1", Engine: EngineOpenAI}})[0]
	rate := b.lat.prefillPerToken() // seconds per token, the prior until it is trained
	near := func(got, want float64) bool { return math.Abs(got-want) <= 2 }

	a1 := b.Begin(1000)
	a2 := b.Begin(1000)
	if got := b.queuedAt(clk.Now()); !near(got, 2000) {
		t.Fatalf("queued at dispatch = %v, want 2000", got)
	}
	clk.Advance(duration(500 * rate)) // 500 tokens' worth of prefill done
	if got := b.queuedAt(clk.Now()); !near(got, 1500) {
		t.Fatalf("queued after 500 tokens' time = %v, want 1500", got)
	}
	a1.FirstToken() // the engine was faster than the rate: 1,000 tokens left at most
	if got := b.queuedAt(clk.Now()); !near(got, 1000) {
		t.Fatalf("queued after the first prefill ended = %v, want 1000", got)
	}
	clk.Advance(duration(5000 * rate)) // long past the drain time: nothing left, though a2 waits on
	if got := b.queuedAt(clk.Now()); got != 0 {
		t.Fatalf("queued long after the drain time = %v, want 0", got)
	}
	a2.End(false)
	a1.End(false)

	// A new prefill on an idle backend starts the queue now, not after the old drain time.
	a3 := b.Begin(400)
	if got := b.queuedAt(clk.Now()); !near(got, 400) {
		t.Fatalf("queued on an idle backend = %v, want 400", got)
	}
	a3.End(false)
	if got := b.queuedAt(clk.Now()); got != 0 {
		t.Fatalf("queued with nothing in flight = %v", got)
	}

	rate = b.lat.prefillPerToken() // a1's first token trained the model
	// Another replica's report, 100 tokens' time old when read, then read 200 tokens' time ago.
	sums := map[string]*PeerLoad{}
	parsePeerLoad("x=2,900,0", duration(100*rate), map[string]float64{"x": rate}, sums)
	if got := sums["x"].PrefillTokens; got < 799 || got > 801 {
		t.Fatalf("report drained by its age to %d, want 800", got)
	}
	read := clk.Now()
	b.peer.Store(&PeerLoad{Inflight: 2, PrefillTokens: sums["x"].PrefillTokens, At: read, Until: read.Add(time.Second)})
	clk.Advance(duration(200 * rate))
	if got := b.loadAt(clk.Now()).queuedTok; !near(got, 600) {
		t.Fatalf("peer prefill left = %v, want 600", got)
	}
	clk.Advance(duration(700 * rate))
	if got := b.loadAt(clk.Now()).queuedTok; got != 0 {
		t.Fatalf("peer prefill left after it drained = %v", got)
	}
}
