package routing

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/internal/redistest"
)

// replica is one gateway replica's routing state for these tests: a registry of the same backends as the
// others, and its Peers.
type replica struct {
	reg   *Registry
	peers *Peers
	errs  atomic.Int64
}

func newReplica(t *testing.T, c redis.UniversalClient, prefix string, names ...string) *replica {
	t.Helper()
	return newReplicaEvery(t, c, prefix, 20*time.Millisecond, names...)
}

// newReplicaEvery is newReplica syncing every interval.
func newReplicaEvery(t *testing.T, c redis.UniversalClient, prefix string, interval time.Duration, names ...string) *replica {
	t.Helper()
	r := &replica{reg: NewRegistry()}
	cfgs := make([]*BackendConfig, len(names))
	for i, n := range names {
		cfgs[i] = &BackendConfig{Name: n, URL: "http://127.0.0.1:1/" + n, Engine: EngineOpenAI}
	}
	r.reg.Sync(cfgs)
	r.peers = NewPeers(c, r.reg, PeersOptions{Prefix: prefix, Interval: interval,
		OnError: func(string, error) { r.errs.Add(1) }})
	r.peers.Start()
	t.Cleanup(r.peers.Stop)
	return r
}

func (r *replica) backend(name string) *Backend {
	for _, b := range r.reg.Backends() {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPeerLoadIsSharedAndExpires(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	a := newReplica(t, redistest.Client(t, addr), prefix, "x", "y")
	b := newReplica(t, redistest.Client(t, addr), prefix, "x", "y")

	var atts []Attempt
	for range 3 {
		atts = append(atts, a.backend("x").Begin(100))
	}
	waitUntil(t, 2*time.Second, "replica b sees a's 3 requests on x", func() bool {
		return b.backend("x").Inflight() == 3 && b.backend("y").Inflight() == 0
	})
	if got := b.backend("x").LocalInflight(); got != 0 {
		t.Fatalf("b's own count = %d: peer load must not leak into it", got)
	}
	if st := b.backend("x").Status(); st.PeerInflight != 3 || st.Inflight != 0 {
		t.Fatalf("status inflight %d peer %d", st.Inflight, st.PeerInflight)
	}
	if l := b.backend("x").loadAt(time.Now()); l.queuedTok > 300 {
		t.Fatalf("b's cost model counts %v of a's 300 queued prefill tokens on x", l.queuedTok)
	}
	if a.backend("x").Inflight() != 3 {
		t.Fatalf("a counts its own requests once: %d", a.backend("x").Inflight())
	}
	for i := range atts {
		atts[i].End(false)
	}
	waitUntil(t, 2*time.Second, "a's requests ended", func() bool { return b.backend("x").Inflight() == 0 })
	if q := b.backend("x").loadAt(time.Now()).queuedTok; q != 0 {
		t.Fatalf("b counts %v prefill tokens of a's ended requests", q)
	}

	// A replica that dies stops counting within three intervals.
	atts = append(atts[:0], a.backend("y").Begin(10))
	waitUntil(t, 2*time.Second, "b sees a's request on y", func() bool { return b.backend("y").Inflight() == 1 })
	a.peers.Stop()
	stopped := time.Now()
	waitUntil(t, 2*time.Second, "a's stale load expires on b", func() bool { return b.backend("y").Inflight() == 0 })
	if d := time.Since(stopped); d > 10*b.peers.o.Interval+500*time.Millisecond {
		t.Errorf("stale load counted for %v", d)
	}
	atts[0].End(false)
	if a.errs.Load()+b.errs.Load() != 0 {
		t.Errorf("%d Redis errors", a.errs.Load()+b.errs.Load())
	}
}

// TestPeerLoadExpiryOnTheClock: a backend counts a peer load until its Until, not a nanosecond longer.
func TestPeerLoadExpiryOnTheClock(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "x", URL: "http://h:1", Engine: EngineOpenAI}})[0]
	b.peer.Store(&PeerLoad{Inflight: 5, PrefillTokens: 700, Decoding: 2, Until: clk.Now().Add(600 * time.Millisecond)})
	clk.Advance(599 * time.Millisecond)
	if b.Inflight() != 5 || b.loadAt(clk.Now()).running != 2 {
		t.Fatalf("fresh peer load not counted: inflight %d", b.Inflight())
	}
	clk.Advance(time.Millisecond)
	if b.Inflight() != 0 || b.loadAt(clk.Now()).running != 0 {
		t.Fatalf("stale peer load still counted: inflight %d", b.Inflight())
	}
}

func TestPrefixHintsReachTheOtherReplica(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	a := newReplica(t, redistest.Client(t, addr), prefix, "x", "y", "z")
	b := newReplica(t, redistest.Client(t, addr), prefix, "x", "y", "z")

	prompt := []byte(strings.Repeat("You are a helpful assistant. ", 40)) // 1,160 bytes: 18 blocks
	r := &Request{Model: "m", Prompt: prompt}
	targets := func(rep *replica) []Target {
		var ts []Target
		for _, be := range rep.reg.Backends() {
			ts = append(ts, Target{Backend: be})
		}
		return ts
	}
	att := a.backend("y").Dispatch(&Request{Model: "m", Prompt: prompt, hb: r.hbFor(t), hashed: true})
	att.FirstToken()
	att.End(false)
	held := func() []int {
		rq := &Request{Model: "m", Prompt: prompt}
		defer rq.Reset()
		sc := acquireScratch(3)
		defer releaseScratch(sc)
		prefixMatch(rq, targets(b), sc, cache.DefaultMaxBlocks)
		return slices.Clone(sc.counts)
	}
	waitUntil(t, 2*time.Second, "b's index learns that y holds the prompt", func() bool {
		c := held()
		return c[0] == 0 && c[1] == 18 && c[2] == 0
	})
	if pub, _ := a.peers.Counts(); pub != 1 {
		t.Errorf("a published %d hints, want 1", pub)
	}
	// The same prefix confirmed again within a minute is not published again.
	att = a.backend("y").Dispatch(&Request{Model: "m", Prompt: prompt, hb: r.hbFor(t), hashed: true})
	att.FirstToken()
	att.End(false)
	time.Sleep(100 * time.Millisecond) // several flush periods
	if pub, _ := a.peers.Counts(); pub != 1 {
		t.Errorf("a published %d hints after a repeat, want 1", pub)
	}
	if _, rec := a.peers.Counts(); rec != 0 {
		t.Errorf("a applied %d hints: its own must be skipped", rec)
	}
}

// hbFor hashes r's prompt the way Pick does, for a Dispatch without a Pick.
func (r *Request) hbFor(t *testing.T) *cache.HashBuf {
	t.Helper()
	hb := cache.AcquireHashBuf()
	hb.Hashes = cache.AppendHashes(hb.Hashes[:0], cache.Seed(r.Model), r.Prompt, cache.DefaultMaxBlocks)
	return hb
}

func TestHintEncoding(t *testing.T) {
	hs := []pendingHint{{name: "gpu-1", off: 0, len: 2}, {name: "b", off: 2, len: 1}}
	hashes := []uint64{1, 1 << 63, 42}
	var got []string
	var gotHashes [][]uint64
	err := decodeHints(encodeHints(nil, hs, hashes), func(name string, h []uint64) {
		got = append(got, name)
		gotHashes = append(gotHashes, slices.Clone(h))
	})
	if err != nil || !slices.Equal(got, []string{"gpu-1", "b"}) || !slices.Equal(gotHashes[0], []uint64{1, 1 << 63}) ||
		!slices.Equal(gotHashes[1], []uint64{42}) {
		t.Fatalf("round trip: %v %v %v", err, got, gotHashes)
	}
	for _, bad := range [][]byte{{5, 'a'}, {1, 'a', 2, 0, 1, 2, 3}} {
		if err := decodeHints(bad, func(string, []uint64) {}); err == nil {
			t.Errorf("%v decoded", bad)
		}
	}
	sums := map[string]*PeerLoad{}
	parsePeerLoad("x=1,2,3;y=4,5,6;bad;z=1,2;w=-1,0,0", 0, nil, sums)
	parsePeerLoad("x=10,20,30", 0, nil, sums)
	if len(sums) != 2 || *sums["x"] != (PeerLoad{Inflight: 11, PrefillTokens: 22, Decoding: 33}) || sums["y"].Inflight != 4 {
		t.Fatalf("sums %v", sums)
	}
}

// TestPeersSurviveRedisRestart: Redis killed under way costs errors, not state; restarted on the same port,
// sharing resumes by itself (load and prefix hints) with the same clients.
func TestPeersSurviveRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	a := newReplica(t, redistest.Client(t, srv.Addr()), prefix, "x", "y")
	b := newReplica(t, redistest.Client(t, srv.Addr()), prefix, "x", "y")
	att := a.backend("x").Begin(10)
	defer att.End(false)
	waitUntil(t, 2*time.Second, "sharing works", func() bool { return b.backend("x").Inflight() == 1 })

	srv.Kill(t)
	waitUntil(t, 2*time.Second, "peer load expires while Redis is down", func() bool { return b.backend("x").Inflight() == 0 })
	waitUntil(t, 2*time.Second, "failures are reported", func() bool { return b.errs.Load() > 0 })
	if b.backend("x").LocalInflight() != 0 || a.backend("x").Inflight() != 1 {
		t.Fatal("local accounting changed")
	}

	srv.Restart(t)
	waitUntil(t, 5*time.Second, "load sharing resumes", func() bool { return b.backend("x").Inflight() == 1 })
	prompt := []byte(strings.Repeat("0123456789abcdef", 8)) // 2 blocks
	r := &Request{Model: "m", Prompt: prompt}
	at2 := a.backend("y").Dispatch(&Request{Model: "m", Prompt: prompt, hb: r.hbFor(t), hashed: true})
	at2.FirstToken()
	at2.End(false)
	waitUntil(t, 5*time.Second, "prefix hints resume", func() bool {
		_, rec := b.peers.Counts()
		return rec >= 1
	})
}
