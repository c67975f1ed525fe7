package routing

import (
	"encoding/binary"
	"math"
	"testing"
	"time"
)

// TestPeerPrefillDrains: this replica's prefill counts in full until its first token; a replica's report of its
// own is drained by its age and then by the time since it was read.
func TestPeerPrefillDrains(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "x", URL: "http://h:1", Engine: EngineOpenAI}})[0]
	rate := b.lat.prefillPerToken() // seconds per token, the prior until it is trained
	near := func(got, want float64) bool { return math.Abs(got-want) <= 2 }

	a1 := b.Begin(1000)
	clk.Advance(duration(5000 * rate))
	if got := b.loadAt(clk.Now()).queuedTok; got != 1000 {
		t.Fatalf("local prefill without a first token = %v, want 1000", got)
	}
	a1.FirstToken()
	if got := b.loadAt(clk.Now()).queuedTok; got != 0 {
		t.Fatalf("local prefill after its first token = %v", got)
	}
	a1.End(false)
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

// TestHintsAnnounceAPeersPrefill: a prefix hint carries its dispatch's uncached tokens, queued on the reader at the
// dispatch's time (the stream entry's Redis time less the measured clock offset) and drained from there; an entry
// older than a report is ignored, and a report of the same requests is not added to it.
func TestHintsAnnounceAPeersPrefill(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "x", URL: "http://h:1", Engine: EngineOpenAI}})[0]
	p := NewPeers(nil, reg, PeersOptions{Clock: clk, Interval: 200 * time.Millisecond})
	rate := b.lat.prefillPerToken()
	hint := func(tok int64) (payload, toks []byte) {
		payload = encodeHints(nil, []pendingHint{{name: "x", off: 0, len: 2, tok: tok}}, []uint64{1, 2})
		return payload, binary.AppendUvarint(nil, uint64(tok))
	}
	const offset = 5000 // Redis TIME runs 5 s ahead of this replica's clock
	redisNow := func() int64 { return clk.Now().UnixMilli() + offset }

	payload, toks := hint(1200)
	p.apply(payload, toks, redisNow()-100)
	if got := b.peerDispatchedLeft(clk.Now()); got != 0 {
		t.Fatalf("queued %v before the clock offset is known", got)
	}
	p.offsetMs.Store(offset)
	p.offsetKnown.Store(true)
	p.apply(payload, toks, redisNow()-1000) // older than a report (three intervals): the reports cover it
	if got := b.peerDispatchedLeft(clk.Now()); got != 0 {
		t.Fatalf("a stale hint queued %v tokens", got)
	}
	p.apply(payload, toks, redisNow()-100) // dispatched 100 ms ago
	want := 1200 - 0.1/rate
	if got := b.loadAt(clk.Now()).queuedTok; math.Abs(got-want) > 2 {
		t.Fatalf("announced prefill left = %v, want %v", got, want)
	}
	// The other replica's report of the same request: the larger of the two counts, not their sum.
	b.peer.Store(&PeerLoad{Inflight: 1, PrefillTokens: 1000, At: clk.Now(), Until: clk.Now().Add(time.Second)})
	if got := b.loadAt(clk.Now()).queuedTok; math.Abs(got-1000) > 2 {
		t.Fatalf("report and hint together = %v, want the report's 1000", got)
	}
	// A hint from a replica that predates the tokens (no "q" field) confirms the prefix and queues nothing.
	b.peer.Store(nil)
	clk.Advance(time.Second)
	p.apply(payload, nil, redisNow())
	if got := b.peerDispatchedLeft(clk.Now()); got != 0 {
		t.Fatalf("a hint without tokens queued %v", got)
	}
	if n := b.prefixOwner().Len(); n == 0 {
		t.Fatal("the hints were not confirmed in the prefix index")
	}
}
