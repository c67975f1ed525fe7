package routing

import (
	"context"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
)

// quietReplica is a replica whose load reports are written and read only when the test syncs them.
func quietReplica(t *testing.T, addr, prefix string, names ...string) *replica {
	t.Helper()
	r := &replica{reg: NewRegistry()}
	cfgs := make([]*BackendConfig, len(names))
	for i, n := range names {
		cfgs[i] = &BackendConfig{Name: n, URL: "http://127.0.0.1:1/" + n, Engine: EngineOpenAI}
	}
	r.reg.Sync(cfgs)
	r.peers = NewPeers(redistest.Client(t, addr), r.reg, PeersOptions{Prefix: prefix, Interval: time.Hour,
		HintFlush: 20 * time.Millisecond, OnError: func(string, error) { r.errs.Add(1) }})
	r.peers.Start()
	t.Cleanup(r.peers.Stop)
	waitUntil(t, 5*time.Second, "the first load sync", r.peers.offsetKnown.Load)
	return r
}

// TestPeerEndsAreTakenOffAtOnce: a load report is up to an interval old when another replica reads it. A request
// it counted that ends is announced on the hint stream and taken off the other replica's figure at once, not at
// the next report; a request no report counted is not announced; a report the other replica installed before
// the request was counted keeps its figure; and a report written after the end replaces the correction.
func TestPeerEndsAreTakenOffAtOnce(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	a := quietReplica(t, addr, prefix, "x", "y")
	b := quietReplica(t, addr, prefix, "x", "y")
	ctx := context.Background()
	sync := func(rs ...*replica) {
		for _, r := range rs {
			r.peers.syncLoad(ctx)
		}
	}
	x, y := a.backend("x"), a.backend("y")
	atts := []Attempt{x.Begin(100), x.Begin(100), x.Begin(100), y.Begin(100)}
	sync(a, b)
	if got := b.backend("x").Inflight(); got != 3 {
		t.Fatalf("b counts %d of a's 3 requests on x", got)
	}

	short := x.Begin(10) // no report counts it
	short.End(false)
	atts[0].End(false)
	waitUntil(t, 2*time.Second, "b takes a's ended request off x", func() bool { return b.backend("x").Inflight() == 2 })
	time.Sleep(100 * time.Millisecond)
	if got := b.backend("x").Inflight(); got != 2 {
		t.Fatalf("b counts %d on x after a's request no report counted ended, want 2", got)
	}
	if st := b.backend("x").Status(); st.PeerInflight != 2 {
		t.Fatalf("status peer inflight %d, want 2", st.PeerInflight)
	}

	// A request a counted only in a report b has not read: its end leaves b's figure alone.
	late := y.Begin(100)
	sync(b, a) // b reads a's report from before it, then a writes one with it
	late.End(false)
	time.Sleep(150 * time.Millisecond)
	if got := b.backend("y").Inflight(); got != 1 {
		t.Fatalf("b counts %d on y, want 1: it never counted the request that ended", got)
	}

	// A report written after the end replaces the correction.
	sync(a, b)
	if got := b.backend("x").Inflight(); got != 2 {
		t.Fatalf("b counts %d on x after a's next report, want 2", got)
	}
	b.peers.endMu.Lock()
	kept := len(b.peers.notices)
	b.peers.endMu.Unlock()
	if kept != 0 {
		t.Fatalf("%d replicas' notices kept after their reports caught up", kept)
	}
	endAll(atts[1:])
	waitUntil(t, 2*time.Second, "b takes every ended request off", func() bool {
		return b.backend("x").Inflight() == 0 && b.backend("y").Inflight() == 0
	})
	if a.errs.Load()+b.errs.Load() != 0 {
		t.Errorf("%d Redis errors", a.errs.Load()+b.errs.Load())
	}
}

// TestPeerEndAgainstTheScrape: another replica's request that ended is taken off the engine's scrape only when
// the scrape counted it: dispatched a scrape's round trip before the scrape was sent, ended after its answer.
func TestPeerEndAgainstTheScrape(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "e", URL: "http://127.0.0.1:1", Engine: EngineVLLM}})[0]
	sent := clk.Now()
	clk.Advance(10 * time.Millisecond)
	b.engine.Store(&EngineStats{Running: 4, Has: HasRunning | HasWaiting, At: clk.Now(), sent: sent})
	clk.Advance(20 * time.Millisecond)
	for _, tc := range []struct {
		name string
		dur  time.Duration
		want float64
	}{
		{"dispatched after the scrape was sent", 25 * time.Millisecond, 4},
		{"dispatched within a round trip before it", 35 * time.Millisecond, 4},
		{"dispatched well before it", 45 * time.Millisecond, 3},
	} {
		b.peerEnd(clk.Now(), tc.dur)
		if got, _ := b.engineOccupancy(b.Engine()); got != tc.want {
			t.Fatalf("%s: occupancy %v, want %v", tc.name, got, tc.want)
		}
	}
}
