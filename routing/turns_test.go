package routing

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
)

func TestPeerAdjust(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	report := func(ms int) *reportTimes {
		return &reportTimes{at: map[string]reportSpan{"a": {from: at(ms - 1), to: at(ms)}}}
	}
	type req struct {
		replica       string
		key           uint64
		dispatch, end int // ms; end -1: running
	}
	for _, tc := range []struct {
		name    string
		reqs    []req
		v       turnViews
		prev    int // key taken as ended, at prevEnd
		prevEnd int
		want    peerAdjust
	}{
		{name: "counted by both views, still running",
			reqs: []req{{"a", 1, 0, -1}}, v: turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)}},
		{name: "counted by both views, ended since",
			reqs: []req{{"a", 1, 0, 600}}, v: turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)},
			want: peerAdjust{report: -1, engine: -1}},
		{name: "dispatched after both views, running",
			reqs: []req{{"a", 1, 600, -1}}, v: turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)},
			want: peerAdjust{report: 1, engine: 1}},
		{name: "dispatched and ended after both views",
			reqs: []req{{"a", 1, 600, 700}}, v: turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)}},
		{name: "ended before both views",
			reqs: []req{{"a", 1, 0, 300}}, v: turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)}},
		{name: "another replica's report is not this one's",
			reqs: []req{{"c", 1, 0, 600}}, v: turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)},
			want: peerAdjust{engine: -1}},
		{name: "dispatched within the margin of the report and ended since: kept; one sent a round trip before the scrape: added",
			reqs: []req{{"a", 1, 498, 800}, {"a", 2, 395, -1}},
			v:    turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410), margin: 2 * time.Millisecond, rtt: 5 * time.Millisecond},
			want: peerAdjust{engine: 1}},
		{name: "ended within the margin of the report (kept there), or a round trip of the scrape (kept there)",
			reqs: []req{{"a", 1, 0, 501}, {"a", 2, 0, 412}},
			v:    turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410), margin: 2 * time.Millisecond, rtt: 5 * time.Millisecond},
			want: peerAdjust{engine: -1}},
		{name: "the previous turn, ended by the follow-up's account",
			reqs: []req{{"a", 7, 0, -1}, {"a", 8, 0, -1}}, prev: 7, prevEnd: 900,
			v:    turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)},
			want: peerAdjust{report: -1, engine: -1}},
		{name: "the previous turn, ended after the views were taken only by the follow-up's account",
			reqs: []req{{"a", 7, 0, -1}}, prev: 7, prevEnd: 450,
			v:    turnViews{reports: report(500), scrapeSent: at(400), scrapeAt: at(410)},
			want: peerAdjust{engine: -1}},
		{name: "no views", reqs: []req{{"a", 1, 0, 600}, {"a", 2, 700, -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p peerReqs
			for _, q := range tc.reqs {
				p.add(q.key, q.replica, at(q.dispatch), time.Time{})
				if q.end >= 0 {
					p.end(q.key, q.replica, at(q.end))
				}
			}
			var prevEnd time.Time
			if tc.prev != 0 {
				prevEnd = at(tc.prevEnd)
			}
			if got := p.adjust(tc.v, uint64(tc.prev), prevEnd); got != tc.want {
				t.Fatalf("adjust %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPeerReqsAreBounded(t *testing.T) {
	var p peerReqs
	t0 := time.Unix(2000, 0)
	for i := range 3 * maxPeerReqs {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		p.add(uint64(i), "a", at, at.Add(-time.Second))
		if i%2 == 0 {
			p.end(uint64(i), "a", at)
		}
	}
	if n := len(p.reqs); n > maxPeerReqs {
		t.Fatalf("%d requests kept, want at most %d", n, maxPeerReqs)
	}
	// What ended before keepFrom went; what runs stays until the bound.
	for _, q := range p.reqs {
		if !q.ended.IsZero() && q.ended.Before(t0.Add(time.Duration(3*maxPeerReqs-1)*time.Millisecond-time.Second)) {
			t.Fatalf("a request that ended at %v is still kept", q.ended.Sub(t0))
		}
	}
}

func TestTurnEncoding(t *testing.T) {
	flush := time.Unix(2000, 0)
	evs := []turnEvent{
		{name: "x", key: 42, kind: turnDispatched, at: flush.Add(-1500 * time.Microsecond)},
		{name: "backend-y", key: 1 << 63, kind: turnEnded, at: flush},
		{name: "z", key: 7, kind: turnEnded, at: flush.Add(time.Second)}, // after the flush: no negative age
	}
	b := encodeTurns(nil, evs, flush)
	type rec struct {
		kind byte
		name string
		key  uint64
		age  time.Duration
	}
	var got []rec
	if err := decodeTurns(b, func(kind byte, name []byte, key uint64, age time.Duration) {
		got = append(got, rec{kind, string(name), key, age})
	}); err != nil {
		t.Fatal(err)
	}
	want := []rec{{'d', "x", 42, 1500 * time.Microsecond}, {'e', "backend-y", 1 << 63, 0}, {'e', "z", 7, 0}}
	if len(got) != len(want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record %d: %v, want %v", i, got[i], want[i])
		}
	}
	// A kind this version does not know is skipped; a truncated record stops the decoding.
	other := append([]byte{'z', 1, 'q'}, make([]byte, 9)...)
	n := 0
	if err := decodeTurns(append(other, b...), func(byte, []byte, uint64, time.Duration) { n++ }); err != nil || n != 3 {
		t.Fatalf("with an unknown kind first: %d records, %v; want 3, nil", n, err)
	}
	whole := map[int]bool{}
	for i := range evs {
		whole[len(encodeTurns(nil, evs[:i], flush))] = true
	}
	for cut := 1; cut < len(b); cut++ {
		if err := decodeTurns(b[:cut], func(byte, []byte, uint64, time.Duration) {}); err == nil && !whole[cut] {
			t.Fatalf("truncated at %d of %d bytes: no error", cut, len(b))
		}
	}
}

func TestTurnLogIsBounded(t *testing.T) {
	var l turnLog
	l.init()
	now := time.Unix(3000, 0)
	b := &Backend{}
	for i := range turnLogSize + 100 {
		l.add(b, uint64(i), turnDispatched, now, now)
	}
	if len(l.m) != turnLogSize || len(l.ring) != turnLogSize {
		t.Fatalf("%d records, ring of %d; want %d", len(l.m), len(l.ring), turnLogSize)
	}
	if _, _, ok := l.lookup(50); ok {
		t.Fatal("the oldest record is still there")
	}
	if tr, _, ok := l.lookup(turnLogSize + 50); !ok || tr.seen != 1 {
		t.Fatalf("a recent record: %+v, %v", tr, ok)
	}
	// The latency is the largest seen, halved every latHalfLife.
	l.observeLatency(0.008, now)
	l.observeLatency(0.001, now.Add(latHalfLife))
	if _, lat, _ := l.lookup(turnLogSize + 50); lat != 4*time.Millisecond {
		t.Fatalf("latency %v, want 4ms", lat)
	}
}

// TestPrevTurnThroughAnotherReplica runs two replicas' Peers on a real Redis: replica a serves a conversation's
// turn on x beside three other requests; b, which receives the next turn, takes that turn off a's load report
// while the report still counts it, and off b's own scrape of x taken while it ran, so x, with a seat free
// again, does not look full.
func TestPrevTurnThroughAnotherReplica(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	// a reports every 300 ms: the report b holds when the turn ends was read well before the end, and the next is
	// read well after it, so that no report is of uncertain timing (those keep the request: erring towards
	// counting it).
	a := newReplicaEvery(t, redistest.Client(t, addr), prefix, 300*time.Millisecond, "x", "y")
	b := newReplica(t, redistest.Client(t, addr), prefix, "x", "y")
	bx := b.backend("x")
	cfg := *bx.Config()
	cfg.MaxNumSeqs = 4
	bx.cfg.Store(&cfg)
	bx.hold.add(2) // a request holds a seat for 2 s
	waitUntil(t, 2*time.Second, "both replicas know Redis's clock", func() bool {
		return a.peers.offsetKnown.Load() && b.peers.offsetKnown.Load() // records and stamps need it
	})

	prev := []byte("system:" + strings.Repeat("You are a helpful assistant. ", 10) + "\nuser:What is a KV cache?\n")
	var others []Attempt
	for i := range 3 {
		others = append(others, a.backend("x").Dispatch(&Request{Model: "m", Prompt: []byte(strings.Repeat("z", 100+i))}))
	}
	turn := a.backend("x").Dispatch(&Request{Model: "m", Prompt: prev})
	key := turnKey("m", prev)
	waitUntil(t, 2*time.Second, "b has a's records and its report of four requests on x", func() bool {
		tr, _, ok := b.peers.turns.lookup(key)
		p := bx.peerLoad(time.Now())
		return ok && tr.b == bx && bx.peerReqs.running() == 4 && p != nil && p.Inflight == 4
	})
	// End the turn 60 ms after b installed a fresh report of a's.
	installed := bx.peer.Load()
	waitUntil(t, 2*time.Second, "b installs a's next report", func() bool {
		p := bx.peer.Load()
		return p != installed && p.reports != nil && !p.reports.at[a.peers.ID()].to.IsZero()
	})
	time.Sleep(60 * time.Millisecond)
	// b's own scrape of x, taken while the turn ran: four requests running, every seat taken.
	now := time.Now()
	bx.engine.Store(&EngineStats{Running: 4, Has: HasRunning | HasWaiting, sent: now.Add(-20 * time.Millisecond),
		At: now.Add(-15 * time.Millisecond)})
	if l := bx.loadAt(time.Now()); l.seatWait == 0 || l.inflight != 4 || l.room {
		t.Fatalf("before the end: seat wait %.3f s, %d in flight, room %v; want a wait, 4, none", l.seatWait,
			l.inflight, l.room)
	}

	turn.End(false) // the answer ended; the client sends its next turn at once, through b
	next := &Request{Model: "m", Prompt: append(append([]byte{}, prev...), "assistant:A cache of keys and values.\nuser:Why?\n"...),
		PrevTurn: len(prev)}
	deadline := time.Now().Add(150 * time.Millisecond) // before a's next report
	checks := 0
	for ; time.Now().Before(deadline); time.Sleep(3 * time.Millisecond) {
		now := time.Now()
		if bx.peerLoad(now) == nil {
			continue // a's report expired before b's next sync (a loaded machine): nothing to judge
		}
		checks++
		less := b.peers.prevTurn(next, now)
		if less.b != bx || less.end.After(now) {
			t.Fatalf("check %d: previous turn %+v; want x's, ended by now", checks, less)
		}
		l := bx.loadLess(now, less.on(bx))
		if l.inflight != 3 || l.seatWait != 0 || l.full || !l.room {
			t.Fatalf("check %d: %d in flight, seat wait %.3f s, full %v, room %v; want 3, 0, false, true", checks,
				l.inflight, l.seatWait, l.full, l.room)
		}
	}
	if checks < 10 {
		t.Fatalf("a's report was there for %d checks only", checks)
	}
	waitUntil(t, 2*time.Second, "the end record reaches b", func() bool {
		return bx.peerReqs.running() == 3
	})
	// Once its end record came, every pick sees x brought up to now, not only the conversation's next turn.
	if l := bx.loadAt(time.Now()); l.seatWait != 0 || l.full {
		t.Fatalf("after the end record: seat wait %.3f s, full %v; want 0, false", l.seatWait, l.full)
	}
	// A request a's report and b's scrape did not see yet counts at once.
	late := a.backend("x").Dispatch(&Request{Model: "m", Prompt: []byte("a new conversation")})
	waitUntil(t, 2*time.Second, "b has a's record of the new request", func() bool {
		_, _, ok := b.peers.turns.lookup(turnKey("m", []byte("a new conversation")))
		return ok
	})
	if l := bx.loadAt(time.Now()); l.seatWait == 0 {
		t.Fatalf("a new request on x: seat wait %.3f s, want one (x full again)", l.seatWait)
	}
	late.End(false)

	// A turn whose prompt was also dispatched elsewhere is not trusted; a request without a previous turn, or
	// routed by a replica without peers, corrects nothing.
	dup := b.backend("y").Dispatch(&Request{Model: "m", Prompt: prev})
	if less := b.peers.prevTurn(next, time.Now()); less.b != nil {
		t.Fatalf("an ambiguous previous turn: %+v", less)
	}
	dup.End(false)
	if less := b.peers.prevTurn(&Request{Model: "m", Prompt: next.Prompt}, time.Now()); less.b != nil {
		t.Fatalf("no previous turn: %+v", less)
	}
	var none *Peers
	if less := none.prevTurn(next, time.Now()); less.b != nil {
		t.Fatalf("no peers: %+v", less)
	}
	endAll(others)
}

// TestTurnStaysAcrossReplicasWhileItsEngineHasRoom runs two replicas on a real Redis: a serves a conversation's
// turn on y, and b, which receives the next turn, keeps it on y although b's models price y far above x, as long
// as y's engine has a seat free; once y's engine is full, b's costs decide and the turn goes to x.
func TestTurnStaysAcrossReplicasWhileItsEngineHasRoom(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	a := newReplica(t, redistest.Client(t, addr), prefix, "x", "y")
	b := newReplica(t, redistest.Client(t, addr), prefix, "x", "y")
	var targets []Target
	for _, be := range b.reg.Backends() {
		cfg := *be.Config()
		cfg.MaxNumSeqs = 4
		be.cfg.Store(&cfg)
		targets = append(targets, Target{Backend: be, Model: "m"})
	}
	bx, by := b.backend("x"), b.backend("y")
	// b's models: y slow (2 s and 1 ms a token), x fast (20 ms and 0.01 ms a token), both as sure of it as
	// thousands of observations make them.
	for i := range 2000 {
		u := float64(100 + i%1500)
		by.lat.observeTTFT(u, 0, 0, 2+u*0.001)
		bx.lat.observeTTFT(u, 0, 0, 0.020+u*0.00001)
	}
	waitUntil(t, 2*time.Second, "both replicas know Redis's clock", func() bool {
		return a.peers.offsetKnown.Load() && b.peers.offsetKnown.Load()
	})

	prev := []byte("system:" + strings.Repeat("You are a helpful assistant. ", 40) + "\nuser:What is a KV cache?\n")
	r := &Request{Model: "m", Prompt: prev}
	turn := a.backend("y").Dispatch(&Request{Model: "m", Prompt: prev, hb: r.hbFor(t), hashed: true})
	turn.FirstToken()
	turn.End(false)
	waitUntil(t, 2*time.Second, "b has a's record of the turn on y and knows y holds it", func() bool {
		tr, _, ok := b.peers.turns.lookup(turnKey("m", prev))
		return ok && tr.b == by && by.peerReqs.running() == 0
	})
	s, err := NewAdaptive(StrategyEnv{Model: "m"}, DefaultAdaptiveParams())
	if err != nil {
		t.Fatal(err)
	}
	next := append(append([]byte{}, prev...), "assistant:A cache of keys and values.\nuser:Why?\n"...)
	pick := func(prevTurn int) string {
		t.Helper()
		rq := &Request{Model: "m", Prompt: next, PrevTurn: prevTurn}
		defer rq.Reset()
		got, err := s.Pick(rq, targets)
		if err != nil {
			t.Fatal(err)
		}
		return got.Backend.Name()
	}
	waitUntil(t, 2*time.Second, "b's index learns that y holds the previous turn", func() bool {
		return pick(len(prev)) == "y"
	})
	for range 20 {
		if got := pick(len(prev)); got != "y" {
			t.Fatalf("the next turn went to %s with y's engine idle; want y", got)
		}
	}
	// Without the previous turn's record the costs decide: the rule, not the prefix, kept it on y.
	if got := pick(0); got != "x" {
		t.Fatalf("a request without a previous turn went to %s; want x, which b's models price far lower", got)
	}
	// y's engine full, a request waiting: the costs decide.
	now := time.Now()
	by.engine.Store(&EngineStats{Running: 4, Waiting: 1, Has: HasRunning | HasWaiting,
		sent: now.Add(-20 * time.Millisecond), At: now.Add(-15 * time.Millisecond), begun: by.requests.Load(),
		ended: by.ended.Load()})
	if got := pick(len(prev)); got != "x" {
		t.Fatalf("the next turn went to %s with y's engine full; want x", got)
	}
}
